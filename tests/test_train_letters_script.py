"""The README's main job, as a user runs it: the CPU demo training script end to end."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_cpu_default_trains_and_prints_a_reward_line_per_step(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(ROOT / "train_letters_trl.py"), "--max-steps", "2", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = re.findall(r"^step (\d)/2 \| reward ([0-9.]+)", proc.stdout, flags=re.M)
    assert [s for s, _ in steps] == ["1", "2"], proc.stdout
    assert all(0.0 <= float(r) <= 1.0 for _, r in steps)
    assert re.search(r"^done: 2 steps, 32 episodes, reward first [0-9.]+ last [0-9.]+ \(mean eval score of steps 1 "
                     r"and 2\)", proc.stdout, flags=re.M), proc.stdout
    assert (tmp_path / "tiny-model" / "config.json").exists()
    plot = tmp_path / "reward_curve.png"
    assert f"reward curve: {plot}" in proc.stdout and plot.read_bytes()[:4] == b"\x89PNG"
