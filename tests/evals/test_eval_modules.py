"""The eval modules in tests/evals: they import, carry the intended parameters, and work
under eval-protocol's own OpenEnvRolloutProcessor with the tiny model as the policy."""

import asyncio
import copy
import importlib
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
from eval_protocol.models import EvaluationRow, Message
from eval_protocol.pytest import SingleTurnRolloutProcessor
from eval_protocol.pytest.openenv_rollout_processor import OpenEnvRolloutProcessor
from eval_protocol.pytest.types import RolloutProcessorConfig

from ep_trl.envs.letters import CRASH_MESSAGE
from tests.support.letters import LettersEpisodes
from tests.support.tiny_policy import TinyModelPolicy

if TYPE_CHECKING:
    from eval_protocol.pytest.types import EvaluationTestParams

EXPECTED_COMPLETION_PARAMS = [{"model": "tiny-letters", "temperature": 0.0, "max_tokens": 12}]


def load(name: str) -> ModuleType:
    """Import an eval module as a module (importing a test_* name here would get it collected)."""
    return importlib.import_module(f"tests.evals.{name}")


def eval_names(module: ModuleType) -> list[str]:
    """Names of the eval tests (objects with ``__ep_params__``) defined in a module."""
    return sorted(n for n, v in vars(module).items() if hasattr(v, "__ep_params__"))


@pytest.mark.parametrize(
    ("module", "names", "mode", "tasks", "eval_kwargs"),
    [
        ("eval_letters", ["test_letters_pointwise"], "pointwise", ["vowels", "digits"], [{"bonus": 0.0}]),
        ("eval_letters_groupwise", ["test_letters_groupwise"], "groupwise", ["vowels", "digits"], None),
        ("eval_two_tests", ["test_letters_first", "test_letters_second"], "pointwise", ["vowels"], None),
        ("eval_raising", ["test_letters_raising"], "pointwise", ["vowels"], None),
        ("eval_crash", ["test_letters_crash"], "pointwise", ["crash"], [{"bonus": 0.0}]),
    ],
)
def test_openenv_eval_params(
    module: str, names: list[str], mode: str, tasks: list[str], eval_kwargs: list[dict[str, float]] | None
) -> None:
    mod = load(module)
    assert eval_names(mod) == names
    for name in names:
        params = getattr(mod, name).__ep_params__
        assert params.mode == mode
        assert params.steps == 3
        assert params.max_concurrent_rollouts == 4
        assert list(params.completion_params) == EXPECTED_COMPLETION_PARAMS
        assert params.evaluation_test_kwargs == eval_kwargs
        # input_messages nesting: [dataset][row][message]
        [[[message]]] = params.input_messages
        assert (message.role, message.content) == ("user", "Play the letters game.")
        proc = params.rollout_processor
        assert isinstance(proc, OpenEnvRolloutProcessor)
        assert proc._tasks == tasks and proc._task_var == "LETTERS_TASK"
        assert callable(getattr(mod, name)._origin_func)


def test_non_openenv_modules() -> None:
    assert eval_names(load("eval_none")) == []
    assert load("eval_none").not_an_eval() == 0
    single = load("eval_single_turn")
    assert eval_names(single) == ["test_single_turn"]
    assert isinstance(single.test_single_turn.__ep_params__.rollout_processor, SingleTurnRolloutProcessor)


def test_env_factory_reads_url_at_call_time(letters_server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = load("eval_letters").test_letters_pointwise.__ep_params__.rollout_processor
    monkeypatch.delenv("LETTERS_ENV_URL")
    with pytest.raises(KeyError, match="LETTERS_ENV_URL"):
        proc.env_factory()
    monkeypatch.setenv("LETTERS_ENV_URL", letters_server)
    env = proc.env_factory()
    try:
        assert env.reset().observation.task_name == "vowels"
    finally:
        env.close()


def _run_processor(
    proc: OpenEnvRolloutProcessor, params: "EvaluationTestParams", rows: list[EvaluationRow]
) -> list[Any]:
    """Run eval-protocol's processor over rows as its pytest path would (results or exceptions)."""
    config = RolloutProcessorConfig(
        completion_params=dict(params.completion_params[0]),
        mcp_config_path="",
        semaphore=asyncio.Semaphore(params.max_concurrent_rollouts),
        steps=params.steps,
    )

    async def go() -> list[Any]:
        return await asyncio.gather(*proc(rows, config), return_exceptions=True)

    return asyncio.run(go())


def _with_tiny_policy(proc: OpenEnvRolloutProcessor, model_dir: Path) -> OpenEnvRolloutProcessor:
    """A copy of the eval's processor whose policy is the tiny model (the module's own is untouched)."""
    patched = copy.copy(proc)
    patched.policy_factory = lambda model, temperature, max_tokens, base_url=None, **rest: TinyModelPolicy(
        model_dir, max_tokens=max_tokens, temperature=temperature
    )
    return patched


def _fresh_rows(params: "EvaluationTestParams", copies: int = 1) -> list[EvaluationRow]:
    [dataset] = params.input_messages
    return [EvaluationRow(messages=[m.model_copy() for m in msgs]) for msgs in dataset for _ in range(copies)]


def test_eval_letters_end_to_end(letters_server: str, letters_episodes: LettersEpisodes, tiny_model_dir: Path) -> None:
    ev = load("eval_letters")
    params = ev.test_letters_pointwise.__ep_params__
    proc = _with_tiny_policy(params.rollout_processor, tiny_model_dir)
    [row] = _run_processor(proc, params, _fresh_rows(params))
    assert isinstance(row, EvaluationRow), row

    rewards = row.execution_metadata.extra["step_rewards"]
    assert len(rewards) == 3
    assistant_texts = [m.content for m in row.messages if m.role == "assistant"]
    user_texts = [m.content for m in row.messages if m.role == "user"]
    assert user_texts[0] == "Play the letters game."
    assert user_texts[1] == "Task vowels, step 1 of 3: write a short word using mostly the letters aeiou."
    [episode] = letters_episodes()
    assert episode["actions"] == assistant_texts  # what the env received is what the model wrote
    assert episode["rewards"] == rewards and episode["done"] is True

    scored = asyncio.run(ev.test_letters_pointwise(row))  # eval-protocol's direct-call path
    assert scored.evaluation_result.score == pytest.approx(sum(rewards) / 3)
    assert scored.evaluation_result.is_score_valid is True
    with_bonus = ev.test_letters_pointwise._origin_func(row, bonus=0.5)
    assert with_bonus.evaluation_result.score == pytest.approx(sum(rewards) / 3 + 0.5)

    empty = EvaluationRow(messages=[Message(role="user", content="x")])
    with pytest.raises(ValueError, match="no step rewards"):
        ev.test_letters_pointwise._origin_func(empty)


def test_eval_crash_fails_at_step_two(
    letters_server: str, letters_episodes: LettersEpisodes, tiny_model_dir: Path
) -> None:
    params = load("eval_crash").test_letters_crash.__ep_params__
    proc = _with_tiny_policy(params.rollout_processor, tiny_model_dir)
    [outcome] = _run_processor(proc, params, _fresh_rows(params))
    assert isinstance(outcome, RuntimeError)
    assert CRASH_MESSAGE in str(outcome)
    [episode] = letters_episodes()
    assert episode["task_name"] == "crash" and len(episode["actions"]) == 1
    assert episode["error"] == CRASH_MESSAGE and episode["done"] is False


def test_eval_raising_body() -> None:
    ev = load("eval_raising")
    row = EvaluationRow(messages=[Message(role="user", content="x")])
    with pytest.raises(RuntimeError, match="scoring exploded"):
        ev.test_letters_raising._origin_func(row)


def test_groupwise_body_scores_relative_to_best() -> None:
    ev = load("eval_letters_groupwise")
    rows = []
    for rewards in ([0.5, 0.5, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]):
        row = EvaluationRow(messages=[Message(role="user", content="x")])
        row.execution_metadata.extra = {"step_rewards": rewards}
        rows.append(row)
    scored = asyncio.run(ev.test_letters_groupwise(rows))
    assert [r.evaluation_result.score for r in scored] == pytest.approx([2.0 / 3.0, 1.0, 0.0])
    for row in rows:
        row.execution_metadata.extra = {"step_rewards": [0.0]}
    zeros = asyncio.run(ev.test_letters_groupwise._origin_func(rows))
    assert [r.evaluation_result.score for r in zeros] == [0.0, 0.0, 0.0]
