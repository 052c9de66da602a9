"""``--time-budget-s``: training that stops before a step would end past a number of seconds.

The bar a real-model run is held to counts its training time, the warm start included. :class:`TimeBudget` ends
training (``control.should_training_stop``, so the trainer finishes cleanly: the checkpoint is saved and the held-out
"after" is played) at the end of the step after which another step, judged by the longest step so far, would pass the
budget. The seconds already spent before training (the warm start) are given as ``spent_s``.
"""

import time

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from .ranks import Ranks, from_main


class TimeBudget(TrainerCallback):
    """Stop training at the end of the step after which one more step would pass ``seconds``."""

    def __init__(self, seconds: float, spent_s: float = 0.0) -> None:
        if seconds <= 0:
            raise ValueError(f"TimeBudget(seconds={seconds}): give a positive number of seconds")
        self.seconds = seconds
        self.spent_s = spent_s
        self._started = self._last = time.monotonic()
        self._longest = 0.0
        #: The step training stopped after, when the budget stopped it; None otherwise.
        self.stopped_at: int | None = None

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self._started = self._last = time.monotonic()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        now = time.monotonic()
        self._longest, self._last = max(self._longest, now - self._last), now
        used = self.spent_s + now - self._started
        over = used + self._longest > self.seconds
        # the main process's decision on every process: clocks differ a little, and one process stopping alone would
        # leave the others waiting for it in the next step's collectives
        if from_main(Ranks.from_env(), lambda: over) and state.global_step < state.max_steps:
            if state.is_world_process_zero:
                print(
                    f"time budget: step {state.global_step} ends {used:.0f} s into training; another step (up to "
                    f"{self._longest:.0f} s) would pass the {self.seconds:.0f} s budget, so training stops here",
                    flush=True,
                )
            self.stopped_at = state.global_step
            control.should_training_stop = True
