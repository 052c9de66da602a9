"""One rollout call's episodes played by several shard processes (``RolloutOptions(worker_processes=N)``).

When generation is fast (a GPU server), the trainer's one Python process can become the limit: an eval's processor
whose model client costs milliseconds per call (LiteLLM) keeps one core busy whatever ep_trl does. Then each call's
prompt groups are split into N contiguous shards, each played by a shard process with a rollout function of its
own (its own event loop, endpoint, environment sessions, log writer), built from the same factory arguments. The
shards' outputs are joined back in prompt order, so TRL gets what one process would have returned; the per-call
metrics are combined (counts summed, fractions and means weighted by episodes, episodes/s over the whole call).

Nothing outlives the trainer: a shard process ends when its pipe to the trainer closes (``close()``, or the trainer's
death), and a thread in it ends it when its parent process is gone; the servers a shard process starts run under the
watchdog, which ends them with the shard process.

Closing fits in the stop grace, and loses no ``ep logs`` row: ``close()`` stops every shard process at once and waits
for them together, at most ``STOP_WAIT_S``, and after a SIGTERM at most what the trainer's grace leaves (less
ep_trl's reserve for its own exit). A shard process in the middle of a call (the stop message waits behind it) is sent
SIGTERM, which cancels the call the way it does in the trainer: its episodes are cancelled and its rollout function is
closed, sessions, servers and the log rows still queued written. A shard process whose trainer is gone ends the same
way. One still running when the wait ends is killed.

The shard processes are the trainer's: a process forked from it (``os.fork``, a fork-context data-loader worker) shares
their pipes but owns none of them. Its ``close()`` stops none, its rollout calls are refused, and its exit leaves
them alone (``multiprocessing``, which would terminate the daemon processes it believes are its children when a
forked child exits, is told they are not the child's).
"""

import atexit
import logging
import multiprocessing
import multiprocessing.process
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeAlias, runtime_checkable

from ..engine.caller import DetachedCaller, GroupNumbers, RolloutCaller, TrainingConfig
from ..errors import ConfigError
from ..evalprotocol.resolve import resolve_eval_test
from ..evalprotocol.spec import read_eval_spec
from ..options import RolloutOptions
from ..runtime import shutdown
from ..trajectory.types import Prompt, Settings
from . import trl_seam

if TYPE_CHECKING:  # named for the checker only
    from multiprocessing.connection import Connection

    from trl import GRPOTrainer

#: The factory a shard builds its rollout function with (``create_openenv_vllm_rollout_func`` and its kind): with
#: ``worker_processes=1`` it builds a :class:`ShardRollout`.
Build: TypeAlias = Callable[..., object]


@runtime_checkable
class ShardRollout(Protocol):
    """What a shard process calls on the rollout function it built (``adapters.rollout_func.RolloutFunction``, named
    here by its methods: that module builds this one's)."""

    def run(
        self, prompts: Sequence[Prompt], caller: RolloutCaller, first_group: int | None = None
    ) -> dict[str, list[Any]]: ...

    def flush_logs(self) -> None: ...

    def close(self) -> None: ...


logger = logging.getLogger(__name__)

#: How often a shard process checks that the trainer process is still its parent.
PARENT_CHECK_S = 1.0
#: How long ``close()`` waits for the shard processes, all together, to end before killing them (after a SIGTERM,
#: at most what the stop grace leaves, less ``shutdown.CLOSE_RESERVE_S``, or half of it when less is left).
STOP_WAIT_S = 30.0


def shard_bounds(groups: int, group_size: int, total: int, processes: int) -> list[tuple[int, int]]:
    """``(start, end)`` prompt indices of each shard: whole groups, contiguous, as even as groups allow; no empty
    shard (fewer shards than processes when there are fewer groups)."""
    shards = min(processes, groups)
    bounds = []
    for k in range(shards):
        first, last = groups * k // shards, groups * (k + 1) // shards
        bounds.append((first * group_size, min(total, last * group_size)))
    return bounds


def join_outputs(outputs: Sequence[Mapping[str, list[Any]]]) -> dict[str, list[Any]]:
    """The shards' output dicts as one, each key's lists concatenated in shard order; a key only some shards have
    (``images``) is filled with empty lists for the others' samples."""
    keys = list(dict.fromkeys(key for out in outputs for key in out))
    joined: dict[str, list[Any]] = {key: [] for key in keys}
    for out in outputs:
        n = len(out["prompt_ids"])
        for key in keys:
            joined[key].extend(out[key] if key in out else [[] for _ in range(n)])
    return joined


def join_metrics(metrics: Sequence[Mapping[str, float]], episodes: Sequence[int], seconds: float) -> dict[str, float]:
    """One call's ``ep_trl/*`` metrics from its shards': fractions and means weighted by episodes, episodes/s over
    the whole call, every other number (counts) summed."""
    total = sum(episodes)
    joined: dict[str, float] = {}
    for key in dict.fromkeys(k for m in metrics for k in m):
        values = [(m[key], n) for m, n in zip(metrics, episodes) if key in m]
        if key == "ep_trl/episodes_per_s":
            joined[key] = total / seconds if seconds > 0 else float("inf")
        elif key.endswith("_fraction") or key.startswith("ep_trl/mean_"):
            joined[key] = sum(v * n for v, n in values) / max(1, sum(n for _, n in values))
        else:
            joined[key] = float(sum(v for v, _ in values))
    return joined


def sharded_rollout_func(
    env_path: str, processes: int, build: Build, kwargs: dict[str, Any]
) -> "ShardedRolloutFunction":
    """The rollout function of ``RolloutOptions(worker_processes=N)``: ``build(env_path, **kwargs)`` (the factory)
    run in each of ``processes`` processes."""
    spec = read_eval_spec(resolve_eval_test(env_path))
    if spec.mode == "all":
        raise ConfigError(
            f"{spec.qualified_name} scores the whole batch at once (mode='all'), which shard processes "
            "would split: use RolloutOptions(worker_processes=1)."
        )
    if kwargs["backend"] == "trainer":
        raise ConfigError(
            "RolloutOptions(worker_processes>1) generates on a vLLM server; backend='trainer' samples "
            "with the trainer's model in its own process."
        )
    return ShardedRolloutFunction(env_path, kwargs, processes, f"ep_trl_rollout[{spec.qualified_name}]", build=build)


class ShardedRolloutFunction:
    """A ``rollout_func`` whose calls are played by ``processes`` shard processes; see the module docstring. Each
    builds its rollout function with ``build(env_path, **factory_kwargs)`` (the factory, a module-level function:
    it reaches the shard process by name)."""

    def __init__(self, env_path: str, factory_kwargs: Settings, processes: int, name: str, build: Build) -> None:
        try:
            pickle.dumps(dict(factory_kwargs))
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            raise ConfigError(
                f"RolloutOptions(worker_processes={processes}): every argument of the factory must reach "
                f"the shard processes, and one cannot be pickled ({exc}); pass env_factory and "
                "provider as module-level names, or use worker_processes=1."
            ) from exc
        self.__name__ = name
        self._vllm_base_url = factory_kwargs.get("vllm_base_url")
        self._sent: TrainingConfig | None = None  # the configuration the shard processes hold
        self._group_numbers = GroupNumbers()
        self.calls = 0
        self._owner = os.getpid()  # the shard processes are this process's: a forked child owns none of them
        self._closed = False
        self._in_call: set[int] = set()  # shards sent a call whose answer was not read: busy, or answered
        context = multiprocessing.get_context("spawn")  # the trainer has threads and an event loop: never fork it
        self._shards = []
        for k in range(processes):
            mine, theirs = context.Pipe()
            process = context.Process(
                target=_serve,
                args=(theirs, build, env_path, dict(factory_kwargs), os.getpid()),
                name=f"ep-trl-shard-{k}",
                daemon=True,
            )
            process.start()
            theirs.close()
            self._shards.append((process, mine))
        _live.add(self)
        shutdown.register(self, getattr(factory_kwargs.get("options"), "stop_grace_s", None))

    def __call__(self, prompts: Sequence[Prompt], *trainer_args: "GRPOTrainer") -> dict[str, list[Any]]:
        caller = trl_seam.caller_of(trainer_args)
        caller.wait_for_weight_sync()
        return self.run(prompts, caller)

    def run(self, prompts: Sequence[Prompt], caller: RolloutCaller) -> dict[str, list[Any]]:
        if not prompts:
            raise ValueError("rollout_func was called with no prompts")
        shutdown.raise_if_terminating()  # a SIGTERM whose first raise some code swallowed: no new call starts
        self._refuse_unusable()
        started = time.perf_counter()
        self.calls += 1
        server = caller.synced_server()  # the trainer's own server, kept on its weights; else vllm_base_url's
        if server is None and self._vllm_base_url is None:
            raise ConfigError(
                "RolloutOptions(worker_processes>1) plays episodes in other processes, which generate "
                "on a vLLM server: pass vllm_base_url=... or train with GRPOConfig(use_vllm=True, "
                "vllm_mode='server')."
            )
        size = caller.config.num_generations
        groups = -(-len(prompts) // size)
        bounds = shard_bounds(groups, size, len(prompts), len(self._shards))
        config = None if caller.config == self._sent else caller.config
        first = self._group_numbers.first(caller, groups)
        unsent = set()
        for k, ((start, end), (_, pipe)) in enumerate(zip(bounds, self._shards)):
            try:
                pipe.send(
                    (list(prompts[start:end]), config, caller.step, server, caller.model_name, first + start // size)
                )
                self._in_call.add(k)
            except (BrokenPipeError, ConnectionResetError):  # the shard process is gone: said below
                unsent.add(k)
        self._sent = caller.config
        outputs, metrics, errors = [], [], []
        for k, ((start, end), (process, pipe)) in enumerate(zip(bounds, self._shards)):  # read every answer
            try:
                if k in unsent:
                    raise EOFError
                status, value, shard_metrics = pipe.recv()
                self._in_call.discard(k)  # not when the wait is interrupted: close() must know the shard is busy
            except EOFError:
                self._in_call.discard(k)
                self._sent = None
                process.join(1)
                errors.append(
                    RuntimeError(
                        f"ep_trl shard process {process.name} (pid {process.pid}) ended during a "
                        f"rollout call (exit code {process.exitcode})"
                    )
                )
                continue
            if status == "ok":
                outputs.append(value)
                metrics.append(shard_metrics)
            else:
                errors.append(value)
        if errors:
            raise errors[0]
        joined = join_metrics(metrics, [end - start for start, end in bounds], time.perf_counter() - started)
        caller.record_metrics(joined)
        return join_outputs(outputs)

    def _refuse_unusable(self) -> None:
        """A call in a forked child (the shard processes' pipes are its parent's) or after ``close()`` (no shard process
        left) is refused here, not answered with an output TRL would fail on far from the cause. (Once ep_trl has closed
        for the process's exit, ``raise_if_terminating`` refused it before, with ``ProcessExitingError``.)"""
        if os.getpid() != self._owner:
            raise RuntimeError(
                f"{self.__name__}'s shard processes belong to process {self._owner}; this process "
                f"({os.getpid()}) was forked from it and cannot use them. Make a rollout function in "
                "this process instead."
            )
        if self._closed:
            raise RuntimeError(
                f"{self.__name__} was closed (close()): its shard processes have ended. Make a new "
                "rollout function to play more episodes."
            )

    def flush_logs(self) -> None:
        """Rows are written by each shard process before it answers a call (its log writer is flushed)."""

    def close(self) -> None:
        """End the shard processes, all at once (each closes its rollout function: servers, endpoint, log rows); a
        call in flight in one is cancelled (SIGTERM), and one still running when the wait ends (``STOP_WAIT_S``, or
        what the stop grace leaves) is killed. In a forked child it ends none: they are the parent's, and the stop
        message would go down the pipes the child shares with it."""
        if os.getpid() != self._owner:
            logger.debug("not stopping process %d's shard processes from its child %d", self._owner, os.getpid())
            return
        self._closed = True
        shutdown.unregister(self)
        for process, pipe in self._shards:
            try:
                pipe.send(None)
            except (BrokenPipeError, OSError):  # already gone
                pass
        for k in sorted(self._in_call):  # the stop message waits behind the call: cancel it as a SIGTERM does
            process, pipe = self._shards[k]
            if process.is_alive() and not _answered(pipe):
                process.terminate()
        wait = _stop_wait_s()
        deadline = time.monotonic() + wait
        for process, _ in self._shards:  # together: one deadline for all
            process.join(max(0.0, deadline - time.monotonic()))
        for process, _ in self._shards:
            if process.is_alive():
                logger.warning("ep_trl shard process %s did not stop within %.1f s; killing it", process.name, wait)
                process.kill()
                process.join(5)
        for _, pipe in self._shards:
            pipe.close()
        self._shards = []
        self._in_call.clear()

    def disown_shards(self) -> None:
        """Called in a child that ``os.fork`` made from this function's process (``_disown_parents_shards``): take
        the shard processes off the child's list of ``multiprocessing`` children, where its exit handler would terminate
        them. The list has no public API; ``tests/adapters/test_sharded.py`` pins that a forked child leaves them
        alone."""
        for process, _ in self._shards:
            multiprocessing.process._children.discard(process)  # type: ignore[attr-defined]


_live: "weakref.WeakSet[ShardedRolloutFunction]" = weakref.WeakSet()


def _answered(pipe: "Connection") -> bool:
    """Whether a shard's answer waits unread in ``pipe``: the shard has ended its call and reads the stop message."""
    try:
        return pipe.poll()
    except (OSError, EOFError):  # the shard is gone
        return True


def _stop_wait_s() -> float:
    """How long ``close()`` waits for the shard processes: ``STOP_WAIT_S``, and after a SIGTERM what the stop grace
    leaves less ``shutdown.CLOSE_RESERVE_S`` (for the trainer's own exit), or half of it when less is left."""
    left = shutdown.seconds_left()
    if left is None:
        return STOP_WAIT_S
    return min(STOP_WAIT_S, max(left - shutdown.CLOSE_RESERVE_S, left / 2))


def _disown_parents_shards() -> None:
    """After ``fork``, in the child: the shard processes are the parent's. A child that ``os.fork`` made (not
    ``multiprocessing``, which starts its children with none) still lists them among its own children, and
    ``multiprocessing``'s exit handler would terminate them (they are daemons) when the child exits."""
    for function in list(_live):
        function.disown_shards()


os.register_at_fork(after_in_child=_disown_parents_shards)


def _serve(pipe: "Connection", build: Build, env_path: str, factory_kwargs: dict[str, Any], parent: int) -> NoReturn:
    """A shard process: :func:`_play`, then its exit handlers and ``os._exit``. Its rollout function is closed by then
    (servers, sessions, log rows), and the interpreter's teardown (seconds for a process that loaded torch, several
    times that on a loaded machine) would only hold up the trainer's ``close()``, which waits for the shard to end."""
    status = 1
    try:
        _play(pipe, build, env_path, factory_kwargs, parent)
        status = 0
    except SystemExit as stop:  # Terminated: a SIGTERM cancelled the call (the trainer's close, or the trainer gone)
        status = stop.code if isinstance(stop.code, int) else 1
    except BaseException:  # printed as multiprocessing would have printed it
        traceback.print_exc()
    finally:
        _exit(status)


def _exit(status: int) -> NoReturn:
    try:
        atexit._run_exitfuncs()  # ep_trl's close at exit, multiprocessing's, the eval's own
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed stream: nothing left to flush there
                continue
        os._exit(status)


def _play(pipe: "Connection", build: Build, env_path: str, factory_kwargs: dict[str, Any], parent: int) -> None:
    """One rollout function, one call at a time from the pipe, until ``None``, the pipe's end or a SIGTERM."""
    threading.Thread(target=_end_with_parent, args=(parent,), name="ep-trl-parent-watch", daemon=True).start()
    options = factory_kwargs.pop("options", None) or RolloutOptions()
    rollout = build(env_path, options=RolloutOptions(**{**vars(options), "worker_processes": 1}), **factory_kwargs)
    assert isinstance(rollout, ShardRollout), "with worker_processes=1 the factory builds one process's function"
    config: TrainingConfig | None = None
    try:
        while True:
            try:
                job = pipe.recv()
            except EOFError:  # the trainer is gone
                return
            if job is None:
                return
            prompts, new_config, step, server, model_name, first_group = job
            config = new_config or config
            assert config is not None, "the first call carries the trainer's configuration"
            got: dict[str, float] = {}
            caller = DetachedCaller(config, step, server, got.update, model_name=model_name)
            try:
                out = rollout.run(prompts, caller, first_group=first_group)
                rollout.flush_logs()
                pipe.send(("ok", out, got))
            except Exception as exc:  # the trainer raises it: as it would have in one process
                pipe.send(("error", _portable(exc), got))
    finally:
        rollout.close()


def _portable(exc: Exception) -> Exception:
    """``exc`` if it survives pickling, else a RuntimeError that says what it was."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # any exception type may fail to pickle or unpickle in its own way
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _end_with_parent(parent: int) -> None:
    """When the trainer is gone, end this shard process as a SIGTERM does (the call in flight cancelled, the rollout
    function closed, its log rows written); if nothing did within the stop grace, exit. The watchdogs end this shard
    process's servers with it."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(shutdown.current_grace_s() + PARENT_CHECK_S)
    os._exit(1)
