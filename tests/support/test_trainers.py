"""The training checks of tests/support/trainers.py fail on what they name: no step with a gradient, or a step whose
gradient is NaN or infinite, wherever that step is (issue 40: a NaN after a positive grad_norm passed)."""

import io
import math
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from ep_trl.cli.progress import ProgressPrinter
from tests.support.trainers import assert_script_trained, assert_trained

if TYPE_CHECKING:
    from collections.abc import Callable

NAN, INF = math.nan, math.inf
HISTORIES = {  # grad_norm per step, and whether the run trained
    "a gradient": ([0.0, 0.5], True),
    "no gradient": ([0.0, 0.0], False),
    "no step": ([], False),
    "NaN after a gradient": ([0.5, NAN], False),
    "NaN first": ([NAN, 0.5], False),
    "infinite": ([0.5, INF], False),
    "minus infinite": ([-INF, 0.5], False),
}


def trainer_with(norms: list[float]) -> SimpleNamespace:
    """What assert_trained reads of a GRPOTrainer: its log history, one entry per step, and the run's summary."""
    history = [{"loss": 0.1, "grad_norm": norm, "step": step} for step, norm in enumerate(norms, 1)]
    return SimpleNamespace(state=SimpleNamespace(log_history=[*history, {"train_runtime": 1.0}]))


def script_output(norms: list[float]) -> str:
    """The step lines a training script prints (its ProgressPrinter), one per step."""
    stream = io.StringIO()
    printer = ProgressPrinter(stream)
    for step, norm in enumerate(norms, 1):
        # on_log reads only the state's global_step and max_steps: stand-ins for the trainer's args, state and control
        printer.on_log(
            cast(TrainingArguments, None),
            cast(TrainerState, SimpleNamespace(global_step=step, max_steps=len(norms))),
            cast(TrainerControl, None),
            logs={"reward": 0.5, "reward_std": 0.1, "grad_norm": norm},
        )
    return stream.getvalue()


@pytest.mark.parametrize("case", sorted(HISTORIES))
def test_assert_trained_and_assert_script_trained_pass_only_finite_gradients_with_one_above_0(case: str) -> None:
    norms, trained = HISTORIES[case]
    output = script_output(norms)
    assert output.count("grad_norm") == len(norms)  # every step's line, the NaN and infinite ones included
    checks: "tuple[tuple[Callable[[Any], None], object], ...]" = (
        (assert_trained, trainer_with(norms)),
        (assert_script_trained, output),
    )
    for check, given in checks:
        if trained:
            check(given)
        else:
            why = "not finite" if not all(map(math.isfinite, norms)) else "no step had a gradient"
            with pytest.raises(AssertionError, match=why):
                check(given)
