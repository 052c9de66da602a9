"""The OpenEnv seam: async clients awaited, sync clients off the loop, every call bounded by a timeout."""

import asyncio
import threading
import time
from typing import TYPE_CHECKING, Any

import pytest

from ep_trl.envs.letters import LettersAction, LettersEnv
from ep_trl.evalprotocol.spec import EnvSettings
from ep_trl.openenv.client import open_env
from ep_trl.openenv.pool import EnvPool
from tests.support.tracked_env import TrackedLettersEnv

if TYPE_CHECKING:
    from collections.abc import Callable

    from ep_trl.openenv.client import EnvSession, StepOutcome
    from tests.support.letters import LettersEpisodes


class CountingSyncClient:
    """A synchronous client (like openenv 0.10's) that records how many of its calls overlap."""

    lock = threading.Lock()
    in_flight = 0
    peak = 0

    def __init__(self, url: str) -> None:
        self._inner = LettersEnv(base_url=url).sync()

    def _track(self, fn: "Callable[..., Any]", *args: Any, **kwargs: Any) -> Any:
        cls = type(self)
        with cls.lock:
            cls.in_flight += 1
            cls.peak = max(cls.peak, cls.in_flight)
        try:
            time.sleep(0.05)  # a slow environment: overlapping calls are what the seam must allow
            return fn(*args, **kwargs)
        finally:
            with cls.lock:
                cls.in_flight -= 1

    def reset(self, **kwargs: Any) -> Any:
        return self._track(self._inner.reset, **kwargs)

    def step(self, action: LettersAction) -> Any:
        return self._track(self._inner.step, action)

    def close(self) -> None:
        self._inner.close()


class HangingClient:
    """Fault injection: an environment whose reset never answers in time."""

    def reset(self, **kwargs: Any) -> None:
        time.sleep(2.0)

    def close(self) -> None:
        pass


async def play_session(session: "EnvSession", task: str) -> list[float | None]:
    """One letters episode of ``task`` on an open session; its step rewards."""
    return await play_from(session, await session.reset(task_name=task))


async def play_from(session: "EnvSession", outcome: "StepOutcome") -> list[float | None]:
    """The rest of a letters episode after its reset; its step rewards."""
    rewards: list[float | None] = []
    while not outcome.done:
        outcome = await session.step(LettersAction(text="aei"))
        rewards.append(outcome.reward)
    return rewards


async def play(settings: EnvSettings, task: str) -> list[float | None]:
    session = await open_env(settings, "test")
    try:
        return await play_session(session, task)
    finally:
        await session.close()


def test_sync_clients_run_off_the_loop_and_overlap(letters_server: str) -> None:
    settings = EnvSettings(factory=lambda: CountingSyncClient(letters_server))
    CountingSyncClient.peak = 0

    async def main() -> list[list[float | None]]:
        return await asyncio.gather(*(play(settings, "vowels") for _ in range(4)))

    results = asyncio.run(main())
    assert results == [[1.0, 1.0, 1.0]] * 4
    assert CountingSyncClient.peak >= 2, "sync environment calls were serialized"


def test_openenv_sync_wrapper_is_driven_through_its_async_client(letters_server: str) -> None:
    settings = EnvSettings(factory=lambda: LettersEnv(base_url=letters_server).sync())

    async def main() -> object:
        session = await open_env(settings, "t")
        inner = session._client
        await session.close()
        return inner

    assert isinstance(asyncio.run(main()), LettersEnv)
    assert asyncio.run(play(settings, "digits")) == [0.0, 0.0, 0.0]


def test_client_class_and_base_url_as_the_processor_builds_them(letters_server: str) -> None:
    settings = EnvSettings(client_cls=LettersEnv, base_url=letters_server, request_timeout_s=5.0)
    settings.check()
    assert asyncio.run(play(settings, "abc")) == [pytest.approx(1 / 3, abs=1e-4)] * 3


def test_hanging_environment_times_out_with_a_clear_message() -> None:
    settings = EnvSettings(factory=HangingClient, request_timeout_s=0.3)

    async def main() -> None:
        session = await open_env(settings, "episode 7")
        await session.reset()

    with pytest.raises(TimeoutError, match=r"episode 7: reset\(\) did not answer within"):
        asyncio.run(main())


def test_settings_without_any_environment_are_refused_with_the_fix() -> None:
    docker = EnvSettings(client_cls=LettersEnv, docker_image="letters-env:latest")
    assert docker.needs_launch()  # ep_trl starts its server (tests/openenv/test_servers.py)
    docker.check()
    with pytest.raises(ValueError, match="neither env_factory nor env_client_cls.*try/except ImportError"):
        EnvSettings().check()


def play_pooled(pool: EnvPool, tasks: list[str], concurrency: int) -> list[list[float | None] | str]:
    """Episodes of ``tasks`` through ``pool``, ``concurrency`` at a time, as the rollout runs them."""

    async def episode(limit: asyncio.Semaphore, task: str) -> list[float | None] | str:
        async with limit:
            session = None
            failed = True
            try:
                session, outcome = await pool.start(f"episode {task}", task)
                rewards = await play_from(session, outcome)
                failed = False
                return rewards
            except RuntimeError as exc:
                return str(exc)
            finally:
                if session is not None:
                    await pool.release(session, reusable=not failed)

    async def main() -> list[list[float | None] | str]:
        limit = asyncio.Semaphore(concurrency)
        try:
            return await asyncio.gather(*(episode(limit, t) for t in tasks))
        finally:
            await pool.aclose()

    return asyncio.run(main())


def test_pool_reuses_sessions_of_clean_episodes_and_closes_every_one(
    letters_server: str, letters_episodes: "LettersEpisodes"
) -> None:
    TrackedLettersEnv.clients = []
    pool = EnvPool(EnvSettings(factory=lambda: TrackedLettersEnv(base_url=letters_server)))
    results = play_pooled(pool, ["vowels"] * 6, concurrency=2)
    assert results == [[1.0, 1.0, 1.0]] * 6  # every reset on a reused session starts a fresh 3-step episode
    clients = TrackedLettersEnv.clients
    assert pool.opened == len(clients) == 2
    assert sum(c.events.count("reset") for c in clients) == 6
    assert all(c.events[-1] == "close" and c.events.count("close") == 1 for c in clients)
    assert [len(ep["actions"]) for ep in letters_episodes()] == [3] * 6


def test_pool_closes_a_failed_episodes_session_instead_of_reusing_it(letters_server: str) -> None:
    TrackedLettersEnv.clients = []
    pool = EnvPool(EnvSettings(factory=lambda: TrackedLettersEnv(base_url=letters_server)))
    results = play_pooled(pool, ["crash", "vowels", "crash", "vowels"], concurrency=1)
    assert [r if isinstance(r, list) else "crashed" for r in results] == ["crashed", [1.0] * 3, "crashed", [1.0] * 3]
    for client in TrackedLettersEnv.clients:
        if "crash" in client.events:  # nothing after the crash but the close
            assert client.events[client.events.index("crash") + 1 :] == ["close"]
    assert [c.events for c in TrackedLettersEnv.clients] == [
        ["reset", "crash", "close"],
        ["reset", "reset", "crash", "close"],
        ["reset", "close"],
    ]


def test_pool_without_reuse_opens_and_closes_one_session_per_episode(letters_server: str) -> None:
    TrackedLettersEnv.clients = []
    pool = EnvPool(EnvSettings(factory=lambda: TrackedLettersEnv(base_url=letters_server)), reuse=False)
    assert play_pooled(pool, ["vowels"] * 4, concurrency=2) == [[1.0, 1.0, 1.0]] * 4
    assert pool.opened == 4
    assert [c.events for c in TrackedLettersEnv.clients] == [["reset", "close"]] * 4


class LoopClient:
    """An async client that records the task its calls run in; ``hang`` makes step never answer."""

    def __init__(self, hang: bool = False) -> None:
        self.hang = hang
        self.tasks: list[asyncio.Task[Any] | None] = []

    async def reset(self, **kwargs: Any) -> "StepResult":
        self.tasks.append(asyncio.current_task())
        return StepResult()

    async def step(self, action: object) -> "StepResult":
        self.tasks.append(asyncio.current_task())
        if self.hang:
            await asyncio.sleep(30)
        return StepResult(reward=1.0, done=True)

    async def close(self) -> None:
        pass


class StepResult:
    def __init__(self, reward: float | None = None, done: bool = False) -> None:
        self.observation, self.reward, self.done = "obs", reward, done


def test_an_async_clients_calls_run_in_the_episodes_own_task_under_the_timeout() -> None:
    """No task per environment call (the deadline is asyncio.timeout's, in the caller's task), and a hanging step
    still ends at the timeout with the message naming the episode."""
    client = LoopClient()

    async def main(settings: EnvSettings) -> "tuple[asyncio.Task[Any] | None, StepOutcome]":
        session = await open_env(settings, "episode 3")
        await session.reset()
        outcome = await session.step("a")
        return asyncio.current_task(), outcome

    task, outcome = asyncio.run(main(EnvSettings(factory=lambda: client, request_timeout_s=5.0)))
    assert client.tasks == [task, task] and outcome.reward == 1.0 and outcome.done
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"episode 3: step\(\) did not answer within 0.3 s"):
        asyncio.run(main(EnvSettings(factory=lambda: LoopClient(hang=True), request_timeout_s=0.3)))
    assert time.monotonic() - started < 5
