"""The option objects: every value checked when built, with the value and the fix in the message."""

from typing import Any

import pytest

from ep_trl import ConfigError, EvalOverrides, RolloutOptions, VLLMOptions, create_openenv_vllm_rollout_func

EVAL = "tests.evals.eval_letters::test_letters_pointwise"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tasks": "click-test"}, r"tasks='click-test'.*non-empty list of strings, e\.g\. tasks=\['click-test'\]"),
        ({"tasks": []}, "non-empty list of strings"),
        ({"tasks": ["ok", ""]}, "every entry must be a non-empty string"),
        ({"max_tokens": 0}, r"max_tokens=0.*integer >= 1"),
        ({"max_tokens": -5}, r"max_tokens=-5.*integer >= 1"),
        ({"max_steps": 2.5}, r"max_steps=2\.5.*integer >= 1"),
        ({"max_concurrent_rollouts": 0}, r"max_concurrent_rollouts=0.*integer >= 1"),
        ({"request_timeout_s": 0}, r"request_timeout_s=0.*> 0"),
        ({"request_timeout_s": float("inf")}, "finite"),
        ({"env_base_url": "localhost:8001"}, r"must be a URL such as 'http://127\.0\.0\.1:8001'"),
        ({"env_client_cls": "LettersEnv"}, "pass the client class itself"),
        ({"action_parser": "parse"}, "action_parser must be callable"),
        ({"reset_kwargs": {"wording": "locked"}}, "reset_kwargs must be callable"),
        ({"task_var": "MY TASK"}, "task_var must be a name"),
        ({"evaluation_test_kwargs": [("bonus", 1)]}, "must be a mapping"),
        ({"env_factory": lambda: None, "env_base_url": "http://127.0.0.1:1"}, "pass one of them"),
    ],
)
def test_eval_overrides_refuse_bad_values_naming_them(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        EvalOverrides(**kwargs)


def test_eval_overrides_normalise_what_they_accept() -> None:
    overrides = EvalOverrides(tasks=["a", "b"], stop="\n\n", evaluation_test_kwargs={"bonus": 1.0})
    assert overrides.tasks == ("a", "b")
    assert overrides.stop == ("\n\n",)  # a single stop string, as OpenAI's API allows, is one stop
    assert overrides.evaluation_test_kwargs == {"bonus": 1.0}


def test_a_keyword_and_an_override_must_agree() -> None:
    merged = EvalOverrides(max_steps=2).merged(env_base_url="http://127.0.0.1:1", max_concurrent_rollouts=None)
    assert merged.env_base_url == "http://127.0.0.1:1" and merged.max_steps == 2
    with pytest.raises(ConfigError, match=r"max_concurrent_rollouts is given twice.*\(3\).*\(2\)"):
        EvalOverrides(max_concurrent_rollouts=2).merged(max_concurrent_rollouts=3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_in_flight": 0}, r"max_in_flight=0.*integer >= 1"),
        ({"request_timeout_s": 0.0}, r"request_timeout_s=0\.0.*> 0"),
        ({"connect_timeout_s": -1}, "connect_timeout_s"),
        ({"max_retries": -1}, r"max_retries=-1.*integer >= 0"),
        ({"batch_window_s": -0.1}, r"batch_window_s=-0\.1.*>= 0"),
        ({"seed": "7"}, r"seed='7'"),
    ],
)
def test_vllm_options_refuse_bad_values_naming_them(
    kwargs: dict[str, int] | dict[str, float] | dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        VLLMOptions(**kwargs)


def test_rollout_options_refuse_bad_values() -> None:
    with pytest.raises(ConfigError, match="chat_template_kwargs"):
        RolloutOptions(chat_template_kwargs=["enable_thinking"])  # type: ignore[arg-type]  # the wrong type on purpose
    with pytest.raises(ConfigError, match="reuse_env_sessions"):
        RolloutOptions(reuse_env_sessions="yes")  # type: ignore[arg-type]  # the wrong type on purpose
    with pytest.raises(ConfigError, match=r"body_timeout_s=0.*> 0"):
        RolloutOptions(body_timeout_s=0)
    with pytest.raises(ConfigError, match=r"max_signal_free_calls=0.*integer >= 1"):
        RolloutOptions(max_signal_free_calls=0)
    with pytest.raises(ConfigError, match=r"stop_grace_s=0.*> 0"):
        RolloutOptions(stop_grace_s=0)
    with pytest.raises(ConfigError, match=r"stop_grace_s='30'.*> 0"):
        RolloutOptions(stop_grace_s="30")  # type: ignore[arg-type]  # the wrong type on purpose


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "sglang"}, "backend must be one of"),
        (
            {"vllm_base_url": "http://127.0.0.1:8000/v1"},
            r"ends with /v1; pass the server's root URL \('http://127\.0\.0\.1:8000'\)",
        ),
        ({"vllm_base_url": "127.0.0.1:8000"}, "root URL"),
        ({"max_episode_tokens": 0}, r"max_episode_tokens=0 must be an integer >= 1"),
        ({"max_concurrent_rollouts": -1}, r"max_concurrent_rollouts=-1.*integer >= 1"),
        ({"overrides": {"max_steps": 2}}, r"overrides= takes an ep_trl\.EvalOverrides"),
        ({"log_rollouts": "no"}, "log_rollouts"),
    ],
)
def test_the_factory_checks_its_keywords_before_reading_the_eval(
    kwargs: dict[str, str] | dict[str, int] | dict[str, dict[str, int]], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        create_openenv_vllm_rollout_func(EVAL, **kwargs)


def test_a_keyword_of_an_earlier_release_says_where_it_lives_now() -> None:
    with pytest.raises(TypeError, match=r"'tasks'; it is now overrides=EvalOverrides\(tasks=\.\.\.\)"):
        create_openenv_vllm_rollout_func(EVAL, tasks=["vowels"])
    with pytest.raises(TypeError, match=r"'vllm_max_in_flight'; it is now vllm=VLLMOptions\(max_in_flight=\.\.\.\)"):
        create_openenv_vllm_rollout_func(EVAL, vllm_max_in_flight=2)
