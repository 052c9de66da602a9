"""What ``import ep_trl`` costs, and what a worker process and a processor eval's run pay for it: this checkout's
code against an earlier commit's, measured in the same run.

    python benchmarks/import_time.py --before 31497f1 --repeats 5 --out benchmarks/results/import_time.json

``--before REV``'s ``src/`` is exported with ``git archive`` to a temporary directory; each measurement runs in a
fresh interpreter with ``PYTHONPATH`` naming that ``src/`` (``before``) or this checkout's (``after``), the two
interleaved per repeat so that load from elsewhere hits both alike. Without ``--before`` only this checkout is
measured (the test suite's smoke run):

* ``import``: ``import ep_trl``, timed inside the interpreter (``time.perf_counter`` around the import), and the
  interpreter's wall clock from start to exit;
* ``worker_start``: what a ``RolloutOptions(worker_processes=N)`` worker does before its first job
  (``ep_trl.adapters.sharded`` imported, as the spawned process unpickles its target, then the rollout function built
  for the single-turn eval ``tests/evals/eval_arithmetic.py``, its generation server probed): the interpreter's wall
  clock;
* ``processor_run``: a user script on the processor path: ``import ep_trl``, a CPU ``GRPOTrainer`` on the tiny
  model, the single-turn eval's rollout function, one call of ``--episodes`` episodes, closed: the interpreter's
  wall clock.

Generation is ``benchmarks/fixtures/instant_vllm.py`` (answers at once), so nothing but ep_trl's own start and the
libraries it loads is measured. Each measurement also records which of openenv, gradio, fastmcp and IPython the
interpreter had imported.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from benchmarks.compare_code import export_src  # noqa: E402
from ep_trl.devtools import run_record  # noqa: E402

HEAVY = ("openenv", "gradio", "fastmcp", "IPython")
EVAL = "tests/evals/eval_arithmetic.py::test_arithmetic"
LOADED = f"sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))"

CODE = {
    "import": f"""
import json, sys, time
started = time.perf_counter()
import ep_trl
seconds = time.perf_counter() - started
print(json.dumps({{"import_s": seconds, "loaded": {LOADED}}}))
""",
    "worker_start": f"""
import json, sys
import ep_trl.adapters.sharded
from ep_trl import create_openenv_vllm_rollout_func
rollout = create_openenv_vllm_rollout_func({EVAL!r}, vllm_base_url=sys.argv[1], log_rollouts=False)
rollout.close()
print(json.dumps({{"loaded": {LOADED}}}))
""",
    "processor_run": f"""
import json, sys
from pathlib import Path
from ep_trl import create_openenv_vllm_rollout_func, dataset_from_eval
from tests.support.trainers import make_trainer
url, model_dir, work, episodes = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
rollout = create_openenv_vllm_rollout_func({EVAL!r}, vllm_base_url=url, log_rollouts=False)
prompts = (list(dataset_from_eval({EVAL!r})["prompt"]) * episodes)[:episodes]
trainer = make_trainer(model_dir, work, rollout, num_generations=2, batch_size=2, max_steps=1, prompts=prompts)
try:
    out = rollout(prompts, trainer)
finally:
    rollout.close()
assert out["episode_status"] == ["finished"] * episodes, out["episode_status"]
print(json.dumps({{"loaded": {LOADED}}}))
""",
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--before", default=None, help="the commit to compare against (its src/); none: this checkout alone"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=8, help="episodes of the processor run")
    parser.add_argument("--measures", nargs="+", choices=list(CODE), default=list(CODE))
    parser.add_argument("--out", type=Path, default=None)
    return parser.parse_args()


def measure(name: str, src: Path, args: list[str]) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(REPO)])}
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CODE[name], *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{name} under {src} failed:\n{done.stderr[-3000:]}")
    return {"wall_s": wall, **json.loads(done.stdout.strip().splitlines()[-1])}


def main() -> None:
    args = parse_args()
    record = run_record.start(REPO)
    from ep_trl.devtools.tiny_model import build_tiny_model
    from ep_trl.runtime.processes import free_port, start_server

    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ep-trl-import-") as tmp:
        work = Path(tmp)
        codes = {"after": REPO / "src"}
        if args.before:
            codes["before"] = export_src(args.before, work / "before")
        model_dir = build_tiny_model(work / "tiny", seed=0)
        port = free_port()
        server = start_server(
            "instant-vllm",
            [
                sys.executable,
                str(REPO / "benchmarks/fixtures/instant_vllm.py"),
                "--model-dir",
                str(model_dir),
                "--port",
                str(port),
                "--reply",
                "5",
            ],
            port=port,
            log_dir=work,
            cwd=REPO,
        )
        try:
            for repeat in range(args.repeats):
                for code in sorted(codes, reverse=repeat % 2 == 1):  # after first on even repeats
                    for name in args.measures:
                        extra = {
                            "import": [],
                            "worker_start": [server.base_url],
                            "processor_run": [
                                server.base_url,
                                str(model_dir),
                                str(work / f"run-{code}-{repeat}"),
                                str(args.episodes),
                            ],
                        }[name]
                        row = {
                            "code": code,
                            "measure": name,
                            "repeat": repeat,
                            **measure(name, codes[code], extra),
                            "loadavg_1min": os.getloadavg()[0],
                        }
                        runs.append(row)
                        print(
                            json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}),
                            flush=True,
                        )
        finally:
            server.stop()
    summary = []
    for name in args.measures:
        for code in sorted(codes, reverse=True):  # before, after
            mine = [r for r in runs if r["measure"] == name and r["code"] == code]
            entry = {
                "measure": name,
                "code": code,
                "wall_s": statistics.median(r["wall_s"] for r in mine),
                "loaded": mine[0]["loaded"],
            }
            if name == "import":
                entry["import_s"] = statistics.median(r["import_s"] for r in mine)
            summary.append(entry)
    print("| measure | code | median wall s | median import s | loaded |\n|---|---|---|---|---|")
    for e in summary:
        import_s = f"{e['import_s']:.2f}" if "import_s" in e else "-"
        print(f"| {e['measure']} | {e['code']} | {e['wall_s']:.2f} | {import_s} | {', '.join(e['loaded']) or '-'} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {"run": run_record.finish(record), "before": args.before, "summary": summary, "runs": runs}, indent=1
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
