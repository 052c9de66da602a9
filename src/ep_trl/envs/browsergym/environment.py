"""OpenEnv environment over BrowserGym MiniWoB++: one Chromium per instance (per session).

Threading: Playwright's sync API only works on the thread that started it, and
openenv calls an environment from several threads (each WebSocket session's
executor, a shared pool for HTTP ``/reset``, the event loop for HTTP cleanup).
Each instance therefore owns one dedicated thread that runs all its browser
work, with its own Playwright instance (see ``runtime``); ``reset``/``step``/
``close`` may be called from any thread.

Lifecycle: construction is cheap (openenv builds throwaway instances for
``/metadata``, ``/state`` and concurrency checks); the browser starts at the
first ``reset`` and is closed, with its Playwright driver and thread, by
``close()``. openenv calls ``close()`` when a WebSocket session ends; the
server also closes every live instance at shutdown (``close_all_environments``).
"""

import atexit
import logging
import queue
import random
import threading
import time
import uuid
import weakref
from concurrent.futures import Future
from typing import Any, Callable, Optional, TypeVar

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from ep_trl.envs.browsergym.config import BrowserGymConfig
from ep_trl.envs.browsergym.models import BrowserGymAction, BrowserGymObservation, BrowserGymState
from ep_trl.envs.browsergym.observation import build_observation
from ep_trl.envs.browsergym.runtime import install_browsergym_patches, stop_thread_playwright
from ep_trl.envs.browsergym.tasks import default_task, gym_id, miniwob_base_url, resolve_task

logger = logging.getLogger(__name__)

T = TypeVar("T")

_RESET_ARGS = ("seed", "episode_id", "task_name", "screenshot")
_LIVE: "weakref.WeakSet[BrowserGymEnvironment]" = weakref.WeakSet()
_THREAD_STOP_TIMEOUT_S = 30.0


class _BrowserThread:
    """A dedicated daemon thread that runs submitted calls in order.

    A plain thread rather than a ThreadPoolExecutor: executors refuse work once
    interpreter shutdown begins, which is exactly when the atexit cleanup must
    still close browsers through this thread.
    """

    def __init__(self, name: str) -> None:
        """Start the thread."""
        self._queue: "queue.SimpleQueue[Optional[tuple[Callable[[], Any], Future]]]" = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        """Run calls until the stop sentinel arrives; results and errors go to each call's future."""
        while True:
            item = self._queue.get()
            if item is None:
                return
            func, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(func())
            except BaseException as exc:  # handed to the caller, who re-raises it
                future.set_exception(exc)

    def call(self, func: Callable[[], T]) -> T:
        """Run ``func`` on the thread and return its result (directly if already on it)."""
        if threading.current_thread() is self._thread:
            return func()
        future: Future = Future()
        self._queue.put((func, future))
        return future.result()

    def stop(self) -> None:
        """Let the thread finish queued calls and exit."""
        self._queue.put(None)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout=_THREAD_STOP_TIMEOUT_S)
            if self._thread.is_alive():
                logger.warning(
                    "Browser thread %s did not stop within %.0f s", self._thread.name, _THREAD_STOP_TIMEOUT_S
                )


class BrowserGymEnvironment(Environment[BrowserGymAction, BrowserGymObservation, BrowserGymState]):
    """A MiniWoB++ task in BrowserGym, driven by BrowserGym action strings."""

    #: Safe: every instance has its own thread, Playwright driver and Chromium.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, config: Optional[BrowserGymConfig] = None) -> None:
        """Create an idle environment (no browser until the first ``reset``)."""
        super().__init__()
        self._config = config or BrowserGymConfig.from_env()
        self._lock = threading.Lock()
        self._thread: Optional[_BrowserThread] = None
        self._closed = False
        self._gym: Any = None
        self._gym_task: Optional[str] = None
        self._screenshot = self._config.screenshot
        self._state = BrowserGymState()
        _LIVE.add(self)

    # ------------------------------------------------------------------ openenv API

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        task_name: Optional[str] = None,
        screenshot: Optional[bool] = None,
        **kwargs: Any,
    ) -> BrowserGymObservation:
        """Start an episode of ``task_name`` (default ``BROWSERGYM_TASK_NAME`` or 'click-test').

        ``seed`` picks the MiniWoB instance (a random one is drawn and recorded
        when None); ``screenshot`` turns base64 PNG screenshots on for this
        episode (default ``BROWSERGYM_SCREENSHOT``). Switching task re-creates
        the gym; BrowserGym relaunches Chromium on every reset regardless.
        """
        if kwargs:
            raise ValueError(f"Unknown reset argument(s) {sorted(kwargs)}; accepted: {', '.join(_RESET_ARGS)}.")
        task = resolve_task(task_name or default_task())
        seed = random.randrange(2**31) if seed is None else int(seed)
        episode_id = episode_id or uuid.uuid4().hex
        include_screenshot = self._config.screenshot if screenshot is None else bool(screenshot)
        started = time.monotonic()
        observation = self._run(lambda: self._reset_on_thread(task, seed, episode_id, include_screenshot))
        self._screenshot = include_screenshot
        self._state = BrowserGymState(
            episode_id=episode_id, step_count=0, task_name=task, seed=seed,
            goal=observation.goal, url=observation.url, cum_reward=0.0, done=observation.done,
        )  # fmt: skip
        logger.info("Reset %s (seed %d, episode %s) in %.2f s", task, seed, episode_id, time.monotonic() - started)
        return observation

    def step(self, action: BrowserGymAction, timeout_s: Optional[float] = None, **kwargs: Any) -> BrowserGymObservation:
        """Execute one BrowserGym action string.

        An invalid or failing action does not raise: BrowserGym reports it in
        ``last_action_error`` and the episode goes on. Reward and done come from
        the MiniWoB task.
        """
        if self._gym is None:
            raise RuntimeError("step() called before reset(): reset the environment to start an episode first.")
        state = self._state
        step_index = state.step_count + 1
        started = time.monotonic()
        observation = self._run(lambda: self._step_on_thread(action, step_index))
        reward = float(observation.reward or 0.0)
        self._state = state.model_copy(
            update={
                "step_count": step_index,
                "cum_reward": state.cum_reward + reward,
                "done": observation.done,
                "url": observation.url,
            }
        )
        logger.debug(
            "Step %d of %s: %r -> reward %.2f done %s error %r (%.2f s)",
            step_index, state.task_name, action.action_str, reward, observation.done,
            observation.last_action_error, time.monotonic() - started,
        )  # fmt: skip
        return observation

    @property
    def state(self) -> BrowserGymState:
        """Current episode bookkeeping (never touches the browser, so any thread may read it)."""
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        """Name and description shown by openenv's ``/metadata``."""
        return EnvironmentMetadata(
            name="BrowserGymMiniWoB",
            description="MiniWoB++ web tasks in BrowserGym (Chromium via Playwright); actions are BrowserGym calls.",
            version="0.1.0",
        )

    def close(self) -> None:
        """Close the browser, stop this instance's Playwright driver and thread. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread, self._thread = self._thread, None
        _LIVE.discard(self)
        if thread is None:
            return
        try:
            thread.call(self._close_on_thread)
        except Exception:
            # Nothing the caller could do: the driver is stopped either way (see _close_on_thread).
            logger.exception("Error while closing BrowserGym environment (episode %s)", self._state.episode_id)
        finally:
            thread.stop()
        logger.info("Closed BrowserGym environment (episode %s)", self._state.episode_id)

    # ------------------------------------------------------------------ browser thread

    def _run(self, func: Callable[[], T]) -> T:
        """Run ``func`` on this instance's browser thread, starting the thread on first use."""
        with self._lock:
            if self._closed:
                raise RuntimeError("This BrowserGym environment is closed; open a new session to continue.")
            if self._thread is None:
                self._thread = _BrowserThread(name=f"browsergym-{id(self):x}")
            thread = self._thread
        return thread.call(func)

    def _reset_on_thread(
        self, task: str, seed: int, episode_id: str, include_screenshot: bool
    ) -> BrowserGymObservation:
        """(Re)create the gym if the task changed, reset it, and build the first observation."""
        if self._gym is not None and self._gym_task != task:
            self._close_gym()
        if self._gym is None:
            self._gym = self._make_gym(task)
            self._gym_task = task
        try:
            raw, info = self._gym.reset(seed=seed)
        except Exception as exc:
            # A half-finished reset leaves BrowserEnv unable to reset again: start clean next time.
            self._close_gym()
            if "Executable doesn't exist" in str(exc):
                raise RuntimeError(f"Playwright's Chromium is missing: run scripts/install_browser.sh ({exc})") from exc
            raise
        return build_observation(
            raw,
            reward=0.0,
            done=False,
            include_screenshot=include_screenshot,
            info={
                "task_name": task, "seed": seed, "episode_id": episode_id, "step": 0,
                "truncated": False, "task_info": info.get("task_info", {}),
            },
        )  # fmt: skip

    def _step_on_thread(self, action: BrowserGymAction, step_index: int) -> BrowserGymObservation:
        """Run the action in BrowserGym and build the observation."""
        raw, reward, terminated, truncated, info = self._gym.step(action.action_str)
        return build_observation(
            raw,
            reward=float(reward),
            done=bool(terminated or truncated),
            include_screenshot=self._screenshot,
            info={
                "task_name": self._gym_task, "seed": self._state.seed, "episode_id": self._state.episode_id,
                "step": step_index, "truncated": bool(truncated), "task_info": info.get("task_info", {}),
                "action_exec_timeout_s": info.get("action_exec_timeout", 0), "action_metadata": dict(action.metadata),
            },
        )  # fmt: skip

    def _make_gym(self, task: str) -> Any:
        """Create the BrowserGym environment for ``task`` with this server's settings."""
        install_browsergym_patches()
        import gymnasium
        from browsergym.core.action.highlevel import HighLevelActionSet

        # One action per step: the parser already picks the first; a raw multi-action becomes an error.
        action_set = HighLevelActionSet(subsets=list(self._config.action_subsets), strict=False, multiaction=False)
        kwargs: dict[str, Any] = {
            "task_kwargs": {"base_url": miniwob_base_url()},
            "headless": self._config.headless,
            "pre_observation_delay": self._config.pre_observation_delay_s,
            "action_mapping": action_set.to_python_code,
            "wait_for_user_message": False,
        }
        if self._config.timeout_ms is not None:
            kwargs["timeout"] = self._config.timeout_ms
        return gymnasium.make(gym_id(task), disable_env_checker=True, **kwargs)

    def _close_gym(self) -> None:
        """Close the BrowserGym environment (task, browser context, browser), logging failures."""
        gym, self._gym, self._gym_task = self._gym, None, None
        if gym is None:
            return
        try:
            gym.close()
        except Exception:
            # The browser may already be gone (crashed or killed); Playwright cleanup below still runs.
            logger.warning("Closing the BrowserGym environment failed", exc_info=True)

    def _close_on_thread(self) -> None:
        """Close the gym and this thread's Playwright driver (which ends any remaining browser)."""
        try:
            self._close_gym()
        finally:
            stop_thread_playwright()


def close_all_environments() -> int:
    """Close every environment instance still open in this process; returns how many were open."""
    envs = list(_LIVE)
    for env in envs:
        try:
            env.close()
        except Exception:
            logger.warning("Closing a BrowserGym environment at shutdown failed", exc_info=True)
    if envs:
        logger.info("Closed %d open BrowserGym environment(s)", len(envs))
    return len(envs)


atexit.register(close_all_environments)
