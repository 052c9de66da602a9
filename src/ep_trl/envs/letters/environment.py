"""The letters game: a tiny deterministic multi-turn text environment.

Each step the player writes some text; the reward is the fraction of its
non-whitespace characters that belong to the task's alphabet. Episodes last
``max_steps`` steps. A ``crash`` task fails on purpose at step 2 so callers
can test how they handle an environment dying mid-episode, and an optional
per-step latency (``LETTERS_STEP_LATENCY_S`` or reset's ``step_latency_s``) lets
benchmarks model slow environments. A heavy tail (``LETTERS_TAIL_EVERY`` = k and
``LETTERS_TAIL_LATENCY_S``) makes the 1st, (k+1)-th, (2k+1)-th ... episode the
server resets a straggler, stepping with the tail latency instead.
"""

import itertools
import logging
import os
import threading
import time
import uuid
from typing import Any, Optional

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from ep_trl.envs.letters.episode_log import EPISODE_LOG, EpisodeLog
from ep_trl.envs.letters.models import LettersAction, LettersObservation, LettersState

logger = logging.getLogger(__name__)

#: Task name -> scoring alphabet. ``crash`` scores like ``vowels`` but fails at step 2.
TASKS: dict[str, str] = {
    "vowels": "aeiou",
    "digits": "0123456789",
    "abc": "abc",
    "crash": "aeiou",
}
CRASH_TASK = "crash"
CRASH_AT_STEP = 2
CRASH_MESSAGE = f"letters env crashed on purpose at step {CRASH_AT_STEP}"

DEFAULT_TASK = "vowels"
DEFAULT_MAX_STEPS = 3

#: Env vars read by the *server* process at reset/step time.
TASK_ENV_VAR = "LETTERS_TASK"
MAX_STEPS_ENV_VAR = "LETTERS_MAX_STEPS"
STEP_LATENCY_ENV_VAR = "LETTERS_STEP_LATENCY_S"
TAIL_EVERY_ENV_VAR = "LETTERS_TAIL_EVERY"
TAIL_LATENCY_ENV_VAR = "LETTERS_TAIL_LATENCY_S"

#: Resets served by this process, counted for the heavy tail (sessions reset concurrently).
_RESETS = itertools.count(0)
_RESETS_LOCK = threading.Lock()


def score_text(text: str, alphabet: str) -> float:
    """Fraction of non-whitespace characters of ``text`` in ``alphabet`` (4 decimals).

    Case-sensitive on purpose: the rule is literal so tests can predict rewards
    exactly. Empty (or all-whitespace) text scores 0.0.
    """
    chars = [c for c in text if not c.isspace()]
    if not chars:
        return 0.0
    hits = sum(1 for c in chars if c in alphabet)
    return round(hits / len(chars), 4)


def _request(alphabet: str) -> str:
    """The instruction part of every prompt."""
    return f"write a short word using mostly the letters {alphabet}."


def _resolve_task(task_name: Optional[str]) -> str:
    """Task from the argument, else ``LETTERS_TASK``, else ``vowels``; validated."""
    name = task_name or os.environ.get(TASK_ENV_VAR) or DEFAULT_TASK
    if name not in TASKS:
        raise ValueError(f"Unknown letters task {name!r}; valid tasks: {sorted(TASKS)}")
    return name


def _resolve_max_steps(max_steps: Optional[int]) -> int:
    """Episode length from the argument, else ``LETTERS_MAX_STEPS``, else 3; must be >= 1."""
    if max_steps is None:
        raw = os.environ.get(MAX_STEPS_ENV_VAR)
        max_steps = int(raw) if raw else DEFAULT_MAX_STEPS
    max_steps = int(max_steps)
    if max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    return max_steps


def _resolve_step_latency_s(step_latency_s: Optional[float]) -> float:
    """Per-step delay from the argument, else ``LETTERS_STEP_LATENCY_S``, else 0."""
    if step_latency_s is None:
        raw = os.environ.get(STEP_LATENCY_ENV_VAR)
        step_latency_s = float(raw) if raw else 0.0
    latency = float(step_latency_s)
    if latency < 0:
        raise ValueError(f"step latency must be >= 0 seconds, got {latency}")
    return latency


def _tail_latency_s(reset_number: int) -> float | None:
    """The straggler latency for the ``reset_number``-th reset (0-based) when the heavy tail is on and it is one of
    every ``LETTERS_TAIL_EVERY`` resets (the first included), else None."""
    every = int(os.environ.get(TAIL_EVERY_ENV_VAR) or 0)
    if every < 1 or reset_number % every:
        return None
    return _resolve_step_latency_s(float(os.environ.get(TAIL_LATENCY_ENV_VAR) or 0.0))


class LettersEnvironment(Environment[LettersAction, LettersObservation, LettersState]):
    """One letters game session.

    The stock openenv server creates one instance per WebSocket session and runs
    the synchronous ``reset``/``step`` in that session's own single-thread
    executor, so a blocking ``time.sleep`` latency does not serialize sessions.
    Instances share nothing but the thread-safe ``EpisodeLog``.
    """

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, episode_log: EpisodeLog = EPISODE_LOG) -> None:
        super().__init__()
        self._log = episode_log
        self._state = LettersState()
        self._latency_s = 0.0

    def reset(
        self,
        seed: Optional[int] = None,
        episode_id: Optional[str] = None,
        task_name: Optional[str] = None,
        max_steps: Optional[int] = None,
        step_latency_s: Optional[float] = None,
        **kwargs: Any,
    ) -> LettersObservation:
        """Start an episode; ``seed`` is recorded in the episode log but unused (the game is deterministic).

        Each setting comes from its argument, else the server's environment
        (``LETTERS_TASK``, ``LETTERS_MAX_STEPS``, ``LETTERS_STEP_LATENCY_S``),
        else the default (vowels, 3 steps, no latency). ``step_latency_s`` as
        an argument lets one session be slow without restarting the server.
        """
        if kwargs:
            logger.debug("Ignoring unknown reset kwargs: %s", sorted(kwargs))
        task = _resolve_task(task_name)
        steps = _resolve_max_steps(max_steps)
        self._latency_s = _resolve_step_latency_s(step_latency_s)
        with _RESETS_LOCK:
            tail = _tail_latency_s(next(_RESETS))
        if tail is not None:
            self._latency_s = tail
        alphabet = TASKS[task]
        eid = episode_id or uuid.uuid4().hex
        self._state = LettersState(episode_id=eid, step_count=0, task_name=task, max_steps=steps, alphabet=alphabet)
        self._log.start(eid, task, seed)
        logger.debug("reset episode=%s task=%s max_steps=%d", eid, task, steps)
        return LettersObservation(
            task_name=task,
            step=0,
            max_steps=steps,
            alphabet=alphabet,
            prompt=f"Task {task}, step 1 of {steps}: {_request(alphabet)}",
            last_action=None,
            done=False,
            reward=None,
        )

    def step(
        self,
        action: LettersAction,
        timeout_s: Optional[float] = None,
        **kwargs: Any,
    ) -> LettersObservation:
        """Score ``action.text``, advance one step and describe the next one."""
        st = self._state
        if st.task_name is None or st.episode_id is None:
            raise RuntimeError("letters env: step() called before reset()")
        if st.done:
            raise RuntimeError(f"letters env: episode {st.episode_id} is done; call reset()")
        if self._latency_s:
            time.sleep(self._latency_s)
        step_number = st.step_count + 1
        if st.task_name == CRASH_TASK and step_number == CRASH_AT_STEP:
            self._log.record_error(st.episode_id, CRASH_MESSAGE)
            raise RuntimeError(CRASH_MESSAGE)

        text = action.text
        reward = score_text(text, st.alphabet)
        done = step_number >= st.max_steps
        st.step_count = step_number
        st.actions = [*st.actions, text]
        st.rewards = [*st.rewards, reward]
        st.done = done
        self._log.record_step(st.episode_id, text, reward, done)

        echo = f"You wrote {text!r} (score {reward:.2f})."
        if done:
            prompt = f"{echo} The episode is over after {st.max_steps} steps."
        else:
            prompt = f"{echo} Step {step_number + 1} of {st.max_steps}: {_request(st.alphabet)}"
        return LettersObservation(
            task_name=st.task_name,
            step=step_number,
            max_steps=st.max_steps,
            alphabet=st.alphabet,
            prompt=prompt,
            last_action=text,
            done=done,
            reward=reward,
        )

    @property
    def state(self) -> LettersState:
        """Current episode state (a copy, so callers cannot mutate the session)."""
        return self._state.model_copy(deep=True)

    def get_metadata(self) -> EnvironmentMetadata:
        """Describe the game for openenv's ``/metadata`` route."""
        return EnvironmentMetadata(
            name="letters",
            description="Write text using a task's alphabet; reward = fraction of matching characters.",
            version="1.0.0",
        )
