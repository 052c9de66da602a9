"""``ep-trl train --warm-start DEMOS.jsonl``: a supervised warm start on demonstrations before GRPO.

A model whose first turn never has the eval's action format (a model that never calls the one tool the eval offers,
say) gives GRPO nothing to rank. A short fine-tune on demonstrations of the format fixes that: each demonstration is
one conversation, rendered with the run's chat template exactly as ep_trl renders the turns of an episode (the
messages in the chat template's form, the tools the processor offered, the run's ``--chat-template-kwargs``), and
the loss is the plain next-token loss on the tokens of its assistant turns only: the system, user and tool messages
and the template text between turns are context.

The file is read and checked by ``ep_trl.cli.demonstrations`` (its line formats);
``python -m ep_trl.devtools.record_demonstrations`` records such lines by playing an eval with a scripted player.

Where each assistant turn's tokens are is found from the template alone: the conversation up to the turn, rendered
with the generation prompt (what the model is prompted with at that turn), must be the start of the conversation
rendered through the turn; the difference is the turn, as the model writes it. Its tokens are encoded on their own,
as a sampled turn's are, and the turn ends at its end-of-turn token (what follows it, such as a newline, is template
text the next turn's prompt holds). A template that renders earlier turns differently once later ones follow (one
that drops earlier reasoning) is refused, naming the turn.

The warm-started model is saved under the run folder (``warm-start/``, weights and processing class) and is what GRPO
starts from: the trainer loads it, a colocated engine is built on it, and a vLLM server the run generates on is given
its weights (through disk, as ``DiskSyncGRPOTrainer`` pushes them) before the held-out "before" score and before
training.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..trajectory.types import MessagesView, Settings, Tools
from .demonstrations import Demonstration, Demonstrations

if TYPE_CHECKING:
    import torch

    from ..trajectory.template import ChatTemplate
    from ..trajectory.types import ProcessingClass

#: The folder of the run folder the warm-started model is saved in.
WARM_START_DIR = "warm-start"


@dataclass(frozen=True)
class Example:
    """A demonstration as token ids, and which of them are assistant-turn tokens the loss trains on."""

    ids: tuple[int, ...]
    trained: tuple[bool, ...]
    #: Assistant-turn tokens cut by the length limit.
    cut: int = 0

    @property
    def trained_tokens(self) -> int:
        return sum(self.trained)


@dataclass(frozen=True)
class WarmStartSettings:
    """How the warm start trains: epochs over the demonstrations, AdamW's learning rate, demonstrations per optimizer
    step, and the tokens kept per demonstration (None: its first prompt plus ``max_completion_length``, as an episode
    is cut)."""

    epochs: int = 1
    learning_rate: float = 5e-5
    batch_size: int = 4
    max_length: int | None = None
    max_completion_length: int = 256
    seed: int = 42

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"--warm-start-epochs {self.epochs}: give 1 or more")
        if not self.learning_rate > 0:
            raise ConfigError(f"--warm-start-learning-rate {self.learning_rate:g}: give a positive rate, e.g. 5e-5")
        if self.batch_size < 1:
            raise ConfigError(f"--warm-start-batch-size {self.batch_size}: give 1 or more")
        if self.max_length is not None and self.max_length < 2:
            raise ConfigError(
                f"--warm-start-max-length {self.max_length}: give 2 or more tokens, or leave it unset "
                "(each demonstration's first prompt plus --max-completion-length)"
            )


@dataclass(frozen=True)
class WarmStartReport:
    """What the warm start did: the file, its lines, the epochs, the assistant tokens trained (over all epochs), the
    tokens the demonstrations hold, the assistant tokens the length limit cut, the mean loss of the first and last
    epoch, the seconds it took (the weights pushed to a server included) and where the model was saved."""

    file: str
    lines: int
    epochs: int
    tokens_trained: int
    tokens: int
    tokens_cut: int
    loss_first_epoch: float
    loss_last_epoch: float
    seconds: float
    model_dir: str

    def record(self) -> dict[str, object]:
        """``result.json``'s ``warm_start``."""
        return {
            "file": self.file,
            "lines": self.lines,
            "epochs": self.epochs,
            "tokens_trained": self.tokens_trained,
            "tokens": self.tokens,
            "tokens_cut": self.tokens_cut,
            "loss_first_epoch": round(self.loss_first_epoch, 4),
            "loss_last_epoch": round(self.loss_last_epoch, 4),
            "seconds": round(self.seconds, 1),
            "model_dir": self.model_dir,
        }


def render_example(
    template: ChatTemplate,
    demonstration: Demonstration,
    stop_ids: Sequence[int],
    max_completion_length: int,
    max_length: int | None = None,
) -> Example:
    """``demonstration`` as ids and its trained mask: the context of each assistant turn (rendered with the
    generation prompt, as the turn is prompted) untrained, the turn's own tokens, through its end-of-turn token
    (one of ``stop_ids``), trained. Cut at ``max_length`` tokens (None: the first prompt plus
    ``max_completion_length``)."""
    where = f"--warm-start line {demonstration.line}"
    messages: MessagesView = [dict(m) for m in demonstration.messages]
    tools: Tools | None = [dict(t) for t in demonstration.tools] if demonstration.tools else None
    ids: list[int] = []
    trained: list[bool] = []
    rendered = ""
    prompt_length: int | None = None
    stops = set(stop_ids)
    for k, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        context = _render(template, where, messages[:k], tools, True)
        turn = _render(template, where, messages[: k + 1], tools, False)
        for text, before, what in (
            (context, rendered, f"message {k} (an assistant turn)"),
            (turn, context, f"message {k} (an assistant turn) included"),
        ):
            if not text.startswith(before):
                raise ConfigError(
                    f"{where}: the chat template renders the conversation up to {what} so that what came before it "
                    "reads differently (it is not the start of the longer text), so the turn's tokens cannot be told "
                    "apart. The warm start needs a template that renders earlier turns the same whatever follows "
                    "(templates that drop earlier reasoning, such as Qwen3's, do not); give the model such a chat "
                    "template"
                )
        missing = [
            name
            for call in message.get("tool_calls") or ()
            if (name := call["function"]["name"]) not in turn[len(context) :]
        ]
        if missing:
            raise ConfigError(
                f"{where}: message {k} calls {', '.join(missing)}, and the chat template leaves the call out of the "
                "turn it renders: it has no tool-call format, so the model would learn to write nothing. Give the "
                "model a chat template with a tool-call format (a Qwen2.5-style template, for instance)"
            )
        context_ids = template.encode(context[len(rendered) :])
        ids += context_ids
        trained += [False] * len(context_ids)
        if prompt_length is None:
            prompt_length = len(ids)
        turn_ids = template.encode(turn[len(context) :])
        end = next((i + 1 for i, token in enumerate(turn_ids) if token in stops), len(turn_ids))
        ids += turn_ids
        trained += [True] * end + [False] * (len(turn_ids) - end)
        rendered = turn
    assert prompt_length is not None, "read_demonstrations refuses a line without an assistant turn"
    limit = max_length if max_length is not None else prompt_length + max_completion_length
    return Example(tuple(ids[:limit]), tuple(trained[:limit]), cut=sum(trained[limit:]))


def _render(
    template: ChatTemplate, where: str, messages: MessagesView, tools: Tools | None, generation_prompt: bool
) -> str:
    from jinja2 import TemplateError

    try:
        return template.render(messages, tools, generation_prompt=generation_prompt)
    except TemplateError as error:
        raise ConfigError(
            f"{where}: the chat template cannot render it ({error}); fix the line or give the model a "
            "chat template that renders these messages (tool calls and tool results included)"
        ) from error


def check_template(
    processing_class: ProcessingClass, demonstrations: Demonstrations, chat_template_kwargs: Settings | None
) -> None:
    """Render the first demonstration with ``processing_class`` (cheap): a template that cannot find its assistant
    turns is refused before anything heavy starts."""
    from ..trajectory.template import ChatTemplate
    from ..trajectory.tokens import eos_token_ids

    try:
        template = ChatTemplate(processing_class, chat_template_kwargs)
    except ValueError as error:  # no chat template, or none that can count its images
        raise ConfigError(f"--warm-start renders the demonstrations with the model's chat template: {error}") from error
    render_example(template, demonstrations.lines[0], eos_token_ids(processing_class, None), 1)


def examples(
    processing_class: ProcessingClass,
    demonstrations: Demonstrations,
    settings: WarmStartSettings,
    chat_template_kwargs: Settings | None,
    stop_ids: Sequence[int],
) -> list[Example]:
    """Every demonstration rendered (:func:`render_example`); refused when none has a token left to train."""
    from ..trajectory.template import ChatTemplate

    template = ChatTemplate(processing_class, chat_template_kwargs)
    out = [
        render_example(template, d, stop_ids, settings.max_completion_length, settings.max_length)
        for d in demonstrations.lines
    ]
    if not any(e.trained_tokens for e in out):
        raise ConfigError(
            f"--warm-start {demonstrations.path}: the length limit cuts every assistant turn; raise "
            "--warm-start-max-length (or --max-completion-length)"
        )
    return out


def train_on(
    model: torch.nn.Module, examples_: Sequence[Example], settings: WarmStartSettings, pad_id: int, device: str
) -> list[float]:
    """Fine-tune ``model`` in place on ``examples_``: AdamW, shuffled batches of ``settings.batch_size``, the mean
    next-token loss over the trained tokens of a batch. Returns each epoch's mean batch loss."""
    import torch

    trainable = [e for e in examples_ if e.trained_tokens]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=settings.learning_rate)
    order = random.Random(settings.seed)
    model.train()
    losses: list[float] = []
    for _ in range(settings.epochs):
        shuffled = list(trainable)
        order.shuffle(shuffled)
        epoch: list[float] = []
        for start in range(0, len(shuffled), settings.batch_size):
            batch = shuffled[start : start + settings.batch_size]
            width = max(len(e.ids) for e in batch)
            ids = torch.tensor([list(e.ids) + [pad_id] * (width - len(e.ids)) for e in batch], device=device)
            attention = torch.tensor([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in batch], device=device)
            labels = torch.tensor(
                [[t if m else -100 for t, m in zip(e.ids, e.trained)] + [-100] * (width - len(e.ids)) for e in batch],
                device=device,
            )
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
                loss = model(input_ids=ids, attention_mask=attention, labels=labels).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            epoch.append(float(loss.detach()))
        losses.append(sum(epoch) / len(epoch))
    model.eval()
    return losses


def load_processing_class(model: str) -> ProcessingClass:
    """The processing class ``GRPOTrainer`` builds for ``model`` (``AutoProcessor``, padding and truncation on the
    left)."""
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model, truncation_side="left", padding_side="left")


def warm_start(
    model: str,
    demonstrations: Demonstrations,
    out_dir: Path,
    settings: WarmStartSettings,
    *,
    processing_class: ProcessingClass | None = None,
    chat_template_kwargs: Settings | None = None,
    server_url: str | None = None,
) -> WarmStartReport:
    """Fine-tune ``model`` on ``demonstrations`` (their assistant turns only), save it with its processing class in
    ``out_dir``, and, given ``server_url``, load its weights into that vLLM server (in dev mode, on this machine)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ..trajectory.content import tokenizer_of
    from ..trajectory.tokens import eos_token_ids

    started = time.monotonic()
    processing_class = processing_class if processing_class is not None else load_processing_class(model)
    policy = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.nn.Module.to(policy, device)  # transformers' typed wrapper of .to takes no device name
    tokenizer = tokenizer_of(processing_class)
    made = examples(
        processing_class, demonstrations, settings, chat_template_kwargs, eos_token_ids(processing_class, policy)
    )
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    losses = train_on(policy, made, settings, int(pad if pad is not None else 0), device)
    if not all(math.isfinite(loss) for loss in losses):
        raise ConfigError(
            f"--warm-start: the loss became {losses[-1]} (epoch losses {losses}); lower --warm-start-learning-rate"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    policy.save_pretrained(out_dir)
    processing_class.save_pretrained(out_dir)
    if server_url is not None:
        push_weights(policy, server_url)
    return WarmStartReport(
        file=str(demonstrations.path),
        lines=len(demonstrations.lines),
        epochs=settings.epochs,
        tokens_trained=settings.epochs * sum(e.trained_tokens for e in made),
        tokens=sum(len(e.ids) for e in made),
        tokens_cut=sum(e.cut for e in made),
        loss_first_epoch=losses[0],
        loss_last_epoch=losses[-1],
        seconds=time.monotonic() - started,
        model_dir=str(out_dir),
    )


def push_weights(model: torch.nn.Module, server_url: str) -> None:
    """Load ``model``'s weights into the vLLM server at ``server_url`` through disk (``DiskWeightSync``: the server
    runs in dev mode on this machine), so that it serves the warm-started policy."""
    from ..trainers.disk_weights import DiskWeightSync

    sync = DiskWeightSync(server_url)
    try:
        sync.check_server()
        sync.push(model, step=0)
    finally:
        sync.close()
