"""What a rollout call needs from its caller, read once into a :class:`CallSetup` and handed down.

A rollout call (``rollout_func``'s, a shard process's part of one) or a rollout worker's stream starts with
:meth:`CallReader.read`, the one place below the trainer adapters that reads a
:class:`~ep_trl.engine.caller.RolloutCaller`: its configuration, its model and its server or engine. What it reads is
handed down as plain values: the chat template, the settings (:mod:`ep_trl.engine.settings`), the generation backend
(:mod:`ep_trl.generation.choice`), the ``ep logs`` rows (:mod:`ep_trl.traininglog.rows`) and the episode sources never
ask the caller again. The chat template and the backend are built at the first read and kept for every later call.
"""

import logging

from ..errors import ConfigError
from ..evalprotocol.spec import EvalSpec
from ..generation import Generator
from ..generation.choice import make_generator
from ..options import Backend, VLLMOptions
from ..sources import CallSetup
from ..traininglog.rows import RowContext
from ..traininglog.writer import RolloutLogWriter
from ..trajectory.content import supports_images
from ..trajectory.template import ChatTemplate
from ..trajectory.types import Settings
from . import settings
from .caller import RolloutCaller

logger = logging.getLogger(__name__)


class CallReader:
    """Reads a caller into a :class:`CallSetup`; builds the chat template and the generation backend at the first
    read and keeps them (``aclose`` releases the backend)."""

    def __init__(
        self,
        spec: EvalSpec,
        *,
        backend: Backend,
        vllm_base_url: str | None,
        vllm: VLLMOptions,
        chat_template_kwargs: Settings | None,
        max_episode_tokens: int | None,
        invocation_id: str,
        log: RolloutLogWriter | None,
    ) -> None:
        self._spec = spec
        self._backend = backend
        self._vllm_base_url = vllm_base_url
        self._vllm = vllm
        self._chat_template_kwargs = chat_template_kwargs
        self._max_episode_tokens = max_episode_tokens
        self._invocation_id = invocation_id
        self._log = log
        self._template: ChatTemplate | None = None
        #: The generation backend, once the first read built it.
        self.generator: Generator | None = None

    def read(self, caller: RolloutCaller) -> CallSetup:
        """Everything a call needs from ``caller``, read now (the policy's step, its model's end-of-turn ids)."""
        config = caller.config
        provider = caller.model_provider()
        if self._template is None:
            self._template = ChatTemplate(
                config.processing_class, self._chat_template_kwargs, keep_pixels=caller.takes_processed_images
            )
            note = settings.sampling_note(self._spec, config.sampling)
            if note:
                logger.info(note)
        if self.generator is None:
            reach = self._backend != "trainer"  # the in-process backend asks for neither engine nor server
            self.generator = make_generator(
                self._backend,
                self._vllm_base_url,
                self._vllm,
                self._spec.max_concurrent_rollouts,
                colocated_trainer=caller.colocated_trainer() if reach else None,
                server=caller.synced_server() if reach else None,
                model_provider=provider,
                processing_class=config.processing_class,
            )
        _check_images(caller, self._spec)
        budget = self._max_episode_tokens or config.max_completion_length
        limits = settings.turn_limits(
            self._spec, config.sampling, budget, config.processing_class, provider, self.generator.max_model_len
        )
        context = RowContext(
            self._spec,
            self._invocation_id,
            self.generator.name,
            step=caller.step,
            tokenizer=config.tokenizer,
            sampling=config.sampling,
            model_name=caller.model_name,
        )
        return CallSetup(self._template, self.generator, limits, context, self._log)

    async def aclose(self) -> None:
        """Release the generation backend (a later read builds a new one)."""
        if self.generator is not None:
            await self.generator.aclose()
            self.generator = None


def _check_images(caller: RolloutCaller, spec: EvalSpec) -> None:
    """A processing class that renders images needs a caller that puts them into its forward passes."""
    processing_class = caller.config.processing_class
    if supports_images(processing_class) and not caller.takes_rollout_images:
        raise ConfigError(
            f"{type(processing_class).__name__} renders images into the episodes of {spec.name}, "
            "and the trainer would leave them out of its forward passes (TRL's rollout_func path drops them): the "
            "model would be trained on image tokens without their pixels. Train with "
            "ep_trl.trainers.images.RolloutImagesGRPOTrainer in place of GRPOTrainer, or pass the text tokenizer "
            "(processing_class.tokenizer) as the processing class (images are then dropped from the prompts)."
        )
