"""How overrides, the eval and the GRPOConfig combine (pure functions, no server or model needed)."""

from dataclasses import replace
from typing import TYPE_CHECKING

import pytest

from ep_trl import ConfigError, EvalOverrides, UnsupportedEvalError
from ep_trl.engine.settings import apply_overrides, notes
from ep_trl.envs.letters import LettersEnv
from ep_trl.evalprotocol import read_eval_spec, resolve_eval_test
from ep_trl.openenv.episode import plan_episode
from tests.evals import letters_parts as parts

if TYPE_CHECKING:
    from typing import Any

    from ep_trl.evalprotocol.spec import EnvSettings, EvalSpec
    from ep_trl.openenv.episode import EpisodePlan
    from ep_trl.trajectory.types import Prompt


URL = "http://127.0.0.1:8001"


@pytest.fixture(scope="module")
def spec() -> "EvalSpec":
    return read_eval_spec(resolve_eval_test("tests.evals.eval_letters"))


def env_of(spec: "EvalSpec") -> "EnvSettings":
    """The spec's environment settings (every spec here has them)."""
    assert spec.env is not None
    return spec.env


def test_overrides_win_and_the_rest_is_the_evals(spec: "EvalSpec") -> None:
    merged = apply_overrides(spec, EvalOverrides(max_tokens=40, stop=["\n"], tasks=["digits"], max_steps=5))
    assert merged.completion_params["max_tokens"] == 40 and merged.completion_params["stop"] == ["\n"]
    assert merged.completion_params["model"] == parts.COMPLETION_PARAMS[0]["model"]
    assert env_of(merged).tasks == ("digits",) and env_of(merged).task_var == parts.TASK_VAR
    assert merged.max_steps == 5 and merged.max_concurrent_rollouts == parts.MAX_CONCURRENT_ROLLOUTS
    assert merged.prompt_builder is parts.prompt_builder
    assert apply_overrides(spec, EvalOverrides()) == replace(spec, env=replace(env_of(spec), request_timeout_s=60.0))


def test_environment_calls_are_never_bounded_tighter_than_a_stock_clients_own_wait(spec: "EvalSpec") -> None:
    """eval-protocol's default request_timeout_s (15 s) is not a bound the eval's own run applies: a stock
    client waits its own 60 s per reply; only an explicit override bounds tighter."""
    assert env_of(spec).request_timeout_s == 15.0
    assert env_of(apply_overrides(spec, EvalOverrides())).request_timeout_s == 60.0
    slow = replace(spec, env=replace(env_of(spec), request_timeout_s=180.0))
    assert env_of(apply_overrides(slow, EvalOverrides())).request_timeout_s == 180.0
    assert env_of(apply_overrides(spec, EvalOverrides(request_timeout_s=5.0))).request_timeout_s == 5.0


@pytest.mark.parametrize("source", [{"docker_image": "letters:latest"}, {"hub_repo_id": "someone/letters"}])
def test_overrides_are_applied_before_the_check(spec: "EvalSpec", source: "dict[str, Any]") -> None:
    """An eval that starts its environment from Docker or the hub uses env_base_url when given (before, it was
    refused with a message that said to pass env_base_url); without it, ep_trl has to start a server."""
    remote = replace(spec, env=replace(env_of(spec), factory=None, client_cls=LettersEnv, **source))
    merged = apply_overrides(remote, EvalOverrides(env_base_url=URL))
    assert (
        env_of(merged).base_url == URL and env_of(merged).client_cls is LettersEnv and not env_of(merged).needs_launch()
    )
    assert env_of(apply_overrides(remote, EvalOverrides())).needs_launch()


def test_an_explicit_url_replaces_the_evals_factory(spec: "EvalSpec") -> None:
    merged = apply_overrides(spec, EvalOverrides(env_client_cls=LettersEnv, env_base_url=URL))
    assert env_of(merged).factory is None and env_of(merged).base_url == URL


def test_body_kwargs_are_checked_against_the_body(spec: "EvalSpec") -> None:
    with pytest.raises(
        ConfigError,
        match=r"evaluation_test_kwargs \['bonsu'\] are not parameters of the eval body "
        r"\(it takes \['row', 'bonus'\]\)",
    ):
        apply_overrides(spec, EvalOverrides(evaluation_test_kwargs={"bonsu": 1.0}))
    with pytest.raises(UnsupportedEvalError, match="may not contain 'row'"):
        apply_overrides(spec, EvalOverrides(evaluation_test_kwargs={"row": 1}))


def test_env_vars_of_a_server_given_by_url_are_named_once(spec: "EvalSpec") -> None:
    remote = replace(
        spec,
        env=replace(env_of(spec), factory=None, client_cls=LettersEnv, base_url=URL, env_vars={"LETTERS_SEED": "3"}),
    )
    assert any("['LETTERS_SEED']" in n and "server's responsibility" in n for n in notes(remote))
    assert not any("server's responsibility" in n for n in notes(spec))


def test_tasks_rotate_per_prompt_group_across_calls_and_processes() -> None:
    def plan(first_group: int, tasks: tuple[str, ...]) -> "list[EpisodePlan]":
        return [
            plan_episode(p, i, first_group + i // 2, i % 2, tasks, None) for i, p in enumerate(["a", "a", "b", "b"])
        ]

    first_call = plan(0, ("x", "y", "z"))
    assert [(s.index, s.group, s.member, s.task) for s in first_call] == [
        (0, 0, 0, "x"),
        (1, 0, 1, "x"),
        (2, 1, 0, "y"),
        (3, 1, 1, "y"),
    ]
    later = plan(5, ("x", "y", "z"))  # e.g. process 1 of 2 on its third call
    assert [s.task for s in later] == ["z", "z", "x", "x"]
    assert [s.task for s in plan(0, ())] == [None] * 4


def test_the_evals_system_prompt_goes_first_unless_the_prompt_has_one() -> None:
    own = [{"role": "system", "content": "own"}, {"role": "user", "content": "hi"}]
    prompts: list[Prompt] = ["hi", own]
    specs = [plan_episode(p, i, i, 0, (), "Be brief.") for i, p in enumerate(prompts)]
    assert specs[0].initial_messages == ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"})
    assert specs[1].initial_messages[0] == {"role": "system", "content": "own"}


def test_an_episode_s_reset_seed_and_keywords_come_from_its_prompt_group() -> None:
    from ep_trl.evalprotocol.spec import EnvSettings
    from ep_trl.openenv.pool import reset_kwargs

    plans = [
        plan_episode(
            "hi",
            i,
            group,
            0,
            ("a", "b"),
            None,
            reset_seed=lambda g: 100 + g,
            reset_kwargs=lambda g: {"wording": ("is-open", "locked")[g % 2]},
        )
        for i, group in enumerate((4, 5))
    ]
    assert [(p.task, p.seed, p.reset_kwargs) for p in plans] == [
        ("a", 104, {"wording": "is-open"}),
        ("b", 105, {"wording": "locked"}),
    ]
    assert plan_episode("hi", 0, 0, 0, (), None).reset_kwargs is None
    settings = EnvSettings(base_url="http://127.0.0.1:1", tasks=("a", "b"))
    assert reset_kwargs(settings, "a", 104, {"wording": "locked"}) == {
        "task_name": "a",
        "seed": 104,
        "wording": "locked",
    }
    assert reset_kwargs(settings, None, None, {"wording": "locked"}) == {"wording": "locked"}
