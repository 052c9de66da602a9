"""The letters env served over openenv-core's WebSocket protocol by a real uvicorn process."""

import asyncio
import json
import time
import urllib.request
from typing import TYPE_CHECKING, Any, TypeVar

import pytest

from ep_trl.envs.letters import (
    CRASH_MESSAGE,
    LettersAction,
    LettersEnv,
    LettersEnvironment,
    LettersObservation,
    score_text,
)
from ep_trl.envs.letters.episode_log import EpisodeLog
from ep_trl.runtime.processes import ServerProcess
from tests.support.letters import LettersEpisodes

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from openenv.core.client_types import StepResult

    from ep_trl.envs.letters import LettersState

T = TypeVar("T")
LATENCY_S = 0.2


def run(coro: "Coroutine[Any, Any, T]") -> T:
    """Run one coroutine to completion in a fresh loop (each test owns its clients)."""
    return asyncio.run(coro)


# ---------------------------------------------------------------- scoring rule (in process)


@pytest.mark.parametrize(
    ("text", "alphabet", "expected"),
    [
        ("aeiou", "aeiou", 1.0),
        ("xyz", "aeiou", 0.0),
        ("", "aeiou", 0.0),
        (" \t\n", "aeiou", 0.0),
        ("a b\tc", "abc", 1.0),  # whitespace ignored
        ("abx", "abc", 0.6667),  # 2/3 rounded to 4 decimals
        ("AEIOU", "aeiou", 0.0),  # case-sensitive
        ("1a2b", "0123456789", 0.5),
    ],
)
def test_score_text(text: str, alphabet: str, expected: float) -> None:
    assert score_text(text, alphabet) == expected


# ---------------------------------------------------------------- against the session server


def test_reset_step_rewards_and_done(letters_server: str, letters_episodes: LettersEpisodes) -> None:
    async def play() -> list:
        async with LettersEnv(base_url=letters_server) as env:
            first = await env.reset(task_name="digits", episode_id="ep-digits", seed=7)
            results = [first]
            for text in ("12a", "x", "2024"):
                results.append(await env.step(LettersAction(text=text)))
            state = await env.state()
            with pytest.raises(RuntimeError, match="is done; call reset"):
                await env.step(LettersAction(text="1"))
            return results + [state]

    first, s1, s2, s3, state = run(play())
    obs = first.observation
    assert isinstance(obs, LettersObservation)
    assert (obs.task_name, obs.step, obs.max_steps, obs.alphabet) == ("digits", 0, 3, "0123456789")
    assert obs.prompt == "Task digits, step 1 of 3: write a short word using mostly the letters 0123456789."
    assert obs.last_action is None and first.reward is None and first.done is False

    assert [s.reward for s in (s1, s2, s3)] == [0.6667, 0.0, 1.0]
    assert [s.done for s in (s1, s2, s3)] == [False, False, True]
    assert [s.observation.step for s in (s1, s2, s3)] == [1, 2, 3]
    assert s1.observation.reward == 0.6667 and s3.observation.done is True
    assert s1.observation.last_action == "12a"
    assert s1.observation.prompt == (
        "You wrote '12a' (score 0.67). Step 2 of 3: write a short word using mostly the letters 0123456789."
    )
    assert s3.observation.prompt.startswith("You wrote '2024' (score 1.00).")
    assert (state.episode_id, state.step_count, state.done) == ("ep-digits", 3, True)
    assert state.actions == ["12a", "x", "2024"] and state.rewards == [0.6667, 0.0, 1.0]

    assert letters_episodes() == [
        {
            "episode_id": "ep-digits",
            "task_name": "digits",
            "actions": ["12a", "x", "2024"],
            "rewards": [0.6667, 0.0, 1.0],
            "done": True,
            "error": None,
            "seed": 7,  # recorded, not used: the game is deterministic
        }
    ]


def test_defaults_and_reset_kwargs(letters_server: str) -> None:
    """With no LETTERS_* server vars: task vowels, 3 steps; reset kwargs and client defaults override."""

    async def play() -> """tuple[
        LettersObservation, LettersObservation, StepResult[LettersObservation], LettersObservation, LettersObservation
    ]""":
        async with LettersEnv(base_url=letters_server) as env:
            default = (await env.reset()).observation
            custom = (await env.reset(task_name="abc", max_steps=1)).observation
            done = await env.step(LettersAction(text="cab"))
        async with LettersEnv(base_url=letters_server, task_name="digits", max_steps=2) as env:
            pinned = (await env.reset()).observation
            overridden = (await env.reset(task_name="vowels")).observation
        return default, custom, done, pinned, overridden

    default, custom, done, pinned, overridden = run(play())
    assert (default.task_name, default.max_steps, default.alphabet) == ("vowels", 3, "aeiou")
    assert default.prompt == "Task vowels, step 1 of 3: write a short word using mostly the letters aeiou."
    assert (custom.task_name, custom.max_steps) == ("abc", 1)
    assert done.done is True and done.reward == 1.0
    assert (pinned.task_name, pinned.max_steps) == ("digits", 2)
    assert (overridden.task_name, overridden.max_steps) == ("vowels", 2)


def test_episode_record_holds_actions_byte_for_byte(letters_server: str, letters_episodes: LettersEpisodes) -> None:
    texts = [" a\te \n", "héllo ☃ 'q' \"dq\" \\ \x00", ""]

    async def play() -> str:
        async with LettersEnv(base_url=letters_server) as env:
            result = await env.reset(task_name="vowels")
            for text in texts:
                result = await env.step(LettersAction(text=text))
            assert result.done
            return (await env.state()).episode_id

    episode_id = run(play())
    record = letters_episodes.by_id()[episode_id]
    assert record["actions"] == texts
    assert [a.encode("utf-8") for a in record["actions"]] == [t.encode("utf-8") for t in texts]
    assert record["rewards"] == [score_text(t, "aeiou") for t in texts]
    assert record["done"] is True and record["task_name"] == "vowels"


def test_episodes_clear(letters_server: str, letters_episodes: LettersEpisodes) -> None:
    async def play() -> None:
        async with LettersEnv(base_url=letters_server) as env:
            await env.reset()
            await env.reset()

    run(play())
    assert len(letters_episodes()) == 2
    assert letters_episodes.clear() == 2
    assert letters_episodes() == []


def test_unknown_task_is_a_clear_error(letters_server: str) -> None:
    async def play() -> None:
        async with LettersEnv(base_url=letters_server) as env:
            await env.reset(task_name="no-such-task")

    with pytest.raises(RuntimeError) as info:
        run(play())
    message = str(info.value)
    assert "Unknown letters task 'no-such-task'" in message
    for name in ("vowels", "digits", "abc", "crash"):
        assert name in message


def test_crash_task_fails_at_step_two(letters_server: str, letters_episodes: LettersEpisodes) -> None:
    async def play() -> tuple[float | None, str]:
        async with LettersEnv(base_url=letters_server, task_name="crash") as env:
            reset = await env.reset(episode_id="ep-crash")
            assert reset.observation.alphabet == "aeiou"
            first = await env.step(LettersAction(text="ae"))
            with pytest.raises(RuntimeError) as info:
                await env.step(LettersAction(text="io"))
            return first.reward, str(info.value)

    first_reward, message = run(play())
    assert first_reward == 1.0
    assert CRASH_MESSAGE == "letters env crashed on purpose at step 2"
    assert CRASH_MESSAGE in message
    record = letters_episodes.by_id()["ep-crash"]
    assert record["actions"] == ["ae"] and record["done"] is False
    assert record["error"] == CRASH_MESSAGE


def test_sessions_are_isolated(letters_server: str) -> None:
    async def play() -> """tuple[
        StepResult[LettersObservation], StepResult[LettersObservation], LettersState, LettersState
    ]""":
        async with LettersEnv(base_url=letters_server) as a, LettersEnv(base_url=letters_server) as b:
            await a.reset(task_name="abc", max_steps=2)
            await b.reset(task_name="digits", max_steps=2)
            ra = await a.step(LettersAction(text="ab"))
            rb = await b.step(LettersAction(text="ab"))
            return ra, rb, await a.state(), await b.state()

    ra, rb, sa, sb = run(play())
    assert (ra.reward, rb.reward) == (1.0, 0.0)
    assert (sa.task_name, sa.step_count, sb.task_name, sb.step_count) == ("abc", 1, "digits", 1)


def test_sync_client(letters_server: str, letters_episodes: LettersEpisodes) -> None:
    """The `.sync()` wrapper, as eval-protocol's processor uses it; the client takes a stock OpenEnv client's
    keywords (not eval-protocol's request_timeout_s, which a stock client refuses too)."""
    env = LettersEnv(base_url=letters_server, message_timeout_s=5.0).sync()
    assert env.async_client._message_timeout == 5.0
    with env:
        obs = env.reset(task_name="abc", max_steps=2).observation
        assert obs.task_name == "abc"
        r1 = env.step(LettersAction(text="abz"))
        r2 = env.step(LettersAction(text="c"))
        state = env.state()
    assert (r1.reward, r1.done, r2.reward, r2.done) == (0.6667, False, 1.0, True)
    assert state.actions == ["abz", "c"]
    assert letters_episodes()[0]["actions"] == ["abz", "c"]


def test_http_routes(letters_server: str) -> None:
    with urllib.request.urlopen(f"{letters_server}/health", timeout=5) as resp:
        assert json.loads(resp.read())["status"] == "healthy"
    with urllib.request.urlopen(f"{letters_server}/schema", timeout=5) as resp:
        schema = json.loads(resp.read())
    assert "text" in schema["action"]["properties"]
    assert {"task_name", "step", "max_steps", "alphabet", "prompt", "last_action"} <= set(
        schema["observation"]["properties"]
    )


# ---------------------------------------------------------------- server process, env-var settings, latency


def test_cli_logs_ready_line(letters_server_process: ServerProcess) -> None:
    expected = f"letters env ready on {letters_server_process.base_url}"
    assert expected in letters_server_process.output()


def test_env_vars_set_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """LETTERS_TASK / LETTERS_MAX_STEPS / LETTERS_STEP_LATENCY_S are read by the env (server side)."""
    monkeypatch.setenv("LETTERS_TASK", "digits")
    monkeypatch.setenv("LETTERS_MAX_STEPS", "2")
    monkeypatch.setenv("LETTERS_STEP_LATENCY_S", "0.05")
    env = LettersEnvironment(episode_log=EpisodeLog())
    obs = env.reset()
    assert (obs.task_name, obs.max_steps) == ("digits", 2)
    assert env.reset(task_name="abc", max_steps=4).task_name == "abc"
    start = time.perf_counter()
    env.step(LettersAction(text="a"))
    assert time.perf_counter() - start >= 0.05
    monkeypatch.setenv("LETTERS_TASK", "bogus")
    with pytest.raises(ValueError, match="Unknown letters task 'bogus'"):
        env.reset()
    with pytest.raises(ValueError, match="max_steps must be >= 1"):
        env.reset(task_name="abc", max_steps=0)


def test_a_heavy_tail_makes_one_episode_in_k_a_straggler(monkeypatch: pytest.MonkeyPatch) -> None:
    """LETTERS_TAIL_EVERY=k: one reset in k (counted by the server process) steps with LETTERS_TAIL_LATENCY_S."""
    monkeypatch.setenv("LETTERS_TAIL_EVERY", "3")
    monkeypatch.setenv("LETTERS_TAIL_LATENCY_S", "0.3")
    env = LettersEnvironment(episode_log=EpisodeLog())
    slow = []
    for _ in range(6):
        env.reset(max_steps=1)
        start = time.perf_counter()
        env.step(LettersAction(text="a"))
        slow.append(time.perf_counter() - start >= 0.3)
    first = slow.index(True)
    assert [i for i, s in enumerate(slow) if s] == [first, first + 3]


def test_concurrent_sessions_are_not_serialized(letters_server: str) -> None:
    """Sync step() sleeps in openenv's per-session executor threads, so sessions overlap."""
    n = 4

    async def play() -> tuple[float, float, list]:
        envs = [LettersEnv(base_url=letters_server) for _ in range(n)]
        try:
            await asyncio.gather(*(e.reset(task_name="vowels", step_latency_s=LATENCY_S) for e in envs))
            start = time.perf_counter()
            await envs[0].step(LettersAction(text="a"))
            single = time.perf_counter() - start
            start = time.perf_counter()
            results = await asyncio.gather(*(e.step(LettersAction(text="ax")) for e in envs))
            concurrent = time.perf_counter() - start
            return single, concurrent, results
        finally:
            await asyncio.gather(*(e.close() for e in envs))

    single, concurrent, results = run(play())
    assert single >= LATENCY_S  # the latency knob is applied
    assert concurrent >= LATENCY_S
    assert concurrent < 0.6 * n * LATENCY_S, f"{n} concurrent steps took {concurrent:.3f}s: serialized?"
    assert [r.reward for r in results] == [0.5] * n
