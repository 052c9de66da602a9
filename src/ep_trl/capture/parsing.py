"""The model's own tool-call format, parsed with the parser TRL and transformers provide for its chat template.

``trl.chat_template_utils.add_response_schema`` knows the response formats of the common chat templates (Qwen,
Llama 3, GLM, gpt-oss, Gemma, ...) and ``parse_response`` reads a sampled turn into ``content`` and ``tool_calls``,
typing arguments by the tool's JSON schema and falling back to plain text when the model's call is malformed.
ep_trl sets the format on a copy of the tokenizer, so the trainer's own is left as it was.

A model whose own template has no tool-call format TRL knows (SmolLM2's ChatML, for one) can take one that has:
:func:`use_chat_template` puts a template TRL ships (``trl/chat_templates/NAME.jinja``, e.g. ``qwen2_5``) or a
``.jinja`` file on the processing class the trainer is given, after checking that the tokenizer has the template's
special tokens (``ep-trl train --chat-template``).
"""

import copy
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..trajectory.content import tokenizer_of
from ..trajectory.types import Message, ProcessingClass, Tokenizer, Tools

logger = logging.getLogger(__name__)


class ToolCallParser:
    """Reads tool calls from sampled ids, in the format of the trainer's chat template."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        from trl.chat_template_utils import add_response_schema

        self._tokenizer = copy.copy(tokenizer)
        self._unsupported_reason = ""
        self.supported = any(
            getattr(tokenizer, name, None) is not None for name in ("response_template", "response_schema")
        )
        if not self.supported:
            try:
                add_response_schema(self._tokenizer)
                self.supported = True
            except ValueError as exc:  # TRL knows no response format for this template
                self._unsupported_reason = str(exc)

    @property
    def unsupported_reason(self) -> str:
        """TRL's reason when it knows no tool-call format for the template; empty when it knows one."""
        return self._unsupported_reason

    def check(self, tools: Tools | None) -> None:
        """A request that offers tools needs a parser for the model's tool calls."""
        if tools and not self.supported:
            raise ConfigError(
                "The eval offers the model tools, but TRL knows no tool-call format for the trainer's chat template "
                f"({self._unsupported_reason}). {TOOL_TEMPLATE_FIX}"
            )

    def __call__(self, ids: Sequence[int], prefix: Sequence[int], tools: Tools | None) -> Message:
        """``{"role": "assistant", "content": ..., "tool_calls": [...]}``; arguments as objects."""
        from trl.chat_template_utils import parse_response

        return parse_response(
            self._tokenizer, list(ids), prefix=list(prefix), tools=[dict(tool) for tool in tools] if tools else None
        )


#: How to give a model a tool-call format, named wherever its absence is refused.
TOOL_TEMPLATE_FIX = (
    "Give the model a chat template with a tool-call format TRL knows: `ep-trl train --chat-template "
    "qwen2_5` (TRL's Qwen 2.5 template: ChatML, tool calls in <tool_call> blocks), or in Python "
    "ep_trl.capture.parsing.use_chat_template(tokenizer, 'qwen2_5') on the trainer's processing "
    "class; or use a model whose own template has one (Qwen, Llama 3.1, GLM, gpt-oss, Gemma 4)."
)


def trl_chat_templates_dir() -> Path:
    """Where the installed TRL keeps the chat templates it ships (``NAME.jinja``)."""
    import trl.chat_template_utils

    return Path(trl.chat_template_utils.__file__).parent / "chat_templates"


def shipped_chat_templates() -> list[str]:
    """The names of the chat templates TRL ships (``qwen2_5``, ``llama3_1``, ...), sorted."""
    return sorted(path.stem for path in trl_chat_templates_dir().glob("*.jinja"))


@dataclass(frozen=True)
class ChosenTemplate:
    """A chat template chosen by name or path: what was asked for, the file it was read from, and its text."""

    name: str
    path: Path
    text: str


def load_chat_template(name_or_path: str) -> ChosenTemplate:
    """The chat template ``name_or_path`` names: a ``.jinja`` file, or the name of one TRL ships (``qwen2_5``);
    ``ConfigError`` listing the shipped names when it is neither."""
    path = Path(name_or_path).expanduser()
    if name_or_path.endswith(".jinja") or path.is_file():
        if not path.is_file():
            raise ConfigError(
                f"chat template {name_or_path!r}: no such file. Give a .jinja file, or one of the "
                f"templates TRL ships: {', '.join(shipped_chat_templates())}"
            )
        return ChosenTemplate(name_or_path, path.resolve(), path.read_text(encoding="utf-8"))
    shipped = trl_chat_templates_dir() / f"{name_or_path}.jinja"
    if "/" in name_or_path or not shipped.is_file():
        raise ConfigError(
            f"chat template {name_or_path!r} is neither a .jinja file nor a template TRL ships; TRL "
            f"ships: {', '.join(shipped_chat_templates())}"
        )
    return ChosenTemplate(name_or_path, shipped, shipped.read_text(encoding="utf-8"))


#: Control tokens a template writes literally: ``<|im_start|>``, ``<|eot_id|>``, DeepSeek's ``<｜Assistant｜>``. A
#: tokenizer without them as single tokens would encode them as plain text, which the model never learned to read.
_SPECIAL = re.compile(r"<\|[^|<>\s'\"]{1,64}\|>|<｜[^｜<>\s'\"]{1,64}｜>")


def template_special_tokens(text: str) -> list[str]:
    """The control tokens a chat template writes (``<|...|>`` and ``<｜...｜>``), in order of first use."""
    return list(dict.fromkeys(_SPECIAL.findall(text)))


def missing_special_tokens(tokenizer: Tokenizer, text: str) -> list[str]:
    """The control tokens of the template ``text`` that ``tokenizer`` does not encode as one token."""
    return [
        token for token in template_special_tokens(text) if len(tokenizer.encode(token, add_special_tokens=False)) != 1
    ]


def use_chat_template(processing_class: ProcessingClass, name_or_path: str | ChosenTemplate) -> ChosenTemplate:
    """Give ``processing_class`` (a tokenizer, or a multimodal processor and its tokenizer) the chat template
    ``name_or_path`` names (:func:`load_chat_template`), in place; pass it to the trainer as ``processing_class``
    (ep_trl renders and parses every turn with the trainer's processing class). ``ConfigError`` naming the tokens
    when the template writes control tokens the tokenizer does not have."""
    chosen = load_chat_template(name_or_path) if isinstance(name_or_path, str) else name_or_path
    tokenizer = tokenizer_of(processing_class)
    missing = missing_special_tokens(tokenizer, chosen.text)
    if missing:
        have = ", ".join(t for t in template_special_tokens(str(tokenizer.chat_template or "")) if t not in missing)
        raise ConfigError(
            f"chat template {chosen.name!r} writes {', '.join(missing)}, which this tokenizer does not have as "
            f"special tokens (its own template uses: {have or 'none of that form'}): the model would read them as "
            "plain text it never learned. Choose a template written with this tokenizer's special tokens (for a "
            "ChatML model, with <|im_start|> and <|im_end|>: qwen2_5), or add the tokens and train the model on them "
            "first."
        )
    processing_class.chat_template = chosen.text
    if tokenizer is not processing_class:
        tokenizer.chat_template = chosen.text
    return chosen


def tool_call_format_missing(tokenizer: Tokenizer) -> str | None:
    """Why TRL knows no tool-call format for ``tokenizer``'s chat template; None when it knows one."""
    parser = ToolCallParser(tokenizer)
    return None if parser.supported else parser.unsupported_reason


def tool_templates_for(tokenizer: Tokenizer) -> list[str]:
    """The templates TRL ships that have a tool-call format TRL knows and only control tokens ``tokenizer`` has:
    the ones ``--chat-template`` can give this model for an eval that offers tools."""
    fitting = []
    for name in shipped_chat_templates():
        chosen = load_chat_template(name)
        if missing_special_tokens(tokenizer, chosen.text):
            continue
        trial = copy.copy(tokenizer)
        trial.chat_template = chosen.text
        if ToolCallParser(trial).supported:
            fitting.append(name)
    return fitting


def templated_processing_class(model: str, chat_template: ChosenTemplate) -> "ProcessingClass":
    """``model``'s processing class as ``GRPOTrainer`` loads it when given none (``AutoProcessor``, truncating and
    padding on the left), with ``chat_template`` in place of the model's own."""
    from transformers import AutoProcessor

    loaded = AutoProcessor.from_pretrained(model, truncation_side="left", padding_side="left")
    use_chat_template(loaded, chat_template)
    return loaded
