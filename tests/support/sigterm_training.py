"""A training process for tests to end with SIGTERM at a chosen moment (tests/runtime/test_shutdown.py).

    python -m tests.support.sigterm_training ENV_PATH MODEL_DIR OUTPUT_DIR LOG_HOME

Trains ENV_PATH through ``env_path`` alone with a real ``GRPOTrainer.train()`` on the tiny model (generation in
process, so episodes finish and calls end), with ``ep logs`` rows written under LOG_HOME. It prints where its main
thread is, so a test can send the signal there:

* ``CALL n START`` / ``CALL n END`` around each rollout call (while episodes play, then while TRL collects them);
* ``SCORED <rollout_id>`` for each episode TRL's reward function received (its final row was handed to ep logs);
* ``GC n START`` / ``GC n END`` around a garbage collection after each step, of objects whose finalizers
  (``__del__`` methods and weakref callbacks, as libraries' sockets, files and caches have) run Python code: the
  places where Python drops an exception a signal handler raises;
* ``EXIT HANDLERS DONE <monotonic seconds>`` from the exit handler registered first, so it runs last: every exit
  handler (ep_trl's close included) has run, and only the interpreter's teardown is left.
"""

import atexit
import gc
import sys
import time
import weakref
from pathlib import Path
from typing import Any


def _exit_handlers_done() -> None:
    sys.stdout.write(f"EXIT HANDLERS DONE {time.monotonic():.3f}\n")
    sys.stdout.flush()


atexit.register(_exit_handlers_done)  # before any library's import: it runs after all of theirs

from transformers import TrainerCallback  # noqa: E402

from ep_trl import create_rollout_func, dataset_from_eval  # noqa: E402
from ep_trl.options import RolloutOptions  # noqa: E402
from ep_trl.rewards import eval_score  # noqa: E402
from tests.support.trainers import make_trainer  # noqa: E402

#: How long each step's collection of finalizer-heavy garbage lasts.
GC_WINDOW_S = 0.4


def say(line: str) -> None:
    """One write per line: ``print`` writes the text and its newline separately, and a log line from another thread
    (stderr goes to the same pipe) could land between them and glue itself to the rollout id."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Finalized:
    """An object whose ``__del__`` does a little work, in a reference cycle, so only the collector frees it."""

    def __init__(self) -> None:
        self.cycle = self

    def __del__(self) -> None:
        sum(range(300))


def _finalizer_callback(reference: Any) -> None:
    sum(range(300))


class CollectAfterStep(TrainerCallback):
    def __init__(self) -> None:
        self.steps = 0
        self._keep: list[Any] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps += 1
        say(f"GC {self.steps} START")
        ends = time.monotonic() + GC_WINDOW_S
        while time.monotonic() < ends:
            garbage = [Finalized() for _ in range(200)]
            self._keep = [weakref.ref(item, _finalizer_callback) for item in garbage]
            del garbage
            gc.collect()
        self._keep = []
        say(f"GC {self.steps} END")


def scored(completions: list[Any], rollout_id: list[str], **kwargs: Any) -> list[float | None]:
    for identifier in rollout_id:
        say(f"SCORED {identifier}")
    return eval_score(completions, **kwargs)


class AnnouncedCalls:
    def __init__(self, rollout: Any) -> None:
        self.rollout = rollout
        self.calls = 0
        self.__name__ = rollout.__name__

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any]]:
        self.calls += 1
        say(f"CALL {self.calls} START")
        output = self.rollout(prompts, trainer)
        say(f"CALL {self.calls} END")
        return output


def main(env_path: str, model_dir: str, output_dir: str, log_home: str) -> None:
    rollout = create_rollout_func(env_path, backend="trainer", options=RolloutOptions(log_home=log_home))
    prompts = list(dataset_from_eval(env_path)["prompt"]) * 4
    trainer = make_trainer(
        Path(model_dir),
        Path(output_dir),
        AnnouncedCalls(rollout),
        reward_funcs=[scored],
        num_generations=2,
        batch_size=2,
        max_steps=1000,
        max_completion_length=24,
        prompts=prompts,
    )
    trainer.add_callback(CollectAfterStep())
    say("TRAINING")
    trainer.train()
    say("TRAINING ENDED")


if __name__ == "__main__":
    main(*sys.argv[1:])
