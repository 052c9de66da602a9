"""The bridge's own ceiling: ep_trl's cost per turn when generation is free and the environment has no latency.

    python benchmarks/bridge_ceiling.py                                   # every arm, concurrency 1 8 64, logs on/off
    python benchmarks/bridge_ceiling.py --arms openenv chat --concurrency 8 --turns 1 2 5 10 20 --logs on
    python benchmarks/bridge_ceiling.py --arms single_turn --concurrency 8 --repeats 1 --profile  # then py-spy

Generation is ``benchmarks/fixtures/instant_vllm.py``, a stand-in completions server in its own process that
answers at once with scripted token ids and logprobs in vLLM's shape (a named fixture: on a GPU a turn costs
milliseconds, so the bridge process becomes the limit). The trainer process (this one) does everything else:
templates, the HTTP clients, the eval's processor, the capture endpoint, scoring and the ep logs writer. Its CPU time
(user + sys, all threads, ``time.process_time``) per turn is the figure to read; the servers are other processes.

Arms (``create_openenv_vllm_rollout_func(EVAL, vllm_base_url=<stand-in>)`` called as GRPOTrainer calls it):

* ``openenv``: the letters eval (``OpenEnvRolloutProcessor``), played by ep_trl's own loop against a letters server
  with no step latency; ``--turns`` sets its steps (``EvalOverrides(max_steps=...)``);
* ``single_turn``: ``tests/evals/eval_single_turn.py`` (eval-protocol's ``SingleTurnRolloutProcessor``: LiteLLM);
* ``agent``: ``tests/evals/eval_calculator_agent.py`` (``AgentRolloutProcessor`` with the calculator MCP server over
  HTTP, no latency): two tool calls and the answer, 3 turns;
* ``chat``: ``benchmarks/fixtures/eval_chat_turns.py``, a user LiteLLM processor that chats ``--turns`` turns;
* ``openenv_client``: no ep_trl and no generation: the letters eval's own environment client (its ``env_factory``'s
  OpenEnv client, driven asynchronously as ep_trl drives it, one client per slot, made per call) and its action parser,
  playing the same episodes (a reset, then ``--turns`` steps with the texts the stand-in server samples) at the same
  concurrency. Its CPU per turn is the part of the ``openenv`` arm's that belongs to the environment's client, not to
  ep_trl; the difference between the two is ep_trl's own.

Each (arm, turns, concurrency, logs) runs one warm-up call, then ``--repeats`` timed calls of ``--episodes`` episodes
(at least 2 x concurrency), interleaved across configurations. Printed per configuration: episodes/s, turns/s and
CPU ms per turn (medians); ``--out`` writes every run as JSON.
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from ep_trl.devtools import run_record  # noqa: E402

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["HOME"] = tempfile.mkdtemp(prefix="ep-trl-ceiling-home-")  # ep logs rows go under $HOME/.eval_protocol

EVALS = {
    "openenv": "tests.evals.eval_letters::test_letters_pointwise",
    "single_turn": "tests.evals.eval_single_turn::test_single_turn",
    "agent": "tests.evals.eval_calculator_agent::test_calculator_agent",
    "chat": "benchmarks.fixtures.eval_chat_turns::test_chat_turns",
}
#: The environment client alone (no rollout function): see the module docstring.
CLIENT_ARM = "openenv_client"
#: Arms whose number of turns --turns sets; the others play their eval's own turns.
TURNED = {"openenv", "chat", CLIENT_ARM}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arms", nargs="+", default=list(EVALS), choices=[*EVALS, CLIENT_ARM])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--turns", type=int, nargs="+", default=[3], help="turns per episode (openenv, chat)")
    parser.add_argument("--logs", nargs="+", default=["on", "off"], choices=["on", "off"], help="ep logs rows")
    parser.add_argument("--episodes", type=int, default=64, help="episodes per call (at least 2 x concurrency)")
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1],
        help="RolloutOptions(worker_processes=...): CPU then counts the workers' too",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="print this process's pid and wait 5 s before timing")
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def tool_model_dir(work: Path) -> Path:
    """The tiny model with TRL's Qwen 2.5 chat template (ChatML, tool calls in <tool_call> blocks TRL parses)."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from ep_trl.devtools.tiny_model import build_tiny_model

    tiny = build_tiny_model(work / "tiny", seed=0)
    out = work / "tiny_tools"
    shutil.copytree(tiny, out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.save_pretrained(out)
    return out


def scripted_replies() -> list[str]:
    """What the stand-in server samples, turn by turn (the last one repeats): two calculator tool calls, the answer."""
    from tests.support.tool_model import ANSWER, CALLS, tool_call_text

    return [tool_call_text(CALLS[0]), tool_call_text(CALLS[1]), ANSWER]


def start_servers(stack: ExitStack, work: Path, model_dir: Path) -> dict[str, str]:
    """The stand-in generation server, a letters server and a calculator MCP server, each stopped by PID at exit."""
    from ep_trl.runtime.processes import free_port, start_server
    from tests.support.letters import start_letters_server

    port = free_port()
    replies = scripted_replies()
    cmd = [
        sys.executable,
        str(REPO / "benchmarks/fixtures/instant_vllm.py"),
        "--model-dir",
        str(model_dir),
        "--port",
        str(port),
    ] + [a for r in replies for a in ("--reply", r)]
    instant = start_server("instant-vllm", cmd, port=port, log_dir=work, cwd=REPO)
    stack.callback(instant.stop)
    letters = start_letters_server(work, env={"LETTERS_STEP_LATENCY_S": "0", "LETTERS_MAX_STEPS": "100"})
    stack.callback(letters.stop)
    port = free_port()
    calc = start_server(
        "calc-mcp",
        [sys.executable, str(REPO / "tests/fixtures/calc_mcp_server.py"), str(port)],
        port=port,
        log_dir=work,
        cwd=REPO,
        env={"CALC_LATENCY_S": "0"},
    )
    stack.callback(calc.stop)
    config = work / "calc_mcp.json"
    config.write_text(json.dumps({"mcpServers": {"calc": {"url": f"{calc.base_url}/mcp"}}}))
    return {"vllm": instant.base_url, "letters": letters.base_url, "calc_config": str(config)}


def prompts_for(arm: str, episodes: int) -> list[Any]:
    from ep_trl import dataset_from_eval

    if arm in ("openenv", CLIENT_ARM):
        return ["Play the letters game."] * episodes
    base = list(dataset_from_eval(EVALS[arm])["prompt"])
    return (base * episodes)[:episodes]


def expected_turns(arm: str, turns: int) -> int:
    return turns if arm in TURNED else {"single_turn": 1, "agent": 3}[arm]


class EnvClientAlone:
    """The ``openenv_client`` arm: the letters eval's environment client and action parser playing the episodes of a
    call, ``concurrency`` clients at once, without ep_trl; called like a rollout function. As ep_trl's sessions, the
    clients are made and connected per call, reused across the call's episodes and closed at its end."""

    def __init__(self, turns: int, concurrency: int) -> None:
        from tests.evals import letters_parts

        self.turns, self.concurrency, self.parts = turns, concurrency, letters_parts

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        import asyncio

        return asyncio.run(self._play(len(prompts)))

    async def _play(self, episodes: int) -> dict[str, list[Any]]:
        import asyncio

        factory = self.parts.make_env_factory()
        clients = [getattr(c, "async_client", c) for c in (factory() for _ in range(min(self.concurrency, episodes)))]
        replies = scripted_replies()
        texts = [replies[min(k, len(replies) - 1)] for k in range(self.turns)]
        left = iter(range(episodes))
        played: list[int] = []

        async def slot(client: Any) -> None:
            for _ in left:
                await client.reset()
                for text in texts:
                    await client.step(self.parts.action_parser(text))
                played.append(len(texts))

        try:
            await asyncio.gather(*(slot(c) for c in clients))
        finally:
            for client in clients:
                await client.close()
        return {"episode_status": ["finished"] * len(played), "num_turns": played}

    def flush_logs(self) -> None:
        """No rows: there is no rollout function."""

    def close(self) -> None:
        """Nothing is kept between calls."""


def build(arm: str, turns: int, concurrency: int, logs: str, url: str, workers: int = 1) -> Any:
    from ep_trl import EvalOverrides, RolloutOptions, create_openenv_vllm_rollout_func

    if arm == CLIENT_ARM:
        return EnvClientAlone(turns, concurrency)

    overrides = EvalOverrides(max_concurrent_rollouts=concurrency, max_steps=turns if arm == "openenv" else None)
    return create_openenv_vllm_rollout_func(
        EVALS[arm],
        vllm_base_url=url,
        log_rollouts=logs == "on",
        overrides=overrides,
        options=RolloutOptions(worker_processes=workers),
    )


def cpu_seconds(rollout: Any) -> float:
    """This process's CPU time, plus that of the rollout function's shard processes if it has any
    (``ShardedRolloutFunction._shards``: ``(process, pipe)`` pairs)."""
    import psutil

    total = time.process_time()
    for process, _ in getattr(rollout, "_shards", ()):
        times = psutil.Process(process.pid).cpu_times()
        total += times.user + times.system
    return total


def served(url: str) -> dict[str, int]:
    """The stand-in server's counts so far: prompts answered and requests that carried them."""
    import httpx

    return httpx.get(f"{url}/stats").json()


def timed_call(rollout: Any, trainer: Any, arm: str, turns: int, prompts: list[Any], url: str) -> dict[str, float]:
    if arm == "chat":
        os.environ["BRIDGE_TURNS"] = str(turns)
    before = served(url)
    cpu0, wall0 = cpu_seconds(rollout), time.perf_counter()
    out = rollout(prompts, trainer)
    rollout.flush_logs()
    wall, cpu = time.perf_counter() - wall0, cpu_seconds(rollout) - cpu0
    after = served(url)
    requests = after["requests"] - before["requests"]
    played = sum(out["num_turns"])
    want = expected_turns(arm, turns) * len(prompts)
    if out["episode_status"] != ["finished"] * len(prompts) or played != want:
        raise RuntimeError(
            f"{arm}: episodes did not play as scripted: {played} turns (want {want}), "
            f"{sorted(set(out['episode_status']))}"
        )
    result = {
        "wall_s": wall,
        "cpu_s": cpu,
        "episodes_per_s": len(prompts) / wall,
        "turns_per_s": played / wall,
        "cpu_ms_per_turn": cpu * 1000 / played,
        "cpu_ms_per_episode": cpu * 1000 / len(prompts),
    }
    if requests:  # the openenv_client arm sends none
        result["turns_per_request"] = (after["prompts"] - before["prompts"]) / requests
    return result


def main() -> None:
    args = parse_args()
    record = run_record.start(REPO)
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ep-trl-ceiling-") as tmp, ExitStack() as stack:
        work = Path(tmp)
        model_dir = tool_model_dir(work)
        urls = start_servers(stack, work, model_dir)
        os.environ["LETTERS_ENV_URL"] = urls["letters"]
        os.environ["CALC_MCP_CONFIG"] = urls["calc_config"]  # read when the agent eval module is imported
        from tests.support.trainers import make_trainer

        configs = []
        trainer = None
        for arm in args.arms:
            for turns in args.turns if arm in TURNED else [expected_turns(arm, 0)]:
                for c, workers in ((c, w) for c in args.concurrency for w in args.workers):
                    for logs in ["off"] if arm == CLIENT_ARM else args.logs:
                        rollout = build(arm, turns, c, logs, urls["vllm"], workers)
                        stack.callback(rollout.close)
                        if trainer is None:
                            trainer = make_trainer(
                                model_dir,
                                work / "trainer",
                                rollout,
                                num_generations=4,
                                max_completion_length=4096,
                                temperature=1.0,
                            )
                        episodes = max(args.episodes, 2 * c)
                        prompts = prompts_for(arm, episodes)
                        timed_call(rollout, trainer, arm, turns, prompts[: min(8, episodes)], urls["vllm"])  # warm-up
                        configs.append((arm, turns, c, workers, logs, rollout, prompts))
        if args.profile:
            print(f"profile: pid {os.getpid()}", flush=True)
            time.sleep(5)
        for repeat in range(args.repeats):  # interleaved: a burst of load elsewhere hits every configuration alike
            for arm, turns, c, workers, logs, rollout, prompts in configs:
                row = {
                    "arm": arm,
                    "turns": turns,
                    "concurrency": c,
                    "workers": workers,
                    "logs": logs,
                    "episodes": len(prompts),
                    "repeat": repeat,
                    **timed_call(rollout, trainer, arm, turns, prompts, urls["vllm"]),
                    "loadavg_1min": os.getloadavg()[0],
                }
                runs.append(row)
                print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    summary = summarize(runs)
    print(markdown(summary))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"run": run_record.finish(record), "summary": summary, "runs": runs}, indent=1) + "\n"
        )


def summarize(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(r: dict[str, Any]) -> tuple:
        return r["arm"], r["turns"], r["concurrency"], r.get("workers", 1), r["logs"]

    rows = []
    for arm, turns, c, workers, logs in sorted({key(r) for r in runs}):
        mine = [r for r in runs if key(r) == (arm, turns, c, workers, logs)]
        rows.append(
            {
                "arm": arm,
                "turns": turns,
                "concurrency": c,
                "workers": workers,
                "logs": logs,
                **{
                    field: statistics.median(r[field] for r in mine)
                    for field in ("episodes_per_s", "turns_per_s", "cpu_ms_per_turn", "turns_per_request")
                    if field in mine[0]
                },
            }
        )
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| arm | turns | concurrency | workers | ep logs | episodes/s | turns/s | CPU ms/turn | turns/request |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['arm']} | {r['turns']} | {r['concurrency']} | {r['workers']} | {r['logs']} | {r['episodes_per_s']:.1f} "
        "| "
        f"{r['turns_per_s']:.1f} | {r['cpu_ms_per_turn']:.2f} | "
        f"{format(r['turns_per_request'], '.1f') if 'turns_per_request' in r else '-'} |"
        for r in rows
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
