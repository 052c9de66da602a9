"""An eval-protocol eval of BrowserGym MiniWoB++ web tasks, the environment behind ``train_browsergym_trl.py``.

The MiniWoB server runs locally (``python -m ep_trl.envs.browsergym --port 8020``, after
``scripts/install_browser.sh``); this eval finds it through ``BROWSERGYM_ENV_URL`` (read each time an
environment is created). Each turn the model sees the task goal, the page's accessibility tree, its last
action's error and its previous actions, and answers with one BrowserGym action such as ``click('13')``. The
score is the MiniWoB task reward: 1 when the task was completed, 0 otherwise.

Run it as a normal eval against any OpenAI-compatible server (LiteLLM routes ``hosted_vllm/<name>`` to
``<base_url>/chat/completions``); see docs/browsergym.md::

    pytest -p eval_protocol evals/eval_miniwob.py \\
        --ep-input-param model=hosted_vllm/Qwen/Qwen2.5-0.5B-Instruct \\
        --ep-input-param base_url=http://127.0.0.1:8000/v1

Train on it with ``python train_browsergym_trl.py`` (env_path ``evals/eval_miniwob.py::test_miniwob``).
"""

import itertools
import os

from eval_protocol.models import EvaluateResult, EvaluationRow, Message, MetricResult
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

from ep_trl.envs.browsergym import SYSTEM_PROMPT, BrowserGymAction, BrowserGymEnv, build_user_content
from ep_trl.envs.browsergym.actions import browsergym_action_parser, parse_action

#: Where the BrowserGym server listens; the training script sets it to the server it starts.
ENV_URL_VAR = "BROWSERGYM_ENV_URL"
DEFAULT_ENV_URL = "http://127.0.0.1:8020"
#: Tasks played in turn: one per prompt group in training, one per environment in a normal eval run.
TASKS = ["click-test", "click-button", "focus-text", "enter-text"]
#: The variable eval-protocol would set for a container it launches; the server reads the same name as its
#: default task, and a normal eval run lets it pin every episode to one task.
TASK_VAR = "BROWSERGYM_TASK_NAME"
#: Sent when the output holds no action. ``noop()`` would wait 1 s; ``noop(0)`` does nothing at once.
FALLBACK_ACTION = "noop(0)"
#: A reset starts Chromium (slower while a trainer shares the cores), so allow a minute per call.
REQUEST_TIMEOUT_S = 60.0

_created = itertools.count()


def next_task() -> str:
    """Task of the next environment: ``$BROWSERGYM_TASK_NAME`` if set, else ``TASKS`` in turn.

    eval-protocol's processor resets without arguments when it builds environments with ``env_factory``, so the
    client carries the task as its reset default; ep_trl's training rollouts pass ``reset(task_name=...)`` per
    prompt group, which takes precedence.
    """
    pinned = os.environ.get(TASK_VAR, "").strip()
    return pinned or TASKS[next(_created) % len(TASKS)]


def make_env():
    """A blocking BrowserGym client: eval-protocol's own processor calls reset()/step() without awaiting."""
    url = os.environ.get(ENV_URL_VAR, DEFAULT_ENV_URL)
    return BrowserGymEnv(base_url=url, task_name=next_task(), request_timeout_s=REQUEST_TIMEOUT_S).sync()


def build_prompt(observation, step: int, history: list[str]):
    """Goal, page URL, last action error, accessibility tree excerpt and recent actions.

    Plain text, or text and screenshot as content parts when the server sends screenshots
    (``BROWSERGYM_SCREENSHOT=1``), for vision-language models.
    """
    return build_user_content(observation, step, history)


def parse_model_action(text) -> BrowserGymAction:
    """The first BrowserGym action in the model's output, normalised; ``noop(0)`` (flagged) when there is none."""
    return browsergym_action_parser(text, fallback=FALLBACK_ACTION)


def fallback_count(row: EvaluationRow) -> tuple[int, int]:
    """How many of the episode's assistant turns held no usable action, out of how many turns."""
    turns = [m for m in row.messages if m.role == "assistant"]
    fell_back = sum(
        parse_action(m.content if isinstance(m.content, str) else str(m.content or "")).fell_back for m in turns
    )
    return fell_back, len(turns)


@evaluation_test(
    input_messages=[[[Message(role="system", content=SYSTEM_PROMPT)]]],
    completion_params=[
        {
            "model": "hosted_vllm/Qwen/Qwen2.5-0.5B-Instruct",
            "base_url": "http://127.0.0.1:8000/v1",
            "temperature": 0.0,
            "max_tokens": 48,
        }
    ],
    rollout_processor=OpenEnvRolloutProcessor(
        env_factory=make_env,
        prompt_builder=build_prompt,
        action_parser=parse_model_action,
        tasks=TASKS,
        task_var=TASK_VAR,
        request_timeout_s=REQUEST_TIMEOUT_S,
    ),
    steps=5,
    max_concurrent_rollouts=2,
    mode="pointwise",
)
def test_miniwob(row: EvaluationRow) -> EvaluationRow:
    """Score = the MiniWoB task reward (1 completed, 0 not); the fallback rate is reported beside it."""
    rewards = [float(r) for r in (row.execution_metadata.extra or {}).get("step_rewards", [])]
    if not rewards:
        raise ValueError("the episode took no step: the environment was done at reset")
    score = 1.0 if max(rewards) > 0 else 0.0
    fell_back, turns = fallback_count(row)
    row.evaluation_result = EvaluateResult(
        score=score,
        is_score_valid=True,
        reason=f"task reward {score:.0f} after {len(rewards)} steps; {fell_back}/{turns} outputs had no action",
        metrics={
            "fallback_rate": MetricResult(
                score=fell_back / turns if turns else 0.0,
                is_score_valid=True,
                reason=f"{fell_back} of {turns} turns fell back to {FALLBACK_ACTION}",
            ),
        },
    )
    return row
