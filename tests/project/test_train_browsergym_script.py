"""The README's main job, as a user runs it: train_browsergym_trl.py on the CPU, real Chromium, end to end.

Each run is watched from outside: once the script prints its environment server's URL, a sampler records the
server and every process under it (Playwright drivers, Chromium). After the script exits, none may be left.
"""

import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.support.trainers import assert_script_trained

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "train_browsergym_trl.py"
#: The task's right first action (what the learning test reads the policy's probability of).
RIGHT = {"click-test": "click('13')", "focus-text": "click('12')"}
pytestmark = pytest.mark.slow


@dataclass
class Run:
    returncode: int
    stdout: str
    seconds_after_interrupt: float | None = None
    seen: list[psutil.Process] = field(default_factory=list)
    seen_names: set[str] = field(default_factory=set)
    stderr_tail: str = ""

    def leftovers(self) -> list[psutil.Process]:
        """Processes of the server's tree that are still alive (pid reuse is ruled out by psutil's create time)."""
        alive = []
        for p in self.seen:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.NoSuchProcess:
                continue
        return alive


def _server_process(port: str, timeout_s: float = 30.0) -> psutil.Process:
    """The BrowserGym server the script started on ``port``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if "ep_trl.envs.browsergym" in cmd and port in cmd:
                return p
        time.sleep(0.2)
    raise AssertionError(f"no ep_trl.envs.browsergym process listening on port {port}")


def _sample_tree(server: psutil.Process, seen: dict[int, tuple[psutil.Process, str]], stop: threading.Event) -> None:
    """Record the server and its descendants, with their names, until ``stop`` is set."""
    while not stop.is_set():
        try:
            for p in [server, *server.children(recursive=True)]:
                if p.pid not in seen:
                    seen[p.pid] = (p, p.name())
        except psutil.NoSuchProcess:
            pass  # one of them ended between listing and naming; the next round sees the rest
        if not server.is_running():
            return
        stop.wait(0.3)


def run_script(args: list[str], cwd: Path, *, interrupt_after: str | None = None, timeout_s: float = 420) -> Run:
    """Run the script; with ``interrupt_after``, send SIGINT (Ctrl-C) once a stdout line starts with it."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell's background jobs ignore SIGINT, and Python keeps it ignored: give the script a real Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    out_pipe, err_pipe = proc.stdout, proc.stderr
    assert out_pipe is not None and err_pipe is not None  # both pipes (subprocess.PIPE)
    stderr_lines: list[str] = []
    drain = threading.Thread(target=lambda: stderr_lines.extend(err_pipe), daemon=True)
    drain.start()
    seen: dict[int, tuple[psutil.Process, str]] = {}
    stop = threading.Event()
    sampler = None
    lines: list[str] = []
    interrupted_at = None
    killer = threading.Timer(timeout_s, proc.kill)
    killer.start()
    try:
        for line in out_pipe:
            lines.append(line)
            if match := re.match(r"environment server: http://127\.0\.0\.1:(\d+)", line):
                server = _server_process(match.group(1))
                sampler = threading.Thread(target=_sample_tree, args=(server, seen, stop), daemon=True)
                sampler.start()
            if interrupt_after and interrupted_at is None and line.startswith(interrupt_after):
                interrupted_at = time.monotonic()
                proc.send_signal(signal.SIGINT)
        returncode = proc.wait()
    finally:
        killer.cancel()
        stop.set()
    if sampler is not None:
        sampler.join()
    drain.join(timeout=10)
    stdout = "".join(lines)
    assert sampler is not None, (
        f"the script never printed its environment server\n{stdout}\n{''.join(stderr_lines)[-3000:]}"
    )
    elapsed = time.monotonic() - interrupted_at if interrupted_at is not None else None
    return Run(
        returncode,
        stdout,
        elapsed,
        [p for p, _ in seen.values()],
        {name for _, name in seen.values()},
        "".join(stderr_lines)[-3000:],
    )


def first_turn_answers(stdout: str, when: str) -> dict[str, dict[str, float]]:
    """The ``before training`` / ``after training`` block: task -> answer -> the policy's probability."""
    block = stdout.split(f"{when}, the policy's first-turn answers (probability):\n", 1)[1]
    answers = {}
    for line in block.splitlines():
        if not line.startswith("  "):
            break
        task, listed = line.strip().split(": ", 1)
        answers[task] = {a: float(p) for a, p in re.findall(r"(\S+\(.*?\)) ([0-9.]+)", listed)}
    return answers


@pytest.mark.timeout(900)  # 3-5 minutes on a loaded 2-core machine, 1-2 more where the warm start is not cached yet
def test_the_main_job_learns_the_eval_and_plots_it(tmp_path: Path) -> None:
    """The README's quick start, shortened from 15 steps to 10 (seed 0, as by default): the warm-started tiny model
    starts at one right answer in three on both tasks and GRPO through the eval raises it.

    What is asserted is measured exactly: the policy's teacher-forced probability of the right first action, which
    the script prints before and after training, goes from about 1/3 to at least 0.6 on both tasks. Measured over 10
    runs (``benchmarks/results/main_job_spread.json``, docs/browsergym.md): 0.84-0.88 and 0.80-0.86, so 0.6 is 0.2
    below the lowest. The mean sampled score per step is printed and checked for consistency with the closing line, but
    its rise is not asserted: 16 sampled episodes at each end make it noisy (a policy whose right-action probability
    went from 0.33 to 0.88 once showed a rise of 0.19 there, steps 1-2 happening to sample 0.5 and 0.75).
    """
    run = run_script(["--max-steps", "10", "--output-dir", str(tmp_path)], cwd=tmp_path, timeout_s=840)
    assert run.returncode == 0, run.stderr_tail
    steps = re.findall(
        r"^step (\d+)/10 \| reward ([0-9.]+) .*\| episodes/s ([0-9.]+) .*\| ETA \d+s$", run.stdout, flags=re.M
    )
    assert [int(s) for s, _, _ in steps] == list(range(1, 11)), run.stdout
    scores = [float(r) for _, r, _ in steps]
    summary = re.search(
        r"^done: 10 steps, 80 episodes, reward first ([0-9.]+) last ([0-9.]+) "
        r"\(mean eval score of steps 1-2 and 9-10\)",
        run.stdout,
        flags=re.M,
    )
    assert summary, run.stdout
    first, last = float(summary.group(1)), float(summary.group(2))
    assert abs(first - sum(scores[:2]) / 2) < 1e-4 and abs(last - sum(scores[-2:]) / 2) < 1e-4
    before, after = first_turn_answers(run.stdout, "before training"), first_turn_answers(run.stdout, "after training")
    for task, answer in RIGHT.items():
        assert abs(before[task][answer] - 1 / 3) < 0.1 and len(before[task]) == 3, run.stdout
        assert after[task][answer] >= 0.6, run.stdout
    plot = tmp_path / "reward_curve.png"
    assert f"reward curve: {plot}" in run.stdout
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000
    assert not re.search(r"Warning|deprecated", run.stdout + run.stderr_tail), run.stderr_tail  # quiet output
    assert {"chromium", "node"} <= run.seen_names, "the run should have driven Chromium through Playwright"
    assert run.leftovers() == [], "environment server processes outlived the script"


def test_lora_trains_and_ctrl_c_stops_the_env_server(tmp_path: Path) -> None:
    # The warm-started policy (cached by the main job's test) gets a right answer one time in three, so a group of 4
    # scores alike with p ~ 0.2 and all 4 groups of two steps with p < 0.002; the random policy scores 0 everywhere,
    # and GRPO gives it no gradient at all.
    run = run_script(
        ["--lora-r", "4", "--max-steps", "20", "--output-dir", str(tmp_path)], cwd=tmp_path, interrupt_after="step 2/20"
    )
    lora = re.search(r"^LoRA r=4 alpha=8: (\d+) of (\d+) parameters trainable$", run.stdout, flags=re.M)
    assert lora and 0 < int(lora.group(1)) < int(lora.group(2)), run.stdout
    assert re.search(r"^step 2/20 \| reward [0-9.]+", run.stdout, flags=re.M)
    assert_script_trained(run.stdout)  # the adapter had a gradient in step 1 or 2
    assert run.returncode == 130 and "interrupted: environment server stopped" in run.stdout, run.stderr_tail
    assert run.seconds_after_interrupt is not None and run.seconds_after_interrupt < 60
    assert "chromium" in run.seen_names
    assert run.leftovers() == [], "Ctrl-C left environment server processes behind"
