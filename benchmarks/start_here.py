"""The README's "Start here" command, timed whole (issue 49: the first command after install trains in under 5
minutes on this machine, without a browser). It runs the command the README's "Start here" block gives after
``scripts/install.sh`` (read from README.md, so the figure is for what a reader runs), with ``--output-dir`` in a
temporary folder, and records its wall clock from start to exit, the CPU it and its children used, and the run's own
``result.json`` (first and last steps' eval score, steps, the run's wall clock).

    python benchmarks/start_here.py --out benchmarks/results/start_here_letters.json

``--max-steps N`` shortens the run (the test suite's smoke run); the README's figure is from the command as written.
"""

import argparse
import json
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from ep_trl.devtools import run_record  # noqa: E402


def start_here_command(readme: str) -> list[str]:
    """The command after ``bash scripts/install.sh`` in the README's "Start here" block, without its comment."""
    section = readme.split("## Start here", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, flags=re.S)
    assert block, "the README's Start here section has no bash block"
    lines = [line.split("#", 1)[0].strip() for line in block.group(1).splitlines()]
    commands = [line for line in lines if line and not line.startswith("bash scripts/install.sh")]
    assert len(commands) == 1, commands
    return shlex.split(commands[0])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, default=None, help="shorten the run (default: the command's own)")
    args = parser.parse_args(argv)
    record = run_record.start(REPO, [__file__, *(sys.argv[1:] if argv is None else argv)])
    command = start_here_command((REPO / "README.md").read_text())
    readme_command = shlex.join(command)
    if command[0] == "python":
        command[0] = sys.executable
    if args.max_steps is not None:
        command += ["--max-steps", str(args.max_steps)]
    with tempfile.TemporaryDirectory(prefix="start-here-") as folder:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        proc = subprocess.run([*command, "--output-dir", folder], cwd=REPO, capture_output=True, text=True)
        wall_s = time.monotonic() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"{shlex.join(command)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
        result = json.loads((Path(folder) / "result.json").read_text())
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    out = {
        "run": run_record.finish(record),
        "readme_command": readme_command,
        "runs": [
            {
                "max_steps": args.max_steps,
                "command_wall_s": round(wall_s, 1),
                "command_cpu_s": round(cpu_s, 1),
                "under_5_minutes": wall_s < 300,
                "steps": result["steps"],
                "ended": result["ended"],
                "train_first": result["train_first"],
                "train_last": result["train_last"],
                "run_wall_s": result["wall_s"],
                "last_lines": proc.stdout.splitlines()[-4:],
            }
        ],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: v for k, v in out.items() if k != "run"}, indent=2))


if __name__ == "__main__":
    main()
