"""Evals written the way eval-protocol's examples are, against a stock OpenEnv environment package
(tests/fixtures/guess_env: a stock client, a server with OpenEnv's defaults whose game is chosen by GUESS_GAME):
trained through ``env_path`` alone (ep_trl starts the servers) and with ``env_base_url`` only."""

import asyncio
import logging
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from ep_trl import ConfigError, EvalOverrides, create_openenv_vllm_rollout_func
from ep_trl.envs.letters import LettersEnv
from ep_trl.evalprotocol.spec import EnvSettings
from ep_trl.openenv.client import client_kwargs, constructor_parameters
from ep_trl.openenv.local_provider import LocalAppProvider
from ep_trl.openenv.pool import EnvPool
from ep_trl.openenv.servers import launch, server_app
from ep_trl.runtime.processes import ServerStartError
from tests.fixtures.guess_env import GuessEnv
from tests.fixtures.guess_server import games_in_text, running_guess_server
from tests.support.references import decoded_text, teacher_forced_logprobs
from tests.support.trainers import make_trainer

DOCKER_EVAL = "tests.evals.eval_guess_docker"
HUB_EVAL = "tests.evals.eval_guess_hub"
if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from trl import GRPOConfig, GRPOTrainer

    from ep_trl.adapters.rollout_func import RolloutFunction
    from ep_trl.openenv.source import OpenEnvSource
    from tests.fixtures.guess_env.models import GuessObservation

PROMPT = "Let's play a guessing game."


def played_games(trainer: "GRPOTrainer", out: dict[str, list[Any]]) -> list[str]:
    """The game each returned episode played, read from its first observation (in its prompt tokens)."""
    texts = [decoded_text(cast("PreTrainedTokenizerBase", trainer.processing_class), ids) for ids in out["prompt_ids"]]
    return [games_in_text(text)[0] for text in texts]


def assert_token_exact(trainer: "GRPOTrainer", out: dict[str, list[Any]]) -> None:
    """As tests/adapters/test_rollout_func.py: one sampled run per turn, inserted tokens masked with logprob 0, sampled
    tokens' logprobs equal to the model's teacher-forced ones."""
    model = trainer.model
    assert model is not None
    model.eval()
    for p, c, lps, mask, turns in zip(
        out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"], out["num_turns"]
    ):
        assert sum(1 for i, m in enumerate(mask) if m and (i == 0 or not mask[i - 1])) == turns
        reference = teacher_forced_logprobs(model, p, c, cast("GRPOConfig", trainer.args).temperature)
        assert all(lp == 0.0 for lp, m in zip(lps, mask) if not m)
        assert max(abs(lp - ref) for lp, ref, m in zip(lps, reference, mask) if m) < 1e-3


def pid_alive(pid: int | None) -> bool:
    assert pid is not None, "a started server has a process"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_stock_client_is_built_with_only_what_its_constructor_accepts() -> None:
    settings = EnvSettings(client_cls=GuessEnv, request_timeout_s=30.0, default_headers={"Authorization": "x"})
    kwargs = client_kwargs(settings, "http://127.0.0.1:1")
    accepted = constructor_parameters(GuessEnv)
    assert set(kwargs) <= accepted and "request_timeout_s" not in kwargs and "default_headers" not in kwargs
    assert kwargs["message_timeout_s"] == 30.0 and kwargs["base_url"] == "http://127.0.0.1:1"
    assert ("headers" in kwargs) == ("headers" in accepted)  # openenv 0.10 takes headers; openenv-core 0.3 none
    GuessEnv(**kwargs)  # eval-protocol's own call, cls(base_url=, request_timeout_s=, default_headers=), raises here


def test_the_server_beside_a_client_in_openenv_layout_is_found() -> None:
    assert server_app(GuessEnv) == "tests.fixtures.guess_env.server.app:app"
    assert server_app(LettersEnv) is None  # not OpenEnv's layout: nothing to start
    with pytest.raises(ConfigError, match=r"found no server beside ep_trl\.envs\.letters\.client.*provider="):
        launch(EnvSettings(client_cls=LettersEnv, docker_image="letters-env:latest"), None)


@pytest.mark.timeout(120)
def test_the_image_a_local_server_stands_in_for_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    """An eval naming its own build of the image (here read from its environment, as evals do) trains against the
    installed package's server: said once, at WARNING, with the image, what runs instead and how to run the image."""
    caplog.set_level(logging.INFO, logger="ep_trl")
    image = os.environ.get("GUESS_IMAGE", "my-registry/guess:dev")
    settings, servers = launch(EnvSettings(client_cls=GuessEnv, docker_image=image), None)
    try:
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1
        text = warnings[0].getMessage()
        assert "'my-registry/guess:dev'" in text and "tests.fixtures.guess_env.server.app:app" in text
        assert "provider=LocalDockerProvider()" in text and settings.base_url in servers.urls.values()
    finally:
        servers.close()


@pytest.mark.timeout(120)
def test_a_start_up_error_names_the_image_it_stood_in_for() -> None:
    with pytest.raises(ServerStartError) as raised:
        launch(
            EnvSettings(
                client_cls=GuessEnv, docker_image="my-registry/guess:dev", env_vars={"GUESS_GAME": "no-such-game"}
            ),
            None,
        )
    text = str(raised.value)
    assert "'my-registry/guess:dev'" in text and "no-such-game" in text  # the image, and the server's own words


@pytest.mark.timeout(600)
def test_a_docker_eval_plays_through_env_path_alone_inside_train(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One local server per task (GUESS_GAME set), with the eval's env_vars; a server admitting one session
    serves the eval's two concurrent episodes, also inside ``train()``; the servers stop when the rollout function
    closes. (What the servers are tested for is playing: the tiny model's guesses score about 0 in this game, so its
    groups carry no gradient; the tests that train assert one, ``assert_trained``.)"""
    caplog.set_level(logging.INFO, logger="ep_trl")
    rollout = cast("RolloutFunction", create_openenv_vllm_rollout_func(DOCKER_EVAL, log_rollouts=False))  # unsharded
    servers = cast("OpenEnvSource", rollout.source).servers
    assert servers is not None
    pids = [cast(LocalAppProvider, provider).pid for provider in servers.providers]
    assert (
        sorted(servers.urls, key=str) == ["digits", "vowels"] and all(pid_alive(pid) for pid in pids) and len(pids) == 2
    )
    trainer = make_trainer(
        tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=4, max_steps=2, prompts=[PROMPT] * 8
    )
    try:
        out = rollout([PROMPT] * 2 + ["Another round."] * 2, trainer)
        assert out["episode_status"] == ["finished"] * 4
        assert played_games(trainer, out) == ["vowels", "vowels", "digits", "digits"]  # the rotated tasks
        assert all(len(r) == 2 for r in out["step_rewards"])  # GUESS_MAX_STEPS=2 from the eval's env_vars
        assert_token_exact(trainer, out)
        assert caplog.text.count("admits 1 session(s) at a time") <= 2  # at most once per server
        trainer.train()  # real GRPOTrainer steps through the same servers
        assert trainer.state.global_step == 2
    finally:
        rollout.close()
    assert not servers.running and not any(pid_alive(pid) for pid in pids)


@pytest.mark.timeout(120)
def test_a_server_at_capacity_makes_an_episode_wait_not_fail(tmp_path: Path) -> None:
    """A stock server admits one session: while another client holds it, the episode's reset waits (before, the
    episode failed with CAPACITY_REACHED); once it is free, the episode gets a session."""
    with running_guess_server(tmp_path / "logs", game="digits") as url:

        async def main() -> tuple[str, int]:
            holder = GuessEnv(base_url=url)
            await holder.reset()  # someone else's session: the server is full
            pool = EnvPool(EnvSettings(client_cls=GuessEnv, base_url=url))
            waiting = asyncio.ensure_future(pool.start("episode 0", None))
            await asyncio.sleep(2.0)
            assert not waiting.done(), waiting.done() and waiting.exception()
            await holder.close()
            session, outcome = await asyncio.wait_for(waiting, 60)
            await pool.release(session, reusable=True)
            await pool.aclose()
            return cast("GuessObservation", outcome.observation).game, pool.opened

        game, opened = asyncio.run(main())
    assert game == "digits" and opened >= 2  # refused sessions were closed and replaced


@pytest.mark.timeout(600)
def test_a_hub_eval_plays_through_env_path_alone(tiny_model_dir: Path, tmp_path: Path) -> None:
    rollout = create_openenv_vllm_rollout_func(HUB_EVAL, log_rollouts=False)
    trainer = make_trainer(
        tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=2, max_steps=1, prompts=[PROMPT] * 4
    )
    try:
        out = rollout([PROMPT] * 2, trainer)
    finally:
        rollout.close()
    assert out["episode_status"] == ["finished"] * 2 and played_games(trainer, out) == ["digits", "digits"]


@pytest.mark.timeout(600)
def test_a_docker_eval_plays_with_env_base_url_only(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Given a URL, the server's own GUESS_GAME decides; the eval's env_vars are named as the server's
    responsibility, and rotation that cannot be confirmed is said once, not played silently."""
    caplog.set_level(logging.INFO, logger="ep_trl")
    with running_guess_server(tmp_path / "logs", game="digits") as url:
        rollout = create_openenv_vllm_rollout_func(DOCKER_EVAL, env_base_url=url, log_rollouts=False)
        trainer = make_trainer(
            tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=2, max_steps=1, prompts=[PROMPT] * 4
        )
        try:
            out = rollout([PROMPT] * 2 + ["Another round."] * 2, trainer)
            trainer.train()
        finally:
            rollout.close()
    assert out["episode_status"] == ["finished"] * 4
    assert played_games(trainer, out) == ["digits"] * 4
    assert_token_exact(trainer, out)
    assert "['GUESS_MAX_STEPS']" in caplog.text and "server's responsibility" in caplog.text
    assert caplog.text.count("cannot confirm the task was played") == 1


@pytest.mark.timeout(600)
def test_a_server_that_plays_another_task_than_asked_fails_those_episodes_saying_why(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Where the observation reports the task, a mismatch is an error, never a row scored as the wrong task."""
    with running_guess_server(tmp_path / "logs", game="digits") as url:
        rollout = create_openenv_vllm_rollout_func(
            DOCKER_EVAL, env_base_url=url, log_rollouts=False, overrides=EvalOverrides(reset_task_kwarg="game")
        )
        trainer = make_trainer(tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=4, prompts=[PROMPT] * 4)
        try:
            out = rollout([PROMPT] * 2 + ["Another round."] * 2, trainer)
        finally:
            rollout.close()
    assert out["episode_status"] == ["error"] * 2 + ["finished"] * 2  # vowels asked, digits played; then digits
    assert trainer._metrics["train"]["ep_trl/errors/environment"] == [2.0]
    assert Counter(out["eval_score"][:2]) == Counter([None, None])


@pytest.mark.timeout(600)
def test_a_provider_passed_by_the_user_starts_the_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    """provider= takes any OpenEnv provider (here ep_trl's own, given explicitly): one server for the call."""
    provider = LocalAppProvider("tests.fixtures.guess_env.server.app:app", env_vars={"GUESS_GAME": "vowels"})
    rollout = cast("RolloutFunction", create_openenv_vllm_rollout_func(HUB_EVAL, provider=provider, log_rollouts=False))
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=2, prompts=[PROMPT] * 4)
    try:
        servers = cast("OpenEnvSource", rollout.source).servers
        assert servers is not None
        assert servers.providers == [provider] and pid_alive(provider.pid)
        out = rollout([PROMPT] * 2, trainer)
    finally:
        rollout.close()
    assert out["episode_status"] == ["finished"] * 2 and provider.pid is None


def test_provider_and_env_base_url_are_one_or_the_other() -> None:
    with pytest.raises(ConfigError, match="provider= starts the environment server"):
        create_openenv_vllm_rollout_func(
            DOCKER_EVAL,
            env_base_url="http://127.0.0.1:1",
            provider=LocalAppProvider("tests.fixtures.guess_env.server.app:app"),
        )
