"""The BrowserGym MiniWoB eval (evals/eval_miniwob.py): its wiring, and real episodes through the bridge.

The eval is imported the way training imports it (file-path env_path). Tests marked slow drive a real BrowserGym
server (headless Chromium) and the tiny model through ``create_openenv_vllm_rollout_func``.
"""

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import pytest

from ep_trl import EvalOverrides, create_openenv_vllm_rollout_func, dataset_from_eval
from ep_trl.envs.browsergym import BrowserGymObservation
from ep_trl.evalprotocol import read_eval_spec, resolve_eval_test
from ep_trl.runtime.processes import ServerProcess
from tests.support.browsergym import browsergym_server as running_browsergym_server
from tests.support.trainers import make_trainer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


ROOT = Path(__file__).resolve().parents[2]
ENV_PATH = f"{ROOT / 'evals' / 'eval_miniwob.py'}::test_miniwob"
TASKS = ["click-test", "click-button", "focus-text", "enter-text"]


@pytest.fixture(scope="module")
def eval_module() -> ModuleType:
    """The eval's module, imported through ep_trl's env_path resolution."""
    return sys.modules[resolve_eval_test(ENV_PATH).module_name]


def observation(**fields: object) -> BrowserGymObservation:
    """An observation as the server sends it after reset on enter-text."""
    values: dict[str, Any] = {
        "goal": 'Enter "Ashlea" into the text field and press Submit.',
        "url": "file:///site-packages/miniwob/html/miniwob/enter-text.html",
        "axtree_txt": "RootWebArea 'Enter Text Task', focused\n\t[14] textbox '', clickable\n\t[15] button 'Submit', "
        "clickable",
        "clickable_bids": ["14", "15"],
    }
    return BrowserGymObservation(**{**values, **fields})


def test_the_bridge_reads_the_evals_processor_tasks_and_limits() -> None:
    spec = read_eval_spec(resolve_eval_test(ENV_PATH))
    assert spec.mode == "pointwise" and spec.max_steps == 5 and spec.max_concurrent_rollouts == 2
    assert spec.env is not None
    assert list(spec.env.tasks) == TASKS and spec.env.task_var == "BROWSERGYM_TASK_NAME"
    assert spec.env.factory is not None and spec.env.factory.__name__ == "make_env"
    assert spec.env.request_timeout_s == 60.0  # a Chromium reset on a busy 2-core machine needs more than 15 s
    assert spec.completion_params["max_tokens"] == 48 and spec.completion_params["temperature"] == 0.0
    assert spec.prompt_builder is not None and spec.action_parser is not None
    assert spec.prompt_builder.__name__ == "build_prompt" and spec.action_parser.__name__ == "parse_model_action"
    prompts = dataset_from_eval(ENV_PATH, repeat=3)["prompt"]
    assert len(prompts) == 3 and prompts[0][0]["role"] == "system" and "click('13')" in prompts[0][0]["content"]


def test_prompt_shows_goal_url_error_tree_and_history(eval_module: ModuleType) -> None:
    history = ["Step 1: click('15') -> reward +0.00 ERROR"]
    text = eval_module.build_prompt(observation(last_action_error="TimeoutError: element 99 not found"), 2, history)
    assert isinstance(text, str)
    assert 'Goal: Enter "Ashlea" into the text field and press Submit.' in text
    assert "URL: enter-text.html" in text and "/site-packages/" not in text  # the file name, not the machine path
    assert "Last action error: TimeoutError: element 99 not found" in text
    assert "[14] textbox ''" in text and "[15] button 'Submit'" in text
    assert "Step 1: click('15') -> reward +0.00 ERROR" in text
    assert text.startswith("Step 2\n")


def test_prompt_with_a_screenshot_is_text_and_image_parts(eval_module: ModuleType) -> None:
    parts = eval_module.build_prompt(observation(screenshot="iVBORw0KGgo="), 1, [])
    assert [p["type"] for p in parts] == ["text", "image_url"]
    assert "Goal: Enter" in parts[0]["text"]
    assert parts[1]["image_url"]["url"] == "data:image/png;base64,iVBORw0KGgo="


@pytest.mark.parametrize(
    ("output", "action", "fell_back"),
    [
        ("Action: click('15')", "click('15')", False),
        ("I will type the name.\n```python\ntype('14', 'Ashlea')\n```", "fill('14', 'Ashlea')", False),
        ("scroll('down')", "scroll(0, 200)", False),
        ("the button is at the bottom", "noop(0)", True),
        ("", "noop(0)", True),
    ],
)
def test_action_parser_normalises_and_falls_back_to_an_immediate_noop(
    eval_module: ModuleType, output: str, action: str, fell_back: bool
) -> None:
    parsed = eval_module.parse_model_action(output)
    assert parsed.action_str == action
    assert parsed.metadata["fell_back"] is fell_back
    assert parsed.metadata["raw_output"] == output


def test_body_scores_the_task_reward_and_reports_fallbacks(eval_module: ModuleType) -> None:
    from eval_protocol.models import EvaluationRow, Message

    def row(rewards: list[float], answers: list[str]) -> EvaluationRow:
        r = EvaluationRow(
            messages=[Message(role="system", content="s")]
            + [m for a in answers for m in (Message(role="user", content="obs"), Message(role="assistant", content=a))]
        )
        r.execution_metadata.extra = {"step_rewards": rewards}
        return r

    won = eval_module.test_miniwob._origin_func(row([0.0, 1.0], ["no idea", "click('15')"]))
    assert won.evaluation_result.score == 1.0 and won.evaluation_result.is_score_valid
    assert won.evaluation_result.metrics["fallback_rate"].score == 0.5
    lost = eval_module.test_miniwob._origin_func(row([0.0, 0.0], ["click('14')", "click('14')"]))
    assert lost.evaluation_result.score == 0.0 and lost.evaluation_result.metrics["fallback_rate"].score == 0.0
    with pytest.raises(ValueError, match="took no step"):
        eval_module.test_miniwob._origin_func(row([], []))


def test_tasks_rotate_per_environment_unless_pinned(eval_module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BROWSERGYM_TASK_NAME", raising=False)
    first = eval_module.next_task()
    start = TASKS.index(first)
    assert [eval_module.next_task() for _ in range(4)] == [TASKS[(start + k) % 4] for k in range(1, 5)]
    monkeypatch.setenv("BROWSERGYM_TASK_NAME", "click-button")
    assert {eval_module.next_task() for _ in range(3)} == {"click-button"}


# --------------------------------------------------------------------------- real server


@pytest.fixture(scope="module")
def browsergym_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A BrowserGym server for this module, exported as BROWSERGYM_ENV_URL the way the training script does."""
    with running_browsergym_server(tmp_path_factory.mktemp("browsergym-logs")) as server:
        yield server


@pytest.mark.slow
def test_env_factory_reads_the_url_at_call_time_and_resets_to_its_task(
    eval_module: ModuleType, browsergym_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BROWSERGYM_TASK_NAME", "focus-text")
    env = eval_module.make_env()  # eval-protocol's processor calls reset() with no arguments
    try:
        result = env.reset()
        assert result.observation.info["task_name"] == "focus-text"
        assert result.observation.url.endswith("focus-text.html")
    finally:
        env.close()


@pytest.mark.slow
def test_real_episodes_through_the_bridge(
    browsergym_server: ServerProcess, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Two calls of one prompt group each: full episodes, scored by the eval body, tasks rotating per group."""
    rollout = create_openenv_vllm_rollout_func(ENV_PATH, overrides=EvalOverrides(max_steps=2), log_rollouts=False)
    prompts = list(dataset_from_eval(ENV_PATH, repeat=2)["prompt"])
    trainer = make_trainer(
        tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=2, max_completion_length=640, prompts=prompts
    )
    tok = cast("PreTrainedTokenizerBase", trainer.processing_class)
    try:
        calls = [rollout(prompts, trainer), rollout(prompts, trainer)]
    finally:
        rollout.close()
    for out, page in zip(calls, ("click-test.html", "click-button.html")):
        assert out["episode_status"] == ["finished", "finished"]
        assert out["num_turns"] == [2, 2] and [len(r) for r in out["step_rewards"]] == [2, 2]
        assert out["eval_score"] == [0.0, 0.0]  # scored by the eval body (an untrained model completes nothing)
        for prompt_ids, completion_ids, env_mask in zip(out["prompt_ids"], out["completion_ids"], out["env_mask"]):
            prompt = tok.decode(prompt_ids)
            assert "Goal: " in prompt and f"URL: {page}" in prompt and "Previous actions:\n(none yet)" in prompt
            bridge = tok.decode([t for t, m in zip(completion_ids, env_mask) if m == 0])
            assert "Step 2\n" in bridge and "Step 1: " in bridge and f"URL: {page}" in bridge
            assert env_mask[0] == 1 and env_mask[-1] == 1
    log = browsergym_server.output()
    assert log.count("Reset click-test") == 2 and log.count("Reset click-button") == 2
