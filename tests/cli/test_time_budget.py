"""--time-budget-s: training stops at the end of the step after which one more step would pass the budget."""

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from ep_trl.cli import time_budget
from ep_trl.cli.time_budget import TimeBudget


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def steps_until_stopped(budget: TimeBudget, clock: Clock, step_s: list[float], max_steps: int = 100) -> int:
    args, state = TrainingArguments(output_dir="unused", report_to=[]), TrainerState(max_steps=max_steps)
    budget.on_train_begin(args, state, TrainerControl())
    for step, seconds in enumerate(step_s, start=1):
        clock.now += seconds
        state.global_step = step
        control = TrainerControl()
        budget.on_step_end(args, state, control)
        if control.should_training_stop:
            return step
    return len(step_s)


def test_training_stops_before_a_step_that_would_pass_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(time_budget.time, "monotonic", clock)
    budget = TimeBudget(100.0)
    # steps of 20 s: after step 4 (80 s) one more would end at 100 s, still within; after step 5 (100 s) it would not
    assert steps_until_stopped(budget, clock, [20.0] * 10) == 5
    assert budget.stopped_at == 5


def test_the_longest_step_so_far_judges_the_next(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(time_budget.time, "monotonic", clock)
    # the longest step is 40 s from step 2 on: after step 3 (60 s) one more ends at 100 s, within; after step 4 (70 s)
    # it would end at 110 s, so training stops there, though step 4 itself took 10 s
    assert steps_until_stopped(TimeBudget(100.0), clock, [10.0, 40.0, 10.0, 10.0, 10.0]) == 4


def test_seconds_spent_before_training_count(monkeypatch: pytest.MonkeyPatch) -> None:
    """The warm start counts in the training time: 60 s spent before leaves room for two 20 s steps (not five)."""
    clock = Clock()
    monkeypatch.setattr(time_budget.time, "monotonic", clock)
    assert steps_until_stopped(TimeBudget(100.0, spent_s=60.0), clock, [20.0] * 10) == 2


def test_a_budget_that_is_never_reached_does_not_stop_training(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(time_budget.time, "monotonic", clock)
    budget = TimeBudget(1000.0)
    assert steps_until_stopped(budget, clock, [1.0] * 5) == 5 and budget.stopped_at is None


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        TimeBudget(0)
