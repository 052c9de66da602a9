"""The eval score per step read from a trainer's log history, its summary, and its plot (a real PNG)."""

from pathlib import Path

import pytest

from ep_trl.cli.reward_curve import StepScore, plot_scores, progress, step_scores

HISTORY = [
    {"step": s, "rewards/eval_score/mean": m, "rewards/eval_score/std": 0.1, "loss": 0.0}
    for s, m in zip(range(1, 11), [0.2, 0.4, 0.3, 0.5, 0.6, 0.7, 0.8, 0.8, 0.9, 1.0])
]


def test_the_summary_compares_the_first_and_last_fifth() -> None:
    scores = step_scores([*HISTORY, {"train_runtime": 1.0, "step": 10}])  # entries without a score are skipped
    assert [s.step for s in scores] == list(range(1, 11)) and scores[0] == StepScore(1, 0.2, 0.1)
    summary = progress(scores)
    assert (summary.first, summary.last, summary.window) == (pytest.approx(0.3), pytest.approx(0.95), 2)
    assert summary.describe() == "reward first 0.3000 last 0.9500 (mean eval score of steps 1-2 and 9-10)"
    with pytest.raises(ValueError, match="did training run a step"):
        progress(())


def test_without_the_eval_score_the_summary_reads_the_async_trainers_reward() -> None:
    """GRPOTrainer logs rewards/eval_score/mean (read even where reward is also logged); AsyncGRPOTrainer logs only
    reward and reward_std, which the step scores then come from. Entries without a score (the closing one) are
    skipped."""
    sync = [
        {"step": 1, "reward": 0.9, "rewards/eval_score/mean": 0.2, "rewards/eval_score/std": 0.1},
        {"step": 1, "train_runtime": 3.0},
    ]
    assert step_scores(sync) == (StepScore(1, 0.2, 0.1),)
    asynchronous = [
        {"step": 1, "reward": 0.25, "reward_std": 0.05},
        {"step": 2, "reward": 0.5, "reward_std": 0.0},
        {"step": 2, "train_runtime": 3.0},
    ]
    assert step_scores(asynchronous) == (StepScore(1, 0.25, 0.05), StepScore(2, 0.5, 0.0))


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    path = plot_scores(step_scores(HISTORY), tmp_path / "sub" / "curve.png", title="t", note="python x.py")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5_000
