"""The processes of one ``ep-trl train`` run under ``torchrun`` or ``accelerate launch`` (docs/scaling.md): which one
is the main process, and the values the main process alone makes and sends to the others.

The main process (rank 0) starts the environment server, the run's own vLLM server and the preset's model, runs the
warm start, writes the run folder, prints the progress line and plays the held-out set; every process trains on its
own share of the prompts through the same servers. The values go over ``torch.distributed`` (gloo on CPU, NCCL on
GPU), whose process group ``accelerate.PartialState`` starts as the trainer would, so the trainer reuses it. An
error the main process meets while making a value is sent to the others, which raise it too instead of waiting."""

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ..errors import EpTrlError

_Value = TypeVar("_Value")

#: What the main process sends instead of a value when making it failed.
_FAILED = "failed"
_SENT = "sent"


@dataclass(frozen=True)
class Ranks:
    """This process's place in the run: its rank and the number of processes (``torchrun`` and ``accelerate launch``
    set ``RANK`` and ``WORLD_SIZE``; a plain ``ep-trl train`` is rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls) -> "Ranks":
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")))

    @property
    def main(self) -> bool:
        """Whether this is the process that writes the run folder and starts the servers."""
        return self.rank == 0

    @property
    def several(self) -> bool:
        """Whether the run has more than one process."""
        return self.world_size > 1


def _broadcast(box: list[object]) -> object:
    import torch.distributed as dist
    from accelerate import PartialState

    PartialState()  # the process group the trainer uses (started once, from torchrun's environment)
    dist.broadcast_object_list(box, src=0)
    return box[0]


def send(ranks: Ranks, value: object) -> None:
    """The main process's ``value``, sent to the other processes (each waits in :func:`receive`)."""
    if ranks.several:
        _broadcast([(_SENT, value)])


def send_failure(ranks: Ranks, error: BaseException) -> None:
    """The main process could not make the value: the others raise instead of waiting for it."""
    if ranks.several:
        _broadcast([(_FAILED, f"{type(error).__name__}: {error}")])


def receive(ranks: Ranks) -> object:
    """What the main process sent (:func:`send`); ``EpTrlError`` when it sent a failure."""
    sent = _broadcast([None])
    assert isinstance(sent, tuple), "send and send_failure put a pair"
    kind, value = sent
    if kind == _FAILED:
        raise EpTrlError(f"ep-trl train: the main process (rank 0) failed, so process {ranks.rank} stops: {value}")
    return value


def from_main(ranks: Ranks, make: Callable[[], _Value]) -> _Value:
    """``make()`` run by the main process alone, its value returned on every process (one process: ``make()``)."""
    if not ranks.several:
        return make()
    if not ranks.main:
        return receive(ranks)  # type: ignore[return-value]  # what the main process's make() returned
    try:
        value = make()
    except BaseException as error:
        send_failure(ranks, error)
        raise
    send(ranks, value)
    return value


def barrier(ranks: Ranks) -> None:
    """Every process waits here for the others (the main process's held-out play, its checkpoint)."""
    if ranks.several:
        import torch.distributed as dist

        dist.barrier()
