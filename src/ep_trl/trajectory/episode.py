"""What an episode is, whichever source plays it: its plan, its result (``Episode``), how it fails
(``EpisodeFailure``, :data:`FAILURE_KINDS`) and the turns it sampled.

The OpenEnv loop (``ep_trl.openenv.loop``) and the processor source (``ep_trl.sources.processor``) both build these;
the capture processors, the scoring, the stream and the ``ep logs`` rows read them. They sit here, with the
trajectory an episode holds, so that every one of those packages can import them without importing each other.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, NotRequired, TypedDict, Unpack, get_args

from .tokens import Trajectory, TurnLimits
from .types import MessageView

#: What may end an episode as failed: the environment (construction, reset, step), the eval's own code (its
#: action parser), or the generation of this episode's turns. Anything else is ep_trl's bug or a configuration
#: error and raises out of the rollout call.
FailureKind = Literal["environment", "eval_code", "generation"]
FAILURE_KINDS: tuple[FailureKind, ...] = get_args(FailureKind)


#: How an episode ended: played to its end, or failed (``error_kind`` says by what; the episode is not scored).
EpisodeStatus = Literal["finished", "error"]
#: Why an episode stopped: the environment said done, the eval's turn limit, the token budget (the next turn would
#: not fit), or a failure.
StopReason = Literal["done", "max_steps", "token_budget", "error"]


@dataclass(frozen=True)
class EpisodePlan:
    """Which episode to play: its place in the batch, its prompt group, its task and the messages it starts from
    (built by the source from the stream's ``EpisodeRequest``)."""

    index: int
    group: int
    member: int
    task: str | None
    initial_messages: tuple[MessageView, ...]
    #: The ``seed`` its environment's reset asks for (``EvalOverrides(reset_seed=...)``); None: reset names none.
    seed: int | None = None
    #: More keyword arguments of its reset (``EvalOverrides(reset_kwargs=...)``); None: none.
    reset_kwargs: Mapping[str, object] | None = None


@dataclass(frozen=True)
class ModelTurn:
    """One model turn of an episode: the text it sampled, and whether it was a well-formed action (OpenEnv loop: the
    eval's action parser neither raised nor returned its fallback, ``action_parser("")``; a processor that offered
    tools: the reply parsed into a call of one of them; a processor that offered none: always)."""

    text: str
    well_formed: bool


@dataclass(frozen=True)
class Episode:
    """One finished (or failed) episode."""

    plan: EpisodePlan
    trajectory: Trajectory
    messages: tuple[MessageView, ...]
    step_rewards: tuple[float, ...]
    actions: tuple[str, ...]
    status: EpisodeStatus
    stop_reason: StopReason
    error: str | None
    error_kind: FailureKind | None  # when the episode failed
    duration_s: float
    prompt_tokens: int
    prompt_builder_failures: int = 0
    budget_blocked_tokens: int = 0  # the bridge that no longer fit when stop_reason is "token_budget"
    forked_segments: int = 0  # conversations a processor abandoned (ep_trl.capture.placement), not trained on
    turns: tuple[ModelTurn, ...] = ()  # the model's turns, in order, each with whether its action was well formed
    #: Which instance the episode played, as the environment's reset observation says in its ``metadata`` (e.g. the
    #: doors game's ``{"seed": ..., "wording": ...}``); None when it says nothing.
    instance: Mapping[str, object] | None = None

    @property
    def num_turns(self) -> int:
        return len(self.trajectory.sampled_segments())


class EpisodeFields(TypedDict):
    """The fields of :class:`Episode` that ``ended_episode`` takes as keywords (the rest it derives)."""

    trajectory: Trajectory
    messages: tuple[MessageView, ...]
    step_rewards: tuple[float, ...]
    actions: tuple[str, ...]
    duration_s: float
    prompt_tokens: int
    prompt_builder_failures: NotRequired[int]
    budget_blocked_tokens: NotRequired[int]
    forked_segments: NotRequired[int]
    turns: NotRequired[tuple[ModelTurn, ...]]
    instance: NotRequired[Mapping[str, object] | None]


class EpisodeFailure(Exception):
    """An episode ended early by one of :data:`FAILURE_KINDS`; ``cause`` is the original error."""

    def __init__(self, kind: FailureKind, cause: BaseException, detail: str | None = None) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}" + (f" ({detail})" if detail else ""))
        self.kind = kind
        self.cause = cause


def ended_episode(
    plan: EpisodePlan, failure: EpisodeFailure | None, stop_reason: StopReason, **fields: Unpack[EpisodeFields]
) -> Episode:
    """The ``Episode`` of ``plan``, finished with ``stop_reason``, or, given ``failure``, failed: status and stop reason
    "error", the failure's message and kind. ``fields`` are the rest of :class:`Episode`'s fields."""
    return Episode(
        plan=plan,
        status="error" if failure else "finished",
        stop_reason="error" if failure else stop_reason,
        error=str(failure) if failure else None,
        error_kind=failure.kind if failure else None,
        **fields,
    )


def check_first_prompt(n: int, limits: TurnLimits, fix: str) -> None:
    """A first prompt that leaves no room to sample fails the episode (as generation: the backend's limit)."""
    if limits.max_model_len is not None and n >= limits.max_model_len:
        raise EpisodeFailure(
            "generation",
            ValueError(f"the first prompt is {n} tokens, not below max_model_len {limits.max_model_len}; {fix}"),
        )
