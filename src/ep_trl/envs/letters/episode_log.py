"""Server-wide, in-memory record of every letters episode.

Tests compare what the environment actually received with what the model
sampled, so actions are stored exactly as they arrived. Steps run in the
server's per-session executor threads, hence the lock.
"""

import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

#: Oldest episodes are dropped beyond this many, so a long demo training run
#: served by one process does not grow without bound.
MAX_EPISODES = 50_000


@dataclass
class EpisodeRecord:
    """One episode as the server saw it."""

    episode_id: str
    task_name: str
    actions: list[str] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    done: bool = False
    error: Optional[str] = None
    #: The ``seed`` its reset named (the game ignores it; tests read which seeds a run reset with).
    seed: Optional[int] = None

    def to_json(self) -> dict[str, Any]:
        """JSON shape served by ``GET /episodes``."""
        return {
            "episode_id": self.episode_id,
            "task_name": self.task_name,
            "actions": list(self.actions),
            "rewards": list(self.rewards),
            "done": self.done,
            "error": self.error,
            "seed": self.seed,
        }


class EpisodeLog:
    """Thread-safe, insertion-ordered store of ``EpisodeRecord`` by episode id."""

    def __init__(self, max_episodes: int = MAX_EPISODES) -> None:
        self._lock = threading.Lock()
        self._episodes: "OrderedDict[str, EpisodeRecord]" = OrderedDict()
        self._max_episodes = max_episodes

    def start(self, episode_id: str, task_name: str, seed: Optional[int] = None) -> None:
        """Open a record at reset; re-using an id starts that episode afresh."""
        with self._lock:
            self._episodes.pop(episode_id, None)
            self._episodes[episode_id] = EpisodeRecord(episode_id=episode_id, task_name=task_name, seed=seed)
            while len(self._episodes) > self._max_episodes:
                self._episodes.popitem(last=False)

    def record_step(self, episode_id: str, action_text: str, reward: float, done: bool) -> None:
        """Append one scored action to its episode."""
        with self._lock:
            rec = self._episodes.get(episode_id)
            if rec is None:
                # Evicted (or cleared) mid-episode: keep recording under a fresh entry
                # rather than losing the step; task name is unknown at this point.
                rec = EpisodeRecord(episode_id=episode_id, task_name="?")
                self._episodes[episode_id] = rec
            rec.actions.append(action_text)
            rec.rewards.append(reward)
            rec.done = done

    def record_error(self, episode_id: str, message: str) -> None:
        """Note that a step of this episode failed (the crash task)."""
        with self._lock:
            rec = self._episodes.get(episode_id)
            if rec is not None:
                rec.error = message

    def snapshot(self) -> list[dict[str, Any]]:
        """All episodes, oldest first, as JSON-ready dicts."""
        with self._lock:
            return [rec.to_json() for rec in self._episodes.values()]

    def clear(self) -> int:
        """Forget every episode; returns how many were dropped."""
        with self._lock:
            n = len(self._episodes)
            self._episodes.clear()
            return n


#: The single log shared by all sessions of one server process.
EPISODE_LOG = EpisodeLog()
