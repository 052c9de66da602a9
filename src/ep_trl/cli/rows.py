"""The rows a run trains on and holds out: ``--held-out``, ``--held-out-tasks`` and ``--held-out-reset-kwarg``
checked against the eval, the training rows (repeated to fill ``max_steps``) split from the held-out prompts, and the
refusals made once the environment could be asked."""

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .. import EpTrlError, EvalOverrides
from .arguments import PROG, RunArguments, TrainJob
from .ranks import Ranks

if TYPE_CHECKING:
    from datasets import Dataset

    from ..evalprotocol.spec import EvalSpec
    from ..trajectory.types import Prompt
    from .heldout import ResetVariants


def check_rows(parser: argparse.ArgumentParser, env_path: str, paths: Sequence[str] | None) -> int:
    """The number of training rows, read once now: the eval's own, or ``--input-dataset``'s (files that exist, for an
    eval that reads an ``input_dataset``), so that a dataset that is not there, or a row the eval's adapter cannot
    read, is refused before anything starts."""
    from .. import dataset_from_eval

    flag = f"--input-dataset {' '.join(paths)}" if paths is not None else f"ENV_PATH {env_path}"
    try:
        rows = len(dataset_from_eval(env_path, input_dataset=paths))
    except EpTrlError as error:
        parser.error(f"{flag}: {error}")
    except (ValueError, KeyError, TypeError) as error:  # the eval's dataset_adapter on rows it cannot read
        parser.error(
            f"{flag}: the eval's dataset_adapter cannot read these rows ({type(error).__name__}: {error}); "
            "write them in the format the eval's adapter reads"
        )
    if paths is not None:
        print(f"input dataset: {rows} rows from {', '.join(paths)}", flush=True)
    return rows


def check_held_out(
    parser: argparse.ArgumentParser, run_args: RunArguments, spec: "EvalSpec", overrides: EvalOverrides, rows: int
) -> tuple[str, ...]:
    """``--held-out`` and ``--held-out-tasks`` checked against the eval's ``rows`` (their number, as
    :func:`check_rows` read them); the tasks training plays when tasks are held out (else ())."""
    held = run_args.held_out
    if held < 0 or (held >= 1 and held != int(held)):
        parser.error(
            f"--held-out {held:g}: give a number of rows (a whole number), or a share of the eval's rows "
            "between 0 and 1"
        )
    if run_args.held_out_tasks and not held:
        parser.error(
            "--held-out-tasks names the tasks held out of training: add --held-out N, the number of held-out "
            "episodes (rotated over those tasks)"
        )
    if not held:
        return ()
    if spec.processor is None:
        if held < 1:
            parser.error(
                f"--held-out {held:g}: {spec.qualified_name} plays an OpenEnv environment, whose held-out "
                "instances are reset seeds: give their number (a whole number), e.g. --held-out 16"
            )
        return _training_tasks(parser, spec, run_args.held_out_tasks, overrides)
    if run_args.held_out_tasks:
        parser.error(
            f"--held-out-tasks: {spec.qualified_name} uses {spec.processor_name}, whose held-out instances "
            "are rows (--held-out N); tasks are held out of OpenEnv evals only"
        )
    if held >= rows:
        parser.error(
            f"--held-out {held:g}: {spec.qualified_name} has {rows} rows and training needs at "
            f"least one: give --held-out {rows - 1} or fewer"
        )
    return ()


def check_held_out_variants(
    parser: argparse.ArgumentParser, run_args: RunArguments, spec: "EvalSpec", overrides: EvalOverrides
) -> "ResetVariants | None":
    """``--held-out-reset-kwarg NAME=V1,V2,...`` read and checked: with ``--held-out N`` on an OpenEnv eval, a
    keyword other than the seed and the eval's task keyword, each value once (None without it)."""
    from .heldout import ResetVariants

    text = run_args.held_out_reset_kwarg
    if text is None:
        return None
    flag = f"--held-out-reset-kwarg {text}"
    if not run_args.held_out:
        parser.error(
            f"{flag} plays each held-out instance under each value: add --held-out N, the number of held-out instances"
        )
    if spec.processor is not None:
        parser.error(
            f"{flag}: {spec.qualified_name} uses {spec.processor_name}, whose held-out instances are rows "
            "played by its own processor; reset keywords are for OpenEnv evals, whose loop ep_trl drives"
        )
    try:
        variants = ResetVariants.parse(text, int(run_args.held_out))
    except ValueError as error:
        parser.error(f"{flag}: {error}")
    assert spec.env is not None
    task_kwarg = overrides.reset_task_kwarg or spec.env.reset_task_kwarg
    if variants.name == task_kwarg and (overrides.tasks or spec.env.tasks):
        parser.error(
            f"{flag}: {task_kwarg} names the task of each episode (the eval's tasks rotate); hold tasks out "
            "with --held-out-tasks instead"
        )
    return variants


def _training_tasks(
    parser: argparse.ArgumentParser, spec: "EvalSpec", held_tasks: Sequence[str] | None, overrides: EvalOverrides
) -> tuple[str, ...]:
    """The eval's tasks (``--tasks`` when given) less ``--held-out-tasks``: each held-out task must be one of them and
    one at least must be left to train on."""
    if not held_tasks:
        return ()
    assert spec.env is not None
    tasks = tuple(overrides.tasks if overrides.tasks is not None else spec.env.tasks)
    unknown = [task for task in held_tasks if task not in tasks]
    if unknown:
        parser.error(
            f"--held-out-tasks {' '.join(held_tasks)}: {unknown} are not tasks of {spec.qualified_name} "
            f"({list(tasks) or 'it has none'}); name some of its tasks"
        )
    left = tuple(task for task in tasks if task not in held_tasks)
    if not left:
        parser.error(
            f"--held-out-tasks {' '.join(held_tasks)} holds out every task of {spec.qualified_name}: leave "
            "one at least to train on"
        )
    return left


def held_out_seed(job: TrainJob) -> int:
    if job.run.held_out_seed is not None:
        return job.run.held_out_seed
    seed = job.config_values.get("seed", 42)
    assert isinstance(seed, int), "GRPOConfig's seed is an int"
    return seed


def refuse_held_out(job: TrainJob, problem: str, made_folder: Path | None) -> None:
    """``--held-out`` refused once the environment could be asked (exit status 2, as for bad input): nothing was
    trained, and the run folder this run made is removed again."""
    import shutil

    tasks = held_out_tasks_hint(job)
    message = (
        f"{PROG}: error: --held-out: {job.env_path}: {problem}. Make the environment's reset(seed=...) choose "
        "the instance, as OpenEnv's Environment.reset(seed=...) does (the same seed, the same first "
        f"observation), {tasks}or drop --held-out (the per-step score is the eval's score on the training "
        "episodes)"
    )
    print(message, file=sys.stderr, flush=True)
    if made_folder is not None:
        shutil.rmtree(made_folder, ignore_errors=True)


def refuse_held_out_variants(job: TrainJob, problem: str, made_folder: Path | None) -> None:
    """``--held-out-reset-kwarg`` refused once the environment could be asked (exit status 2): nothing was trained,
    and the run folder this run made is removed again."""
    import shutil

    print(
        f"{PROG}: error: --held-out-reset-kwarg {job.run.held_out_reset_kwarg}: {job.env_path}: {problem}. Give "
        "a keyword and values the environment's reset() takes, or drop --held-out-reset-kwarg",
        file=sys.stderr,
        flush=True,
    )
    if made_folder is not None:
        shutil.rmtree(made_folder, ignore_errors=True)


def held_out_tasks_hint(job: TrainJob) -> str:
    """The refusal's hint for an eval with tasks: hold some of them out instead of seeds."""
    from ..evalprotocol import read_eval_spec, resolve_eval_test

    env = read_eval_spec(resolve_eval_test(job.env_path)).env
    tasks = list(job.overrides.tasks if job.overrides.tasks is not None else env.tasks if env is not None else ())
    if len(tasks) < 2:
        return ""
    return f"hold out some of its tasks instead (--held-out-tasks {tasks[-1]}: training plays {tasks[:-1]}), "


def split_rows(job: TrainJob) -> "tuple[Dataset, list[Prompt]]":
    """The training rows (the eval's rows minus the held-out ones, repeated to fill ``max_steps``) and the held-out
    prompts (none for an OpenEnv eval, whose held-out instances are reset seeds)."""
    from datasets import concatenate_datasets

    from .. import dataset_from_eval

    rows = dataset_from_eval(job.env_path, input_dataset=job.overrides.input_dataset)
    held_out: "list[Prompt]" = []
    held = job.run.held_out
    if held and not job.openenv:  # fewer than the eval's rows (plan checked); below 1, a share of them
        split = rows.train_test_split(test_size=held if held < 1 else int(held), seed=held_out_seed(job))
        rows, held_out = split["train"], list(split["test"]["prompt"])
    if job.preset.train_rows is not None:
        rows = job.preset.train_rows(rows)
    values = job.config_values
    steps = int(values.get("max_steps") or -1)
    if steps > 0:
        per_step = int(values.get("per_device_train_batch_size") or 8) * int(
            values.get("gradient_accumulation_steps") or 1
        )
        groups = max(1, per_step // int(values.get("num_generations") or 8))
        # every process of a multi-process run takes its own groups from the same rows
        repeat = math.ceil(groups * Ranks.from_env().world_size * steps / len(rows))
        rows = concatenate_datasets([rows] * repeat) if repeat > 1 else rows
    return rows, held_out
