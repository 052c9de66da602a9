"""One rollout's model calls, captured as a token-exact trajectory while the eval's processor drives them.

The processor sends the whole conversation with every call. Each call is placed against what the rollout holds:

- **first**: the rendered request (tools included) is the prompt;
- **extend**: the request repeats the held conversation (compared in canonical form, ``ep_trl.capture.wire``)
  and adds only non-assistant messages (tool results, user turns): the model continues from exactly the held ids,
  and what the template puts between the last sampled turn and the new generation prompt is inserted, masked
  (``ChatTemplate.bridge``: clean when the re-rendered conversation starts with the held ids, else realigned by the
  native path's rule and counted);
- **fork**: anything else (the processor dropped, rewrote or retried history, or changed the tools). Joining it to
  the held ids would train on a conversation the model never saw, so a new segment starts from a full render of the
  request. The rollout returns its last segment (the conversation the processor finished with, which the eval body
  scores); each earlier, discarded segment is counted (``ep_trl/forked_segments``) and logged.

When the episode's token budget (or ``max_model_len``) cannot hold the next turn, the call gets an empty
assistant reply that is not recorded, which ends a tool loop the way a model that stops calling tools does.
"""

import asyncio
import json
import logging
from dataclasses import dataclass, field, replace

from ..errors import ConfigError, UnsupportedEvalError
from ..generation import Generation, Generator
from ..trajectory.episode import EpisodeFailure, ModelTurn, StopReason, check_first_prompt
from ..trajectory.template import ChatTemplate, EpisodeImages
from ..trajectory.tokens import Trajectory, TrajectoryBuilder, TurnLimits
from ..trajectory.types import Message, MessagesView, MessageView, Tool
from .parsing import ToolCallParser
from .wire import Canonical, canonical, reply_message, template_form, tool_names

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TurnRequest:
    """One chat-completions call of a rollout, as the processor sent it."""

    messages: tuple[MessageView, ...]
    tools: tuple[Tool, ...] | None = None
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class TurnReply:
    """What the call returns: the assistant message, why the turn ended, and its token counts."""

    message: Message
    finish_reason: str
    prompt_tokens: int
    completion_ids: tuple[int, ...]


@dataclass
class _Segment:
    """One unbroken conversation of the rollout: its tokens and the canonical messages they hold."""

    builder: TrajectoryBuilder
    tools_key: str
    transcript: list[Canonical] = field(default_factory=list)
    last: Generation | None = None


class RolloutCapture:
    """The model calls of one rollout. Calls are taken one at a time (a rollout's turns are sequential)."""

    def __init__(
        self,
        token: str,
        label: str,
        limits: TurnLimits,
        template: ChatTemplate,
        generator: Generator,
        parser: ToolCallParser,
    ) -> None:
        self.token = token
        self.label = label
        self._limits = limits
        self._template = template
        self._generator = generator
        self._parser = parser
        self._segments: list[_Segment] = []
        #: The rollout's images, each processed once (``ChatTemplate.prepare_images``, before a call is placed).
        self._images = EpisodeImages()
        self._lock = asyncio.Lock()
        self.calls = 0
        self.unauthorized = 0  # requests that named this rollout without the call's key (answered 401)
        self.forks = 0
        self.prompt_tokens = 0
        self.stop_reason: StopReason = "done"
        self.budget_blocked_tokens = 0
        self.failure: EpisodeFailure | None = None  # this rollout's generation failed
        self.fatal: BaseException | None = None  # an error that is not the episode's own: raised by the driver
        #: The model's replies in order, each well formed when the call offered no tools or it parsed into a call of
        #: an offered one (``reply_message``).
        self.turns: list[ModelTurn] = []

    def trajectory(self, fallback_messages: MessagesView) -> Trajectory:
        """The last segment's tokens; before any call, the rendered ``fallback_messages`` as prompt alone (their
        images processed in a thread first by ``prepare_fallback``, when the caller is on the event loop)."""
        if self._segments:
            return self._template.carried(self._segments[-1].builder.build(), self._images)
        prompt = self._template.prompt(template_form(fallback_messages), images=self._images)
        return self._template.carried(TrajectoryBuilder.start(prompt).build(), self._images)

    async def prepare_fallback(self, fallback_messages: MessagesView) -> None:
        """Before any call: process the images of ``fallback_messages`` in a thread, for ``trajectory`` to render."""
        if not self._segments:
            await self._template.prepare_images(template_form(fallback_messages), self._images)

    async def turn(self, request: TurnRequest) -> TurnReply:
        """Generate the reply to one call and record its tokens. A generation error is the episode's own (kept in
        ``failure``); any other error is kept in ``fatal``; both propagate to the endpoint."""
        async with self._lock:
            self.calls += 1
            try:
                return await self._turn(request)
            except EpisodeFailure as exc:
                self.failure = exc
                raise
            except Exception as exc:
                self.fatal = exc
                raise

    async def _turn(self, request: TurnRequest) -> TurnReply:
        if self.stop_reason == "token_budget":
            return self._spent()
        self._parser.check(request.tools)
        messages = template_form(request.messages)
        await self._template.prepare_images(messages, self._images)  # the call's new images, in a thread
        segment = self._place(request, messages)
        if segment is None:
            return self._spent()
        prompt_ids = segment.builder.held_ids()
        self.prompt_tokens += len(prompt_ids)
        params = replace(
            self._limits.sampling,
            max_tokens=segment.builder.turn_budget(self._limits, request.max_tokens),
            stop=request.stop or self._limits.sampling.stop,
        )
        try:
            sampled = await self._generator.generate(prompt_ids, params, segment.builder.held_images())
        except (ConfigError, UnsupportedEvalError):
            raise  # ep_trl's configuration errors (a turn past max_episode_images) fail every episode alike
        except Exception as exc:
            raise EpisodeFailure("generation", exc) from exc
        generation = self._template.sampled_turn(sampled)
        segment.builder.add_sampled(generation)
        segment.last = generation
        text = self._template.decode(generation.token_ids)
        if generation.stop_text and generation.stop_text in text:
            text = text[: text.find(generation.stop_text)]
        parsed = self._parser(generation.token_ids, prompt_ids, request.tools) if request.tools else {}
        message = reply_message(parsed, text, tool_names(request.tools), f"call-{self.token}-{self.calls}")
        self.turns.append(ModelTurn(text, well_formed=bool(message.get("tool_calls")) if request.tools else True))
        segment.transcript.append(canonical(message))
        finish = "tool_calls" if message.get("tool_calls") else generation.finish_reason
        return TurnReply(message, finish, len(prompt_ids), generation.token_ids)

    def _place(self, request: TurnRequest, messages: MessagesView) -> _Segment | None:
        """The segment this call continues (its bridge inserted), a new one, or None when the budget is spent;
        ``messages`` are the request's in template form, their images processed already."""
        tools = list(request.tools) if request.tools else None
        sent = [canonical(m) for m in request.messages]
        tools_key = json.dumps(tools, sort_keys=True, default=str) if tools else ""
        current = self._segments[-1] if self._segments else None
        if current is not None and _extends(current, sent, tools_key):
            assert current.last is not None
            bridge, realigned = self._template.bridge(
                messages, current.builder.held(), current.last, self._limits.stop_token_ids, tools, self._images
            )
            if not current.builder.fits(len(bridge.ids) + 1, self._limits):
                self.budget_blocked_tokens = len(bridge.ids)
                self.stop_reason = "token_budget"
                return None
            current.builder.add_inserted(bridge)
            current.builder.realigned += int(realigned)
            current.transcript = sent
            return current
        if current is not None:
            self.forks += 1
            logger.warning(
                "%s: call %d does not continue the conversation the rollout holds (%s); its tokens start a "
                "new segment and the earlier one is not trained on (docs/processors.md, forks)",
                self.label,
                self.calls,
                _why_not(current, sent, tools_key),
            )
        prompt = self._template.prompt(messages, tools, self._images)
        check_first_prompt(len(prompt.ids), self._limits, "shorten the eval's messages")
        segment = _Segment(TrajectoryBuilder.start(prompt), tools_key, sent)
        self._segments.append(segment)
        return segment

    def _spent(self) -> TurnReply:
        return TurnReply({"role": "assistant", "content": ""}, "length", 0, ())


def _extends(segment: _Segment, sent: list[Canonical], tools_key: str) -> bool:
    """Whether the call's messages repeat the segment's and add only messages the model does not write."""
    n = len(segment.transcript)
    return (
        segment.last is not None
        and tools_key == segment.tools_key
        and len(sent) > n
        and sent[:n] == segment.transcript
        and all(role != "assistant" for role, _, _ in sent[n:])
    )


def _why_not(segment: _Segment, sent: list[Canonical], tools_key: str) -> str:
    if tools_key != segment.tools_key:
        return "the tools changed"
    n = len(segment.transcript)
    if sent[:n] != segment.transcript:
        diverged = next((i for i, (a, b) in enumerate(zip(sent, segment.transcript)) if a != b), min(n, len(sent)))
        return f"message {diverged} differs from the one held, or history was dropped"
    return "it adds no new message" if len(sent) <= n else "it adds an assistant message the model did not sample"
