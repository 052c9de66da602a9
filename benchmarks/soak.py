"""Soak: many rollout calls in one process, printing what leaks would grow.

Runs ``--calls`` rollout calls of ``--episodes`` letters episodes each (a real letters environment server, the
tiny model, the in-process backend, a real ``GRPOTrainer`` as the caller), with faults mixed in when ``--faults``
is on (a crashing task in every other call), and prints per call: open file descriptors, threads, child
processes and resident memory of this process. Flat columns mean nothing leaks per call.

    python benchmarks/soak.py --calls 40 --episodes 8            # 320 episodes
    .venv-openenv010/bin/python benchmarks/soak.py --calls 40    # the same under openenv 0.10

``tests/project/test_soak.py`` runs a shorter version and asserts the columns stay flat.
"""

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def process_sample() -> dict[str, int]:
    """Open fds, threads, child processes and RSS (kB) of this process, read from /proc."""
    children = 0
    for task in Path("/proc/self/task").iterdir():
        try:
            children += len((task / "children").read_text().split())
        except OSError:
            continue
    rss = next(
        int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmRSS:")
    )
    return {
        "fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "children": children,
        "rss_kb": rss,
    }


def soak(calls: int, episodes: int, faults: bool, work: Path) -> list[dict[str, int]]:
    """Run the calls; one sample per call (taken after it)."""
    from ep_trl import EvalOverrides, create_openenv_vllm_rollout_func
    from ep_trl.cli.env_server import local_env_server
    from ep_trl.devtools.tiny_model import build_tiny_model
    from tests.support.trainers import make_trainer

    model_dir = build_tiny_model(work / "tiny-model", seed=0)
    samples = []
    previous_url = os.environ.get("LETTERS_ENV_URL")
    with local_env_server("ep_trl.envs.letters") as url:
        os.environ["LETTERS_ENV_URL"] = url
        tasks = ["crash", "vowels"] if faults else ["vowels"]
        rollout = create_openenv_vllm_rollout_func(
            "tests.evals.eval_letters", log_rollouts=False, overrides=EvalOverrides(tasks=tasks)
        )
        trainer = make_trainer(model_dir, work / "out", rollout, num_generations=episodes // 2, batch_size=episodes)
        try:
            prompts = [f"Play the letters game, round {i // (episodes // 2)}." for i in range(episodes)]
            for call in range(calls):
                out = rollout(prompts, trainer)
                sample = {"call": call + 1, "failed": out["episode_status"].count("error"), **process_sample()}
                samples.append(sample)
                print(" ".join(f"{k}={v}" for k, v in sample.items()), flush=True)
        finally:
            rollout.close()
            if previous_url is None:
                os.environ.pop("LETTERS_ENV_URL", None)
            else:
                os.environ["LETTERS_ENV_URL"] = previous_url
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--episodes", type=int, default=8, help="episodes per call (two prompt groups)")
    parser.add_argument("--no-faults", dest="faults", action="store_false", help="no crashing task")
    args = parser.parse_args()
    import importlib.metadata as md

    openenv = next((f"{d} {md.version(d)}" for d in ("openenv", "openenv-core") if _installed(d)), "no openenv")
    print(f"soak: {args.calls} calls x {args.episodes} episodes under {openenv}", flush=True)
    samples = soak(args.calls, args.episodes, args.faults, Path(tempfile.mkdtemp(prefix="ep-trl-soak-")))
    first, last = samples[min(1, len(samples) - 1)], samples[-1]
    print(
        "growth from call 2 to the last: "
        + ", ".join(f"{k} {last[k] - first[k]:+d}" for k in ("fds", "threads", "children", "rss_kb"))
    )


def _installed(distribution: str) -> bool:
    import importlib.metadata as md

    try:
        md.version(distribution)
    except md.PackageNotFoundError:
        return False
    return True


if __name__ == "__main__":
    main()
