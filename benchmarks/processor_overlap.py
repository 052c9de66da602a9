"""Processor evals: do episodes overlap? An MCP agent eval with a slow tool, at several concurrency levels.

The calculator agent eval (``tests/evals/eval_calculator_agent.py``, ``AgentRolloutProcessor`` unchanged) runs
against the calculator MCP server with every tool call taking ``--tool-latency-s``; the model is the tiny model
taught the eval's two tool calls (``tests/support/tool_model.py``), generating in process. Each episode makes two
tool calls and three model calls. For each ``max_concurrent_rollouts`` the benchmark times ``--repeats`` rollout
calls of ``--episodes`` episodes and prints episodes/s, the speed-up over one at a time, and the bound the tool
latency alone sets (``concurrency / (2 * latency)``).

    python benchmarks/processor_overlap.py --episodes 8 --concurrency 1 2 4 8 --tool-latency-s 0.2
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("DISABLE_EP_SQLITE_LOG", "1")

from ep_trl.devtools import run_record  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--tool-latency-s", type=float, default=0.2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    parser.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="no warm-up call before the timed ones (for smoke runs: the first call's set-up is timed)",
    )
    args = parser.parse_args()
    record = run_record.start(REPO)

    from ep_trl import EvalOverrides, create_openenv_vllm_rollout_func, dataset_from_eval
    from ep_trl.devtools.tiny_model import build_tiny_model
    from ep_trl.runtime.processes import free_port, start_server
    from tests.support import tool_model
    from tests.support.trainers import make_trainer

    work = Path(tempfile.mkdtemp(prefix="ep_trl_overlap_"))
    port = free_port()
    server = start_server(
        "calc-mcp",
        [sys.executable, str(REPO / "tests/fixtures/calc_mcp_server.py"), str(port)],
        port=port,
        log_dir=work,
        cwd=REPO,
        env={"CALC_LATENCY_S": str(args.tool_latency_s)},
    )
    config = work / "calc_mcp.json"
    config.write_text(json.dumps({"mcpServers": {"calc": {"url": f"{server.base_url}/mcp"}}}))
    os.environ["CALC_MCP_CONFIG"] = str(config)
    results = []
    try:
        from tests.evals.eval_calculator_agent import SYSTEM

        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is (1 + 2) + (3 + 4)?"}]
        model_dir = tool_model.build_tool_model(
            build_tiny_model(work / "tiny", seed=0),
            work / "tool_model",
            messages,
            tool_model.mcp_tools(server.base_url),
            tool_result=lambda r: json.dumps({"result": int(r)}),
        )
        eval_path = "tests.evals.eval_calculator_agent"
        prompts = list(dataset_from_eval(eval_path)["prompt"]) * args.episodes
        for concurrency in args.concurrency:
            rollout = create_openenv_vllm_rollout_func(
                eval_path, log_rollouts=False, overrides=EvalOverrides(max_concurrent_rollouts=concurrency)
            )
            trainer = make_trainer(
                model_dir,
                work / "out",
                rollout,
                num_generations=args.episodes,
                batch_size=args.episodes,
                max_completion_length=400,
                prompts=prompts,
                temperature=0.5,
            )
            try:
                if args.warm_up:
                    rollout(prompts, trainer)  # warm-up: MCP connections, first generate
                times = []
                for _ in range(args.repeats):
                    started = time.perf_counter()
                    out = rollout(prompts, trainer)
                    times.append(time.perf_counter() - started)
                    if out["num_turns"] != [3] * args.episodes:
                        raise RuntimeError(f"episodes did not play the eval's tool loop: {out['num_turns']}")
            finally:
                rollout.close()
            median = statistics.median(times)
            results.append(
                {
                    "concurrency": concurrency,
                    "episodes_per_s": args.episodes / median,
                    "median_call_s": median,
                    "tool_bound_episodes_per_s": concurrency / (2 * args.tool_latency_s)
                    if args.tool_latency_s
                    else None,
                }
            )
    finally:
        server.stop()
    base = results[0]["episodes_per_s"]
    print(f"{'concurrency':>11} {'episodes/s':>10} {'speed-up':>8} {'tool bound':>10}")
    for r in results:
        bound = f"{r['tool_bound_episodes_per_s']:.2f}" if r["tool_bound_episodes_per_s"] else "-"
        print(f"{r['concurrency']:>11} {r['episodes_per_s']:>10.2f} {r['episodes_per_s'] / base:>7.2f}x {bound:>10}")
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "run": run_record.finish(record),
                    "args": {k: str(v) for k, v in vars(args).items()},
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
