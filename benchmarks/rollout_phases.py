"""Where an ep_trl rollout call's time and CPU go: per-phase latencies, request batch sizes, CPU per process.

    python benchmarks/rollout_phases.py --concurrency 8                   # 3 batches of 32 episodes, 50 ms/step
    python benchmarks/rollout_phases.py --concurrency 8 --no-env-reuse    # one environment session per episode

The diagnostic behind the explanations in docs/benchmarks.md. Same setup as ``rollout_throughput.py``'s ep_trl
arm (its servers and arm are reused: tiny model, CPU vLLM server, letters server with per-step latency). Each
batch prints:

* episodes/s and mean episode wall time;
* latency of each phase as the episodes saw it: starting an episode on an environment session (``start``: an
  idle session reused or a new client, and its ``reset``), ``reset`` alone (for a new session this includes the
  WebSocket connect), ``step``,
  ``generate`` (one turn, batching window included);
* how many prompts each ``/v1/completions`` request carried;
* CPU ms per episode of every process involved (from ``/proc/<pid>/stat``): the vLLM API server, engine core and
  worker, the letters server, and this process split by thread (event loop, rollout-log writer, ...).

The phases are timed by wrapping ep_trl's methods in this process only (``EnvPool.start``, ``EnvSession.reset``
/``step``, ``VLLMServerGenerator.generate`` and its private ``_post``, the one request-level hook); nothing is
changed in what they do.
"""

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rollout_throughput as bench  # noqa: E402  (sets HOME and the repo path first)

from ep_trl.devtools import run_record  # noqa: E402
from ep_trl.generation import vllm  # noqa: E402
from ep_trl.openenv import client as environment
from ep_trl.openenv import pool as env_pool  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")
PHASES: dict[str, list[float]] = collections.defaultdict(list)
BATCH_SIZES: list[int] = []


def timed(owner: Any, name: str, phase: str) -> None:
    """Replace ``owner.name`` (an async method) by one that records its latency under ``phase``."""
    original = getattr(owner, name)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return await original(*args, **kwargs)
        finally:
            PHASES[phase].append(time.perf_counter() - started)

    setattr(owner, name, wrapper)


def count_prompts() -> None:
    original: Callable = vllm.VLLMServerGenerator._post

    async def post(self: Any, body: bytes, what: str, url: str | None = None) -> Any:
        # the body is the request's JSON; only "prompt" holds lists of lists (ids), so "],[" separates its prompts
        # (counted in C: no parse added to the CPU this process measures)
        start = body.find(b'"prompt":')
        BATCH_SIZES.append(body.count(b"],[", start) + 1 if body[start + 9 : start + 11] == b"[[" else 1)
        return await original(self, body, what, url)

    vllm.VLLMServerGenerator._post = post


def process_ids() -> dict[str, int]:
    """The vLLM server's three processes and the letters server, found by name, plus this process."""
    found: dict[str, int] = {}
    lines = subprocess.run(["ps", "-eo", "pid,comm,args"], capture_output=True, text=True).stdout.splitlines()[1:]
    for line in lines:
        pid, comm, args = line.split(None, 2)
        if comm.startswith("VLLM::Worker"):
            found["vllm worker"] = int(pid)
        elif comm.startswith("VLLM::EngineCor"):
            found["vllm engine core"] = int(pid)
        elif "vllm.entrypoints.openai.api_server" in args:
            found["vllm api server"] = int(pid)
        elif "ep_trl.envs.letters" in args:
            found["letters server"] = int(pid)
    return found


def cpu_seconds(stat_path: str) -> float:
    fields = Path(stat_path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime + stime


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    snapshot = {name: cpu_seconds(f"/proc/{pid}/stat") for name, pid in pids.items()}
    names = {t.native_id: t.name for t in threading.enumerate()}
    for tid in os.listdir("/proc/self/task"):
        name = names.get(int(tid), "other threads").split("_")[0]
        key = f"this process: {name}"
        try:
            snapshot[key] = snapshot.get(key, 0.0) + cpu_seconds(f"/proc/self/task/{tid}/stat")
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
    return snapshot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--episodes", type=int, default=32)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--env-latency-s", type=float, default=0.05)
    parser.add_argument("--batch-window-s", type=float, default=0.005)
    parser.add_argument("--no-env-reuse", action="store_true")
    parser.add_argument("--vllm-url", help="use this running server (tiny model) instead of starting one")
    parser.add_argument("--out", type=Path, default=None, help="write every batch's figures as JSON here")
    parser.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="no warm-up call before the timed ones (for smoke runs: the first call's set-up is timed)",
    )
    args = parser.parse_args()
    record = run_record.start(bench.REPO_ROOT)
    batches: list[dict[str, Any]] = []
    timed(env_pool.EnvPool, "start", "start")
    timed(environment.EnvSession, "reset", "reset")
    timed(environment.EnvSession, "step", "step")
    timed(vllm.VLLMServerGenerator, "generate", "generate")
    count_prompts()
    with (
        tempfile.TemporaryDirectory(prefix="ep-trl-phases-") as tmp,
        bench.servers(args, Path(tmp)) as (url, letters, model),
    ):
        os.environ["LETTERS_ENV_URL"] = letters
        run, close = bench.ep_trl_arm(url, model, Path(tmp), args.concurrency, args)
        pids = process_ids()
        try:
            if args.warm_up:
                run([bench.PROMPT] * min(4, args.episodes))  # warm-up
            for number in range(1, args.batches + 1):
                PHASES.clear()
                BATCH_SIZES.clear()
                before = cpu_snapshot(pids)
                result = bench.measure(run, args.episodes, url)
                after = cpu_snapshot(pids)
                print(
                    f"batch {number}: {result['episodes_per_s']:.2f} episodes/s, mean episode "
                    f"{result['mean_episode_wall_s']:.3f} s"
                )
                for phase, values in PHASES.items():
                    print(
                        f"  {phase:9s} n={len(values):3d}  median {statistics.median(values) * 1000:6.1f} ms  "
                        f"mean {statistics.mean(values) * 1000:6.1f} ms  max {max(values) * 1000:6.1f} ms"
                    )
                per_request = dict(sorted(collections.Counter(BATCH_SIZES).items()))
                cpu_ms = {
                    k: round((after[k] - before.get(k, 0.0)) * 1000 / args.episodes, 1)
                    for k in after
                    if after[k] - before.get(k, 0.0) > 0
                }
                print("  prompts per request:", per_request)
                print("  CPU ms per episode:", cpu_ms)
                batches.append(
                    {
                        "batch": number,
                        **result,
                        "prompts_per_request": per_request,
                        "cpu_ms_per_episode": cpu_ms,
                        "phases_ms": {
                            phase: {"n": len(v), "median": statistics.median(v) * 1000, "max": max(v) * 1000}
                            for phase, v in PHASES.items()
                        },
                        "loadavg_1min": os.getloadavg()[0],
                    }
                )
        finally:
            close()
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "run": run_record.finish(record),
                    "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                    "batches": batches,
                },
                indent=1,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
