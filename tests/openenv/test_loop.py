"""Which errors fail one episode (environment, the eval's action parser, generation) and which raise (the rest)."""

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ep_trl import EvalOverrides, RolloutOptions, UnsupportedEvalError, create_openenv_vllm_rollout_func
from ep_trl.trajectory.episode import EpisodeFailure, EpisodePlan, ended_episode
from tests.support.tracked_env import TrackedLettersEnv
from tests.support.trainers import PROMPT, make_trainer

if TYPE_CHECKING:
    from trl import GRPOTrainer

    from ep_trl.envs.letters import LettersObservation

EVAL = "tests.evals.eval_letters::test_letters_pointwise"


def call_once(
    model_dir: Path, tmp_path: Path, server: str, **overrides: Any
) -> "tuple[dict[str, list[Any]], GRPOTrainer, list[TrackedLettersEnv]]":
    """One rollout call of 4 episodes on tracked letters sessions; the output, the trainer and the sessions."""
    TrackedLettersEnv.clients = []
    rollout = create_openenv_vllm_rollout_func(
        EVAL,
        env_factory=lambda: TrackedLettersEnv(base_url=server),
        overrides=EvalOverrides(**overrides),
        max_concurrent_rollouts=2,
        options=RolloutOptions(reuse_env_sessions=False),
        log_rollouts=False,
    )
    trainer = make_trainer(model_dir, tmp_path, rollout)
    try:
        return rollout([PROMPT] * 4, trainer), trainer, TrackedLettersEnv.clients
    finally:
        rollout.close()


def errors(trainer: "GRPOTrainer", kind: str) -> list[float]:
    return trainer._metrics["train"][f"ep_trl/errors/{kind}"]


def test_an_ended_episode_is_finished_with_its_stop_reason_or_failed_with_the_failure() -> None:
    plan = EpisodePlan(index=0, group=0, member=0, task=None, initial_messages=())
    fields: dict[str, Any] = dict(
        trajectory=object(),
        messages=(),
        step_rewards=(1.0,),
        actions=("a",),
        duration_s=0.5,
        prompt_tokens=7,
        budget_blocked_tokens=3,
    )
    finished = ended_episode(plan, None, "token_budget", **fields)
    assert (finished.status, finished.stop_reason, finished.error, finished.error_kind) == (
        "finished",
        "token_budget",
        None,
        None,
    )
    assert finished.prompt_tokens == 7 and finished.budget_blocked_tokens == 3 and finished.actions == ("a",)
    failed = ended_episode(
        plan, EpisodeFailure("environment", ConnectionError("reset timed out")), "max_steps", **fields
    )
    assert (failed.status, failed.stop_reason, failed.error, failed.error_kind) == (
        "error",
        "error",
        "ConnectionError: reset timed out",
        "environment",
    )
    assert failed.plan is plan and failed.step_rewards == (1.0,)


def test_a_raising_action_parser_fails_its_episodes_counted_as_eval_code(
    tiny_model_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    def parser(text: str) -> None:
        raise RuntimeError("the eval's parser cannot read this")

    out, trainer, clients = call_once(tiny_model_dir, tmp_path, letters_server, action_parser=parser)
    assert out["episode_status"] == ["error"] * 4 and out["eval_score"] == [None] * 4
    assert errors(trainer, "eval_code") == [4.0] and errors(trainer, "environment") == [0.0]
    assert all(c.events == ["reset", "close"] for c in clients)


def test_a_crashing_environment_is_counted_as_environment(
    tiny_model_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    out, trainer, _ = call_once(tiny_model_dir, tmp_path, letters_server, tasks=["crash"])
    assert out["episode_status"] == ["error"] * 4
    assert errors(trainer, "environment") == [4.0] and errors(trainer, "eval_code") == [0.0]


def test_an_error_that_would_fail_every_episode_alike_raises_and_closes_every_session(
    tiny_model_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    """A prompt the chat template cannot render is not one episode's bad luck: it raises out of the call
    (before, every episode failed quietly and training went on with no signal)."""

    def audio_prompt(observation: "LettersObservation", step: int, history: list[str]) -> list[dict[str, Any]]:
        return [{"type": "input_audio", "input_audio": {"data": "..."}}]

    with pytest.raises(ValueError, match="unsupported message content part type 'input_audio'"):
        call_once(tiny_model_dir, tmp_path, letters_server, prompt_builder=audio_prompt)
    clients = TrackedLettersEnv.clients
    assert clients and all(c.events[-1] == "close" and c.events.count("close") == 1 for c in clients)


def test_an_action_parser_that_calls_pytest_skip_raises_one_clear_error(
    tiny_model_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    """eval-protocol's example evals skip in their parser when the environment import failed: before, pytest's
    Skipped went through the whole rollout call; now it is one error naming the eval and the likely cause."""

    def parser(text: str) -> None:
        pytest.skip("guess_env not installed")

    with pytest.raises(
        UnsupportedEvalError,
        match=r"test_letters_pointwise: its action parser called "
        r"pytest.skip\('guess_env not installed'\).*not importable",
    ):
        try:
            call_once(tiny_model_dir, tmp_path, letters_server, action_parser=parser)
        except pytest.skip.Exception:  # escaped: this test was reported skipped instead of failing
            pytest.fail("the parser's pytest.skip escaped the rollout call (it was probed for its fallback action)")
    assert all(c.events[-1] == "close" for c in TrackedLettersEnv.clients)


def test_episodes_cut_by_the_token_budget_are_counted_and_explained(
    tiny_model_dir: Path, letters_server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    TrackedLettersEnv.clients = []
    rollout = create_openenv_vllm_rollout_func(EVAL, max_episode_tokens=40, log_rollouts=False)
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout)
    try:
        out = rollout([PROMPT] * 4, trainer)
    finally:
        rollout.close()
    stopped = trainer._metrics["train"]["ep_trl/stopped_by_token_budget"]
    assert stopped == [float(sum(n < 3 for n in out["num_turns"]))] and stopped[0] > 0
    assert "stopped early at the token budget of 40 completion tokens" in caplog.text
    assert "Raise GRPOConfig(max_completion_length=...) or max_episode_tokens=..." in caplog.text


def test_a_prompt_builder_that_raises_after_the_first_step_is_warned_about_naming_its_episode(
    tiny_model_dir: Path, letters_server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 48: the episode's label was reassigned to the action's, so from step 2 on the warning named the action
    the model had just taken instead of the episode."""

    def builder(observation: "LettersObservation", step: int, history: list[str]) -> str:
        if step >= 2:
            raise KeyError(f"no prompt for step {step}")
        return observation.prompt

    caplog.set_level("WARNING", logger="ep_trl.openenv.loop")
    out, _, _ = call_once(tiny_model_dir, tmp_path, letters_server, prompt_builder=builder)
    warned = [r.getMessage() for r in caplog.records if "prompt_builder raised" in r.getMessage()]
    assert any("no prompt for step 2" in message for message in warned), warned
    assert warned and all(
        re.match(r"episode \d+ \(task '(vowels|digits)'\): prompt_builder raised KeyError", message)
        for message in warned
    ), warned
    assert len({message.split(":")[0] for message in warned}) == len(out["num_turns"]) == 4, warned  # each episode
