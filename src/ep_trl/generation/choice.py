"""Which backend generates, and building it: the only place that knows the backends by name."""

import logging
from dataclasses import replace

from ..content import supports_images
from ..errors import ConfigError
from ..options import Backend, VLLMOptions
from ..trl_compat import ColocatedEngine, TrainerView, eos_token_ids
from . import Generator

logger = logging.getLogger(__name__)

OFF_POLICY_WARNING = (
    "Generating with the vLLM server at %s, which this trainer does not push weights to: rollouts are off-policy "
    "after the first optimizer step (and TRL applies no importance-sampling correction with use_vllm=False). Keep "
    "the server in sync with GRPOConfig(use_vllm=True, vllm_mode='server') on GPUs, or "
    "ep_trl.vllm_weight_sync.DiskSyncGRPOTrainer on CPU; on one GPU, vllm_mode='colocate' (docs/vllm.md).")


def make_generator(backend: Backend, vllm_base_url: str | None, options: VLLMOptions, view: TrainerView,
                   max_concurrent_rollouts: int) -> Generator:
    """The trainer's own vLLM engine when it has one: its colocated engine (``vllm_mode="colocate"``) or its server
    (``vllm_mode="server"``); TRL pushes weights to either before each call. Else ``vllm_base_url`` (no weight sync:
    off-policy after the first optimizer step), else the trainer's model."""
    if max_concurrent_rollouts <= 1:
        options = replace(options, batch_window_s=0.0)  # one episode at a time: no other turn will join a batch
    engine = view.colocated_engine() if backend != "trainer" else None
    if engine is not None:
        generator = _colocate(engine, vllm_base_url, options, max_concurrent_rollouts)
    else:
        server_url = view.vllm_server_url() if backend != "trainer" else None
        choice = backend if backend != "auto" else ("vllm" if (vllm_base_url or server_url) else "trainer")
        generator = _vllm(vllm_base_url, server_url, options, view) if choice == "vllm" else _trainer(view)
    logger.info("ep_trl: %s generates", generator.name)
    return generator


def _colocate(engine: ColocatedEngine, explicit: str | None, options: VLLMOptions,
              max_concurrent_rollouts: int) -> Generator:
    from .colocate import ColocateGenerator

    if explicit:
        logger.warning("vllm_base_url=%s is ignored: the trainer runs its own vLLM engine (vllm_mode='colocate') and "
                       "pushes its weights there, so ep_trl generates there too.", explicit)
    generator = ColocateGenerator(engine.llm, options, wake=engine.wake, sleep=engine.sleep)
    if max_concurrent_rollouts > generator.max_num_seqs:
        logger.info("The colocated engine runs at most %d sequences at once (TRL sizes it from "
                    "per_device_train_batch_size x steps_per_generation); episodes beyond that wait for a turn.",
                    generator.max_num_seqs)
    return generator


def _vllm(explicit: str | None, server_url: str | None, options: VLLMOptions, view: TrainerView) -> Generator:
    from .vllm import VLLMServerGenerator

    url = server_url or explicit
    if url is None:
        raise ConfigError("backend='vllm' needs a server: train with GRPOConfig(use_vllm=True, vllm_mode='server') "
                          "or pass vllm_base_url='http://HOST:PORT'.")
    if server_url and explicit and explicit != server_url.rstrip("/"):
        logger.warning("vllm_base_url=%s is ignored: the trainer generates with use_vllm=True and pushes its weights "
                       "to %s, so ep_trl generates there too.", explicit, server_url)
    if not server_url:
        logger.warning(OFF_POLICY_WARNING, url)
    return VLLMServerGenerator(url, options, model=view.vllm_server_model() if server_url else None)


def _trainer(view: TrainerView) -> Generator:
    from .trainer import TrainerGenerator

    provider = view.model_provider()
    tokenizer = view.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    processor = view.processing_class if supports_images(view.processing_class) else None
    return TrainerGenerator(provider, tokenizer, eos_token_ids(view.processing_class, provider()), pad,
                            processor=processor)
