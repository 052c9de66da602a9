"""The step line ``ep-trl train`` prints (``ProgressPrinter``): a step in which every episode failed logs None for the
figures it has no episode to average; the line says so instead of raising out of the trainer's callback."""

import io
from types import SimpleNamespace
from typing import cast

from transformers import TrainerControl, TrainerState, TrainingArguments

from ep_trl.cli.progress import ProgressPrinter


def step_line(logs: dict) -> str:
    stream = io.StringIO()
    # on_log reads only the state's global_step and max_steps: stand-ins for the trainer's args, state and control
    state = cast(TrainerState, SimpleNamespace(global_step=1, max_steps=4))
    ProgressPrinter(stream).on_log(cast(TrainingArguments, None), state, cast(TrainerControl, None), logs=logs)
    return stream.getvalue()


def test_a_step_whose_figures_are_none_prints_n_a() -> None:
    line = step_line(
        {
            "reward": None,
            "reward_std": None,
            "rewards/eval_score/mean": None,
            "grad_norm": 0.0,
            "ep_trl/failed_fraction": 1.0,
            "ep_trl/episodes_per_s": None,
        }
    )
    assert line.startswith("step 1/4 | reward n/a (std n/a) | eval_score n/a | episodes/s n/a | failed 100% |")
    assert "grad_norm 0 |" in line


def test_a_step_with_figures_prints_them_and_leaves_out_what_was_not_logged() -> None:
    line = step_line({"reward": 0.25, "reward_std": 0.5, "grad_norm": 1.5, "ep_trl/mean_turns": 3.0})
    assert line.startswith("step 1/4 | reward 0.2500 (std 0.5000) | turns 3.0 | grad_norm 1.5 |")
    assert "eval_score" not in line and "failed" not in line
