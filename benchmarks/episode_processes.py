"""What one agent episode costs in processes, memory and start-up when its MCP server is a stdio server.

    python benchmarks/episode_processes.py --concurrency 64 --episodes 64

The calculator agent eval (``AgentRolloutProcessor`` unchanged) with its MCP server over stdio
(``python tests/fixtures/calc_mcp_server.py stdio``, started by the processor once per row, each under ep_trl's
watchdog ``guard.py``), generation by the stand-in server of ``bridge_ceiling.py`` (so only the processes of the
episodes are measured). While a rollout call of ``--episodes`` episodes runs, a sampler reads this process's
descendants every ``--sample-s``: how many there are of each kind (watchdog, MCP server, other) and their resident
memory (RSS). Printed: the peak of each, per episode; the CPU the children used (``os.times``, all of them, after
they were waited for) per episode; and the wall time per episode of the same call with the MCP server over HTTP
(one shared server) beside it at concurrency 1, whose difference is the stdio server's start-up as an episode
sees it.
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bridge_ceiling as ceiling  # noqa: E402  (sets HOME and the repo path first)
import psutil  # noqa: E402

from ep_trl.devtools import run_record  # noqa: E402

KINDS = {"watchdog": "guard.py", "mcp server": "calc_mcp_server.py"}


class Sampler:
    """Peak count and RSS of this process's descendants, by kind, while running."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self.peak: dict[str, dict[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def __enter__(self) -> "Sampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            seen: dict[str, dict[str, float]] = {}
            for child in me.children(recursive=True):
                try:
                    cmd = " ".join(child.cmdline())
                    rss = child.memory_info().rss
                except psutil.Error:  # ended between the listing and the read
                    continue
                kind = next((k for k, marker in KINDS.items() if marker in cmd), None)
                if kind is None:
                    continue
                entry = seen.setdefault(kind, {"processes": 0, "rss_mb": 0.0})
                entry["processes"] += 1
                entry["rss_mb"] += rss / 2**20
            for kind, entry in seen.items():
                peak = self.peak.setdefault(kind, {"processes": 0, "rss_mb": 0.0})
                for field in entry:
                    peak[field] = max(peak[field], entry[field])
            self._stop.wait(self.every_s)


def guard_cost(runs: int) -> dict[str, float]:
    """What the watchdog adds to a process start: ``true`` run ``runs`` times alone and under ``guard.py`` (as
    ``ep_trl.runtime.processes.guarded`` wraps a command), children's CPU (user + sys) and wall per run, medians."""
    import subprocess

    from ep_trl.runtime.processes import guarded

    def per_run(cmd: list[str]) -> tuple[float, float]:
        cpu, wall = [], []
        for _ in range(runs):
            before, started = os.times(), time.perf_counter()
            subprocess.run(cmd, check=True)
            after = os.times()
            wall.append(time.perf_counter() - started)
            cpu.append(after.children_user + after.children_system - before.children_user - before.children_system)
        return statistics.median(cpu) * 1000, statistics.median(wall) * 1000

    bare_cpu, bare_wall = per_run(["true"])
    guard_cpu, guard_wall = per_run(guarded(["true"]))
    return {
        "runs": runs,
        "true_cpu_ms": bare_cpu,
        "true_wall_ms": bare_wall,
        "guarded_cpu_ms": guard_cpu,
        "guarded_wall_ms": guard_wall,
        "guard_cpu_ms": guard_cpu - bare_cpu,
        "guard_wall_ms": guard_wall - bare_wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--sample-s", type=float, default=0.1)
    parser.add_argument("--guard-runs", type=int, default=20, help="runs of `true` with and without the watchdog")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    record = run_record.start(ceiling.REPO)
    from ep_trl import EvalOverrides, create_openenv_vllm_rollout_func

    results: dict[str, Any] = {"guard": guard_cost(args.guard_runs)}
    print(json.dumps({"guard": results["guard"]}), flush=True)
    with tempfile.TemporaryDirectory(prefix="ep-trl-procs-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        model_dir = ceiling.tool_model_dir(work)
        urls = ceiling.start_servers(stack, work, model_dir)
        stdio = work / "calc_stdio.json"
        stdio.write_text(
            json.dumps(
                {
                    "mcpServers": {
                        "calc": {
                            "command": sys.executable,
                            "args": [str(ceiling.REPO / "tests/fixtures/calc_mcp_server.py"), "stdio"],
                        }
                    }
                }
            )
        )
        from tests.support.trainers import make_trainer

        trainer = None
        for transport, config in (("http", urls["calc_config"]), ("stdio", str(stdio))):
            os.environ["CALC_MCP_CONFIG"] = config
            sys.modules.pop("tests.evals.eval_calculator_agent", None)  # it reads the config path at import
            for concurrency in sorted({1, args.concurrency}):
                rollout = create_openenv_vllm_rollout_func(
                    ceiling.EVALS["agent"],
                    vllm_base_url=urls["vllm"],
                    log_rollouts=False,
                    overrides=EvalOverrides(max_concurrent_rollouts=concurrency),
                )
                stack.callback(rollout.close)
                if trainer is None:
                    trainer = make_trainer(
                        model_dir, work / "trainer", rollout, num_generations=4, max_completion_length=4096
                    )
                episodes = args.episodes if concurrency > 1 else min(8, args.episodes)
                prompts = ceiling.prompts_for("agent", episodes)
                ceiling.timed_call(rollout, trainer, "agent", 3, prompts[:4], urls["vllm"])  # warm-up
                children0 = os.times()
                with Sampler(args.sample_s) as sampler:
                    timing = ceiling.timed_call(rollout, trainer, "agent", 3, prompts, urls["vllm"])
                children1 = os.times()
                child_cpu = (
                    children1.children_user
                    + children1.children_system
                    - children0.children_user
                    - children0.children_system
                )
                row = {
                    "transport": transport,
                    "concurrency": concurrency,
                    "episodes": episodes,
                    "wall_s_per_episode": timing["wall_s"] / episodes,
                    "trainer_cpu_ms_per_episode": timing["cpu_ms_per_episode"],
                    "children_cpu_ms_per_episode": child_cpu * 1000 / episodes,
                    "peak": sampler.peak,
                }
                results.setdefault("runs", []).append(row)
                print(json.dumps(row), flush=True)
    for row in results["runs"]:
        peaks = (
            ", ".join(
                f"{kind}: {p['processes']} processes, {p['rss_mb']:.0f} MB" for kind, p in sorted(row["peak"].items())
            )
            or "no child processes"
        )
        print(
            f"{row['transport']:5s} c={row['concurrency']:3d}: {row['wall_s_per_episode'] * 1000:7.1f} ms "
            "wall/episode, "
            f"trainer CPU {row['trainer_cpu_ms_per_episode']:6.1f} ms/episode, children CPU "
            f"{row['children_cpu_ms_per_episode']:7.1f} ms/episode; peak {peaks}"
        )
    if args.out:
        args.out.write_text(json.dumps({"run": run_record.finish(record), **results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
