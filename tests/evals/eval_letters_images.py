"""The letters eval with a picture in every observation: a vision-language model's image eval without a browser.

Each turn's user message is the environment's prompt as text plus a small one-colour PNG (a data URI, the form
BrowserGym screenshots take) whose colour depends on the task and the step, so the episodes of a group see the same
pictures and different groups, and turns, see different ones. Score: the mean step reward (the share of characters
from the task's alphabet), a continuous score that gives GRPO's groups a signal from the first step.
"""

from typing import TYPE_CHECKING

from eval_protocol.models import EvaluateResult, EvaluationRow
from eval_protocol.pytest import evaluation_test
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor

from tests.evals import letters_parts as parts
from tests.support.images import png_data_uri

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ep_trl.envs.letters import LettersObservation

TASKS = ["vowels", "digits"]


def picture(step: int, task: str | None) -> str:
    """The observation's picture: a colour per (task, step)."""
    shade = (60 * step) % 256
    return png_data_uri((shade, 200, 40) if task == "digits" else (200, shade, 220))


def prompt_builder(obs: "LettersObservation", step: int, history: list[str]) -> "list[dict[str, Any]]":
    """The env's prompt, then its picture, as OpenAI-style content parts."""
    return [
        {"type": "text", "text": obs.prompt},
        {"type": "image_url", "image_url": {"url": picture(step, getattr(obs, "task_name", None))}},
    ]


def image_letters_test(
    builder: "Callable[[LettersObservation, int, list[str]], list[dict[str, Any]]]",
    *,
    steps: int,
    max_concurrent_rollouts: int = parts.MAX_CONCURRENT_ROLLOUTS,
) -> "Callable[[Callable[[EvaluationRow], EvaluationRow]], Any]":
    """The ``@evaluation_test`` of an image letters eval whose observations ``builder`` renders (pointwise)."""
    return evaluation_test(
        input_messages=parts.INPUT_MESSAGES,
        completion_params=parts.COMPLETION_PARAMS,
        rollout_processor=OpenEnvRolloutProcessor(
            env_factory=parts.make_env_factory(),
            prompt_builder=builder,
            action_parser=parts.action_parser,
            tasks=TASKS,
            task_var=parts.TASK_VAR,
        ),
        steps=steps,
        max_concurrent_rollouts=max_concurrent_rollouts,
        mode="pointwise",
    )


def mean_step_reward(row: EvaluationRow) -> EvaluationRow:
    """Mean of the per-step rewards; an episode with no steps is an error."""
    rewards = parts.step_rewards(row)
    if not rewards:
        raise ValueError("letters images eval: row has no step rewards (the episode took 0 steps)")
    row.evaluation_result = EvaluateResult(
        score=sum(rewards) / len(rewards), is_score_valid=True, reason=f"mean of {len(rewards)} step rewards {rewards}"
    )
    return row


@image_letters_test(prompt_builder, steps=2)
def test_letters_images(row: EvaluationRow) -> EvaluationRow:
    """The mean step reward (``mean_step_reward``)."""
    return mean_step_reward(row)
