"""Which backend generates, and building it: the only place that knows the backends by name."""

import logging
from dataclasses import replace

from ..content import supports_images
from ..errors import ConfigError
from ..options import Backend, VLLMOptions
from ..trl_compat import TrainerView, eos_token_ids
from . import Generator

logger = logging.getLogger(__name__)

OFF_POLICY_WARNING = (
    "Generating with the vLLM server at %s, which this trainer does not push weights to: rollouts are off-policy "
    "after the first optimizer step (and TRL applies no importance-sampling correction with use_vllm=False). Keep "
    "the server in sync with GRPOConfig(use_vllm=True, vllm_mode='server') on GPUs, or "
    "ep_trl.vllm_weight_sync.DiskSyncGRPOTrainer on CPU (docs/vllm.md).")


def make_generator(backend: Backend, vllm_base_url: str | None, options: VLLMOptions, view: TrainerView,
                   max_concurrent_rollouts: int) -> Generator:
    """The trainer's own vLLM server when it has one (TRL pushes weights there before each call), else
    ``vllm_base_url`` (no weight sync: off-policy after the first optimizer step), else the trainer's model."""
    server_url = view.vllm_server_url() if backend != "trainer" else None
    choice = backend if backend != "auto" else ("vllm" if (vllm_base_url or server_url) else "trainer")
    generator = _vllm(vllm_base_url, server_url, options, view, max_concurrent_rollouts) if choice == "vllm" \
        else _trainer(view)
    logger.info("ep_trl: %s generates", generator.name)
    return generator


def _vllm(explicit: str | None, server_url: str | None, options: VLLMOptions, view: TrainerView,
          max_concurrent_rollouts: int) -> Generator:
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
    if max_concurrent_rollouts <= 1:
        options = replace(options, batch_window_s=0.0)  # one episode at a time: no other turn will join a batch
    return VLLMServerGenerator(url, options, model=view.vllm_server_model() if server_url else None)


def _trainer(view: TrainerView) -> Generator:
    from .trainer import TrainerGenerator

    provider = view.model_provider()
    tokenizer = view.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    processor = view.processing_class if supports_images(view.processing_class) else None
    return TrainerGenerator(provider, tokenizer, eos_token_ids(view.processing_class, provider()), pad,
                            processor=processor)
