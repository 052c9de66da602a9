"""The bridge at a GPU's concurrency: episodes/s and ep_trl's own CPU per turn at 16, 64 and 256 episodes in flight.

    python benchmarks/bridge_concurrency.py --out benchmarks/results/bridge_concurrency.json          # ~15 min
    python benchmarks/bridge_concurrency.py --concurrency 2 4 --processes 1 --episodes 8 --seconds 0 --repeats 1

Generation is ``benchmarks/fixtures/instant_vllm.py`` with ``--per-token-s``: a stand-in completions server in its
own process that answers each request after a fixed time per sampled token, sleeping asynchronously, so requests in
flight overlap as a GPU server's batch does and the server spends no CPU "generating". The scripted reply is
``--reply`` (a few tokens), and the delay per token is set so that a turn takes ``--turn-ms`` (default 20 ms, a turn of
~8 tokens on a GPU). The environment is ``--env-replicas`` copies of the letters server (``python -m
ep_trl.envs.letters --port {port}``, started by ``ep_trl.cli.replicas.Replicas``) with no step latency and room for
every session (``LETTERS_MAX_SESSIONS``), spread by ``EvalOverrides(env_replicas=..., env_url_var=...)``.

Each point is the letters eval (``tests.evals.eval_letters``, ``--turns`` steps per episode) played by
``create_openenv_vllm_rollout_func`` called as GRPOTrainer calls it (with a CPU stand-in trainer, as
``benchmarks/bridge_ceiling.py`` does), at ``c`` episodes in flight:

* ``--processes 1``: one trainer process plays them (``max_concurrent_rollouts=c``);
* ``--processes N`` (N > 1): shard processes (``RolloutOptions(worker_processes=N)``), each playing ``c / N`` at once.

Measured per point: episodes/s and turns/s over its timed calls (wall), and ep_trl's own CPU per turn: the CPU time
(user + sys, all threads) of the trainer process plus, with shards, of each shard process (``psutil``), never the
servers' (other processes). ``peak_in_flight`` is the most turns the stand-in server held at once in a call (it
shows the episodes really were in flight). Each point runs one warm-up call, then calls of ``max(--episodes, 2 x c)``
episodes until ``--seconds`` of wall have passed (at least one), in ``--repeats`` rounds interleaved across the
points, so load from elsewhere hits every point alike. ``cpu_over_c_first`` divides a point's CPU per turn by that of
the smallest ``c`` with the same processes: the figure the bridge keeps at or below 1.5 at c256.

Also measured, to show where the machine saturates: the stand-in server's and the environment replicas' CPU per
turn (their processes and descendants, ``psutil``), all processes' cores busy, and the trainer process's CPU per
turn by thread (the event loop ``ep-trl-rollouts``, the ep logs writer ``ep-trl-rollout-log``, the pooled threads of
blocking calls), from the kernel's per-thread counters.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bridge_ceiling as ceiling  # noqa: E402  (sets HOME and the repo path first)

from ep_trl.devtools import run_record  # noqa: E402

EVAL = "tests.evals.eval_letters::test_letters_pointwise"
#: The letters server, as ``--env-server`` names it (``Replicas`` fills in the port).
LETTERS_SERVER = "python -m ep_trl.envs.letters --host 127.0.0.1 --port {port}"
#: Prompts per group, as the stand-in trainer's ``num_generations``: a shard holds whole groups.
GROUP = 4


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64, 256], help="episodes in flight")
    parser.add_argument(
        "--processes", type=int, nargs="+", default=[1, 2, 4], help="1: the trainer process; N: N shard processes"
    )
    parser.add_argument("--turns", type=int, default=5, help="environment steps (model turns) per episode")
    parser.add_argument("--episodes", type=int, default=128, help="episodes per call (at least 2 x concurrency)")
    parser.add_argument("--seconds", type=float, default=10.0, help="timed wall per point and round (>= 1 call)")
    parser.add_argument("--repeats", type=int, default=2, help="rounds, interleaved across the points")
    parser.add_argument("--turn-ms", type=float, default=20.0, help="the stand-in server's time per turn")
    parser.add_argument("--reply", default="a e i o u a e", help="what the stand-in server samples each turn")
    parser.add_argument("--env-replicas", type=int, default=4, help="letters servers the sessions spread over")
    parser.add_argument("--logs", choices=["on", "off"], default="on", help="ep logs rows (on: the default)")
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


@dataclass
class Point:
    """One (processes, concurrency): its rollout function and what its timed calls added up to."""

    processes: int
    concurrency: int
    rollout: Any
    prompts: list[str]
    calls: list[dict[str, Any]] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        wall = sum(c["wall_s"] for c in self.calls)
        cpu = sum(c["cpu_s"] for c in self.calls)
        turns = sum(c["turns"] for c in self.calls)
        episodes = sum(c["episodes"] for c in self.calls)
        threads: dict[str, float] = {}
        for call in self.calls:
            for kind, spent in call["trainer_threads_cpu_s"].items():
                threads[kind] = threads.get(kind, 0.0) + spent
        gen = sum(c["generation_server_cpu_s"] for c in self.calls)
        env = sum(c["environment_servers_cpu_s"] for c in self.calls)
        return {
            "processes": self.processes,
            "concurrency": self.concurrency,
            "calls": len(self.calls),
            "episodes": episodes,
            "turns": turns,
            "wall_s": wall,
            "cpu_s": cpu,
            "episodes_per_s": episodes / wall,
            "turns_per_s": turns / wall,
            "cpu_ms_per_turn": cpu * 1000 / turns,
            "cpu_cores_busy": cpu / wall,
            "generation_server_cpu_ms_per_turn": gen * 1000 / turns,
            "environment_servers_cpu_ms_per_turn": env * 1000 / turns,
            "all_processes_cores_busy": (cpu + gen + env) / wall,
            "peak_in_flight": max(c["peak_in_flight"] for c in self.calls),
            "trainer_threads_cpu_ms_per_turn": {k: v * 1000 / turns for k, v in sorted(threads.items())},
        }


def turn_tokens(model_dir: Path, reply: str) -> int:
    """Tokens the stand-in server samples per turn: the reply and the end-of-turn token."""
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(model_dir).encode(reply, add_special_tokens=False)) + 1


def start_generation(stack: ExitStack, work: Path, model_dir: Path, reply: str, per_token_s: float) -> Any:
    """The stand-in server answering ``reply`` after ``per_token_s`` per token; stopped at exit."""
    from ep_trl.runtime.processes import free_port, start_server

    port = free_port()
    cmd = [
        sys.executable,
        str(ceiling.REPO / "benchmarks/fixtures/instant_vllm.py"),
        "--model-dir",
        str(model_dir),
        "--port",
        str(port),
        "--reply",
        reply,
        "--per-token-s",
        str(per_token_s),
    ]
    server = start_server("instant-vllm", cmd, port=port, log_dir=work, cwd=ceiling.REPO)
    stack.callback(server.stop)
    return server


def build(processes: int, concurrency: int, turns: int, logs: str, vllm: str, replicas: list[str]) -> Any:
    from ep_trl import EvalOverrides, RolloutOptions, create_openenv_vllm_rollout_func
    from tests.support.letters import LETTERS_ENV_URL_VAR

    if concurrency % processes:
        raise SystemExit(f"--concurrency {concurrency} does not split over {processes} processes")
    overrides = EvalOverrides(
        max_concurrent_rollouts=concurrency // processes,
        max_steps=turns,
        env_replicas=replicas if len(replicas) > 1 else None,
        env_url_var=LETTERS_ENV_URL_VAR if len(replicas) > 1 else None,
    )
    return create_openenv_vllm_rollout_func(
        EVAL,
        vllm_base_url=vllm,
        log_rollouts=logs == "on",
        overrides=overrides,
        options=RolloutOptions(worker_processes=processes),
    )


def thread_kind(name: str) -> str:
    """A thread's kind, from its name: ep_trl's pooled threads (named ``ep-trl <the call it runs>``, or
    ``ep-trl idle pooled thread``) as one, others by name less a trailing number."""
    import re

    from ep_trl.runtime.threads import IDLE_NAME

    if name == IDLE_NAME or (name.startswith("ep-trl ") and "MCP" not in name):
        return "ep-trl pooled threads (blocking calls)"
    return re.sub(r"[-_ ]?\(?\d+\)?$", "", name)


def thread_cpu() -> dict[int, tuple[str, float]]:
    """This process's threads' CPU seconds (user + sys) by native id, with each thread's kind (:func:`thread_kind`)."""
    import threading

    import psutil

    names = {t.native_id: t.name for t in threading.enumerate()}
    return {
        t.id: (thread_kind(names.get(t.id, "not a Python thread")), t.user_time + t.system_time)
        for t in psutil.Process().threads()
    }


def by_kind(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each kind of thread spent between two :func:`thread_cpu` readings (a thread that ended in
    between is not counted; one that started counts from zero)."""
    spent: dict[str, float] = {}
    for tid, (kind, cpu) in after.items():
        spent[kind] = spent.get(kind, 0.0) + cpu - before.get(tid, (kind, 0.0))[1]
    return spent


def tree_cpu(pids: list[int]) -> float:
    """CPU seconds (user + sys) of the processes ``pids`` and their descendants (a server runs under ep_trl's
    watchdog, its child); one that ended is not counted."""
    import psutil

    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            for process in [root, *root.children(recursive=True)]:
                times = process.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            continue
    return total


@dataclass(frozen=True)
class Servers:
    """The stand-in generation server's URL, and the processes of it and of the environment replicas."""

    vllm: str
    generation_pids: list[int]
    environment_pids: list[int]


def timed_call(point: Point, trainer: Any, turns: int, servers: Servers, prompts: list[str] | None = None) -> dict:
    """One rollout call of ``point`` (its prompts unless given), checked to have played every turn; its figures."""
    prompts = point.prompts if prompts is None else prompts
    vllm = servers.vllm
    ceiling.served(vllm)  # starts the server's peak afresh
    gen0, env0 = tree_cpu(servers.generation_pids), tree_cpu(servers.environment_pids)
    threads0, cpu0, wall0 = thread_cpu(), ceiling.cpu_seconds(point.rollout), time.perf_counter()
    out = point.rollout(prompts, trainer)
    point.rollout.flush_logs()
    wall, cpu = time.perf_counter() - wall0, ceiling.cpu_seconds(point.rollout) - cpu0
    threads = by_kind(threads0, thread_cpu())
    gen, env = tree_cpu(servers.generation_pids) - gen0, tree_cpu(servers.environment_pids) - env0
    peak = ceiling.served(vllm)["peak_in_flight"]
    played = sum(out["num_turns"])
    if out["episode_status"] != ["finished"] * len(prompts) or played != turns * len(prompts):
        raise RuntimeError(
            f"c={point.concurrency}, {point.processes} processes: {played} turns played (want "
            f"{turns * len(prompts)}), statuses {sorted(set(out['episode_status']))}"
        )
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "episodes": len(prompts),
        "turns": played,
        "peak_in_flight": peak,
        "trainer_threads_cpu_s": threads,
        "generation_server_cpu_s": gen,
        "environment_servers_cpu_s": env,
    }


def main() -> None:
    args = parse_args()
    record = run_record.start(ceiling.REPO)
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from ep_trl.cli.replicas import Replicas

    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="ep-trl-concurrency-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        model_dir = ceiling.tool_model_dir(work)
        tokens = turn_tokens(model_dir, args.reply)
        per_token_s = args.turn_ms / 1000 / tokens
        generation = start_generation(stack, work, model_dir, args.reply, per_token_s)
        sessions = 2 * max(args.concurrency)  # room for a call's sessions while the last call's still close
        replicas = Replicas(
            LETTERS_SERVER,
            args.env_replicas,
            env={"LETTERS_STEP_LATENCY_S": "0", "LETTERS_MAX_STEPS": "100", "LETTERS_MAX_SESSIONS": str(sessions)},
        )
        stack.callback(replicas.close)
        urls = list(replicas.urls)
        servers = Servers(generation.base_url, [generation.pid], list(replicas.pids))
        os.environ["LETTERS_ENV_URL"] = urls[0]  # the eval's factory reads it; replicas set it per session
        from tests.support.trainers import make_trainer

        trainer = None
        for processes in args.processes:
            for c in args.concurrency:
                rollout = build(processes, c, args.turns, args.logs, servers.vllm, urls)
                stack.callback(rollout.close)
                if trainer is None:
                    trainer = make_trainer(
                        model_dir, work / "trainer", rollout, num_generations=GROUP, max_completion_length=4096
                    )
                episodes = -(-max(args.episodes, 2 * c) // (GROUP * processes)) * GROUP * processes
                point = Point(processes, c, rollout, ["Play the letters game."] * episodes)
                timed_call(point, trainer, args.turns, servers, point.prompts[: max(GROUP * processes, c)])  # warm-up
                points.append(point)
        runs = []
        for repeat in range(args.repeats):
            for point in points:
                started = time.perf_counter()
                while True:
                    call = timed_call(point, trainer, args.turns, servers)
                    point.calls.append(call)
                    runs.append(
                        {
                            "processes": point.processes,
                            "concurrency": point.concurrency,
                            "repeat": repeat,
                            **call,
                            "loadavg_1min": os.getloadavg()[0],
                        }
                    )
                    if time.perf_counter() - started >= args.seconds:
                        break
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in runs[-1].items()}))
    summary = summarize(points)
    print(markdown(summary))
    for row in summary:  # where the trainer process's CPU per turn went, by thread
        shares = ", ".join(f"{k} {v:.3f}" for k, v in row["trainer_threads_cpu_ms_per_turn"].items() if v >= 0.005)
        print(f"{row['processes']} process(es), c={row['concurrency']}: trainer threads, CPU ms/turn: {shares}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        settings = {
            "eval": EVAL,
            "turns": args.turns,
            "turn_ms": args.turn_ms,
            "tokens_per_turn": tokens,
            "per_token_s": per_token_s,
            "env_replicas": args.env_replicas,
            "logs": args.logs,
        }
        result = {"run": run_record.finish(record), "settings": settings, "summary": summary, "runs": runs}
        args.out.write_text(json.dumps(result, indent=1) + "\n")


def summarize(points: list[Point]) -> list[dict[str, Any]]:
    """Each point's totals over its timed calls, with its CPU per turn over the smallest concurrency's (same
    processes)."""
    rows = sorted((p.row() for p in points), key=lambda r: (r["processes"], r["concurrency"]))
    for row in rows:
        first = min((r for r in rows if r["processes"] == row["processes"]), key=lambda r: r["concurrency"])
        row["cpu_over_c_first"] = row["cpu_ms_per_turn"] / first["cpu_ms_per_turn"]
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| processes | in flight | episodes/s | turns/s | ep_trl CPU ms/turn | x smallest c | ep_trl cores busy "
        "| generation server CPU ms/turn | environment servers CPU ms/turn | all cores busy | peak turns at server |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['processes']} | {r['concurrency']} | {r['episodes_per_s']:.1f} | {r['turns_per_s']:.0f} | "
        f"{r['cpu_ms_per_turn']:.3f} | {r['cpu_over_c_first']:.2f} | {r['cpu_cores_busy']:.2f} | "
        f"{r['generation_server_cpu_ms_per_turn']:.3f} | {r['environment_servers_cpu_ms_per_turn']:.3f} | "
        f"{r['all_processes_cores_busy']:.2f} | {r['peak_in_flight']} |"
        for r in rows
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
