"""Which generation backend a rollout function uses, and building it: the only place that knows the backends by name.

Each backend is a module of this package with a ``build(offer)`` function, named in ``BACKENDS``; this module picks
one (``pick``) and imports only that one. The caller decides first: a trainer with its own vLLM engine
(``vllm_mode="colocate"``) or its own server (``vllm_mode="server"``) pushes its weights there before each call, so
ep_trl generates there too. Otherwise ``vllm_base_url`` (no weight sync: off-policy after the first optimizer step),
else the trainer's model in this process (``ep_trl.generation.trainer``).
"""

import logging
from collections.abc import Callable
from dataclasses import replace
from importlib import import_module
from typing import TYPE_CHECKING

from ..options import Backend, VLLMOptions
from . import BackendOffer, Generator, SyncedServer

if TYPE_CHECKING:
    from trl import GRPOTrainer

    from ..trajectory.types import Model, ProcessingClass

logger = logging.getLogger(__name__)

#: Every backend: the name ``make_generator`` picks it by, and its module in this package, whose ``build(offer)``
#: (a ``BackendOffer``) builds it, imported only when picked. A new backend is its module and one line here.
BACKENDS: dict[str, str] = {"vllm-colocate": "colocate", "vllm": "vllm", "trainer": "trainer"}


def make_generator(
    backend: Backend,
    vllm_base_url: str | None,
    options: VLLMOptions,
    max_concurrent_rollouts: int,
    *,
    colocated_trainer: "GRPOTrainer | None",
    server: SyncedServer | None,
    model_provider: "Callable[[], Model] | None",
    processing_class: "ProcessingClass",
) -> Generator:
    """The generation backend for a caller's rollout calls (see the module docstring), from what the caller offers: the
    trainer whose colocated engine generates, the server it keeps on its weights, its model in this process."""
    if max_concurrent_rollouts <= 1:
        options = replace(options, batch_window_s=0.0)  # one episode at a time: no other turn will join a batch
    offer = BackendOffer(
        vllm_base_url,
        options,
        max_concurrent_rollouts,
        colocated_trainer,
        server if backend != "trainer" else None,
        model_provider,
        processing_class,
    )
    generator: Generator = import_module(f"{__package__}.{BACKENDS[pick(backend, offer)]}").build(offer)
    logger.info("ep_trl: %s generates", generator.name)
    return generator


def pick(backend: Backend, offer: BackendOffer) -> str:
    """The name of the backend that generates: the caller's colocated engine unless ``backend="trainer"``; else the
    backend named; else (``"auto"``) a server if one is offered, the trainer's model if not."""
    if offer.colocated_trainer is not None and backend != "trainer":
        return "vllm-colocate"
    if backend != "auto":
        return backend
    return "vllm" if (offer.vllm_base_url or offer.server) else "trainer"
