"""What ``EvalRolloutWorker`` checks before it starts: its arguments against the trainer's configuration
(``check_arguments``), that the server it generates with takes images when the processing class makes them
(``check_served_model_takes_images``), and the images reserved per episode in flight (``episode_images``)."""

import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..evalprotocol import EvalSpec
from ..trajectory.content import supports_images
from ..trajectory.types import ProcessingClass, Prompt

if TYPE_CHECKING:  # named for the checker: TRL's async trainer is imported only where the worker is built
    from trl.experimental.async_grpo import AsyncGRPOConfig

logger = logging.getLogger(__name__)


def episode_images(
    spec: EvalSpec,
    prompts: Sequence[Prompt],
    num_generations: int,
    max_buffered_images: int | None,
    max_episode_images: int | None,
) -> int | None:
    """The images reserved per episode in flight: ``max_episode_images``, or with ``max_buffered_images`` on an
    OpenEnv eval the most its episodes render at one image per observation (the prompt's images plus one per step);
    a bound smaller than one group's reservations is refused (a group is released whole: it could never be)."""
    from ..evalprotocol.inputs import initial_messages
    from ..trajectory.content import image_parts, template_messages

    if max_buffered_images is None:
        return max_episode_images
    if max_episode_images is None:
        if spec.prompt_builder is None:
            raise ConfigError(
                f"EvalRolloutWorker(max_buffered_images={max_buffered_images}) reserves the most images an episode "
                f"can hold for each episode in flight, and {spec.qualified_name} runs {spec.processor_name}, whose "
                "turns (and their images) its processor decides. Pass max_episode_images=..., the most images one "
                "episode holds (its prompt's and every turn's)."
            )
        prompt_images = max(
            len(image_parts(template_messages(initial_messages(prompt, k), images=True)[0]))
            for k, prompt in enumerate(prompts)
        )
        max_episode_images = prompt_images + spec.max_steps
        how = (
            f"its prompt's {prompt_images} plus one per environment step, steps={spec.max_steps}; pass "
            "max_episode_images=... if its observations hold another number"
        )
    else:
        how = "max_episode_images"
    group = num_generations * max_episode_images
    if max_buffered_images < group:
        raise ConfigError(
            f"EvalRolloutWorker(max_buffered_images={max_buffered_images}) is below one prompt group's worst case: "
            f"num_generations={num_generations} episodes of up to {max_episode_images} images each ({how}) = {group}. "
            "A group is released whole, so the worker could never release one. Pass max_buffered_images >= "
            f"{group} (slots x {max_episode_images} keeps every episode slot busy), or fewer num_generations or "
            "environment steps."
        )
    return max_episode_images


def check_arguments(
    args: "AsyncGRPOConfig",
    processing_class: ProcessingClass,
    options: Mapping[str, object],
    max_buffered_images: int | None,
    max_episode_images: int | None,
) -> None:
    """Refuse what the worker cannot train on: sampling the trainer does not assume, a server other than the
    trainer's, shard processes, a processing class whose images cannot be matched to its placeholders."""
    for name, off in (("top_p", 1.0), ("top_k", 0), ("min_p", 0.0), ("repetition_penalty", 1.0)):
        value = getattr(args, name, None)
        if value is not None and value != off:
            raise ConfigError(
                f"AsyncGRPOConfig({name}={value!r}): AsyncGRPOTrainer computes the policy's logprobs "
                "at the temperature over the whole vocabulary, so samples must come from that "
                f"distribution; leave {name} at {off!r}."
            )
    if "vllm_base_url" in options or "backend" in options:
        raise ConfigError(
            "EvalRolloutWorker generates on AsyncGRPOConfig(vllm_server_base_url=...), the server the "
            "trainer keeps on its weights; pass no vllm_base_url or backend."
        )
    rollout_options = options.get("options")
    if rollout_options is not None and getattr(rollout_options, "worker_processes", 1) > 1:
        raise ConfigError(
            f"EvalRolloutWorker(options=RolloutOptions(worker_processes="
            f"{getattr(rollout_options, 'worker_processes')})): the worker plays one continuous stream of "
            "episodes in this process; shard processes split rollout_func calls. Leave "
            "worker_processes at 1 (raise max_concurrent_rollouts for more episodes at once)."
        )
    if max_buffered_images is not None and max_buffered_images < 1:
        raise ConfigError(
            f"EvalRolloutWorker(max_buffered_images={max_buffered_images}): the bound must be at least 1 "
            "(None: no bound beyond buffer_size)."
        )
    if max_episode_images is not None and max_episode_images < 1:
        raise ConfigError(
            f"EvalRolloutWorker(max_episode_images={max_episode_images}): an episode holds at least one "
            "image where images are bounded (None: ep_trl derives it, see max_buffered_images)."
        )
    if supports_images(processing_class):
        from ..trajectory.sample_images import image_token_id

        try:
            image_token_id(processing_class)
        except ValueError as exc:
            raise ConfigError(f"EvalRolloutWorker(processing_class={type(processing_class).__name__}): {exc}") from exc
    elif max_buffered_images is not None or max_episode_images is not None:
        name, value = (
            ("max_buffered_images", max_buffered_images)
            if max_buffered_images is not None
            else ("max_episode_images", max_episode_images)
        )
        raise ConfigError(
            f"EvalRolloutWorker({name}={value}) bounds the images of samples, "
            f"and {type(processing_class).__name__} renders none (a text tokenizer); leave it unset."
        )


def check_served_model_takes_images(url: str, model: str, processing_class: ProcessingClass) -> None:
    """Refuse a server whose model cannot take the images ``processing_class`` renders (a text-only model, or another
    vision-language model's image token), read from the served model's local directory; a model served under a
    name that is no local directory (a hub id, ``--served-model-name``) is not checked (said in the log)."""
    from pathlib import Path

    from ..trajectory.sample_images import config_image_token, image_token_id

    if not Path(model).is_dir():
        logger.info(
            "The vLLM server at %s serves %r, no local directory: whether it takes %s's images is not "
            "checked here (a text-only model fails every episode).",
            url,
            model,
            type(processing_class).__name__,
        )
        return
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model)
    kind = type(processing_class).__name__
    if config.get_text_config() is config:
        raise ConfigError(
            f"The vLLM server at {url} serves {model}, a text-only model ({config.model_type}): it "
            f"cannot take the images {kind} renders. Start the server on the vision-language model the "
            "processing class belongs to, or pass the text tokenizer (processing_class.tokenizer) to train "
            "this model without images."
        )
    served_token = config_image_token(config)
    if served_token is not None and int(served_token) != image_token_id(processing_class):
        raise ConfigError(
            f"The vLLM server at {url} serves {model}, whose image token is id {served_token}, and "
            f"{kind}'s is id {image_token_id(processing_class)}: the processing class is not this model's. Pass "
            f"AutoProcessor.from_pretrained({model!r})."
        )
