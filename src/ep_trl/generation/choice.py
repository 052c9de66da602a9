"""Which generation backend a rollout function uses, and building it: the only place that knows the backends by name.

The caller decides first: a trainer with its own vLLM engine (``vllm_mode="colocate"``) or its own server
(``vllm_mode="server"``) pushes its weights there before each call, so ep_trl generates there too. Otherwise
``vllm_base_url`` (no weight sync: off-policy after the first optimizer step), else the trainer's model in this
process (``ep_trl.generation.trainer``).
"""

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from ..engine.caller import SyncedServer
from ..trajectory.content import supports_images, tokenizer_of
from ..errors import ConfigError
from . import Generator
from ..options import Backend, VLLMOptions
from ..trajectory.tokens import eos_token_ids
from ..trajectory.types import ProcessingClass

logger = logging.getLogger(__name__)

OFF_POLICY_WARNING = (
    "Generating with the vLLM server at %s, which this trainer does not push weights to: rollouts are off-policy "
    "after the first optimizer step (and TRL applies no importance-sampling correction with use_vllm=False). Keep "
    "the server in sync with GRPOConfig(use_vllm=True, vllm_mode='server') on GPUs, or "
    "ep_trl.trainers.disk_sync.DiskSyncGRPOTrainer on CPU; on one GPU, vllm_mode='colocate' (docs/vllm.md).")


def make_generator(backend: Backend, vllm_base_url: str | None, options: VLLMOptions, max_concurrent_rollouts: int, *,
                   colocated_trainer: Any | None, server: SyncedServer | None,
                   model_provider: Callable[[], Any] | None, processing_class: ProcessingClass) -> Generator:
    """The generation backend for a caller's rollout calls (see the module docstring), from what the caller offers: the
    trainer whose colocated engine generates, the server it keeps on its weights, its model in this process."""
    if max_concurrent_rollouts <= 1:
        options = replace(options, batch_window_s=0.0)  # one episode at a time: no other turn will join a batch
    if colocated_trainer is not None and backend != "trainer":
        generator = _colocate(colocated_trainer, vllm_base_url, options, max_concurrent_rollouts)
    else:
        server = server if backend != "trainer" else None
        choice = backend if backend != "auto" else ("vllm" if (vllm_base_url or server) else "trainer")
        generator = (_vllm(vllm_base_url, server, options) if choice == "vllm"
                     else _trainer(model_provider, processing_class))
    logger.info("ep_trl: %s generates", generator.name)
    return generator


def _colocate(trainer: object, explicit: str | None, options: VLLMOptions, max_concurrent_rollouts: int) -> Generator:
    from .colocate import ColocateGenerator, trainer_engine

    if explicit:
        logger.warning("vllm_base_url=%s is ignored: the trainer runs its own vLLM engine (vllm_mode='colocate') and "
                       "pushes its weights there, so ep_trl generates there too.", explicit)
    engine = trainer_engine(trainer)
    generator = ColocateGenerator(engine.llm, options, wake=engine.wake, sleep=engine.sleep)
    if max_concurrent_rollouts > generator.max_num_seqs:
        logger.info("The colocated engine runs at most %d sequences at once (TRL sizes it from "
                    "per_device_train_batch_size x steps_per_generation); episodes beyond that wait for a turn.",
                    generator.max_num_seqs)
    return generator


def _vllm(explicit: str | None, server: SyncedServer | None, options: VLLMOptions) -> Generator:
    from .vllm import VLLMServerGenerator

    url = server.url if server is not None else explicit
    if url is None:
        raise ConfigError("backend='vllm' needs a server: train with GRPOConfig(use_vllm=True, vllm_mode='server') "
                          "or pass vllm_base_url='http://HOST:PORT'.")
    if server is not None and explicit and explicit != server.url:
        logger.warning("vllm_base_url=%s is ignored: the trainer generates with use_vllm=True and pushes its weights "
                       "to %s, so ep_trl generates there too.", explicit, server.url)
    if server is None:
        logger.warning(OFF_POLICY_WARNING, url)
    return VLLMServerGenerator(url, options, model=server.model if server is not None else None)


def _trainer(provider: Callable[[], Any] | None, processing_class: ProcessingClass) -> Generator:
    from .trainer import TrainerGenerator

    if provider is None:
        raise ConfigError("backend='trainer' samples with the trainer's model in this process, and this caller has "
                          "none in reach; generate on a vLLM server (vllm_base_url=...).")
    tokenizer = tokenizer_of(processing_class)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    processor = processing_class if supports_images(processing_class) else None
    return TrainerGenerator(provider, tokenizer, eos_token_ids(processing_class, provider()), pad,
                            processor=processor)
