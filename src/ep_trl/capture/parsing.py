"""The model's own tool-call format, parsed with the parser TRL and transformers provide for its chat template.

``trl.chat_template_utils.add_response_schema`` knows the response formats of the common chat templates (Qwen,
Llama 3, GLM, gpt-oss, Gemma, ...) and ``parse_response`` reads a sampled turn into ``content`` and ``tool_calls``,
typing arguments by the tool's JSON schema and falling back to plain text when the model's call is malformed.
ep_trl sets the format on a copy of the tokenizer, so the trainer's own is left as it was.
"""

import copy
import logging
from collections.abc import Sequence

from ..errors import ConfigError
from ..trajectory.types import Message, Tokenizer, Tools

logger = logging.getLogger(__name__)


class ToolCallParser:
    """Reads tool calls from sampled ids, in the format of the trainer's chat template."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        from trl.chat_template_utils import add_response_schema

        self._tokenizer = copy.copy(tokenizer)
        self._unsupported_reason = ""
        self.supported = any(getattr(tokenizer, name, None) is not None
                             for name in ("response_template", "response_schema"))
        if not self.supported:
            try:
                add_response_schema(self._tokenizer)
                self.supported = True
            except ValueError as exc:  # TRL knows no response format for this template
                self._unsupported_reason = str(exc)

    def check(self, tools: Tools | None) -> None:
        """A request that offers tools needs a parser for the model's tool calls."""
        if tools and not self.supported:
            raise ConfigError(
                "The eval offers the model tools, but TRL knows no tool-call format for the trainer's chat template "
                f"({self._unsupported_reason}). Use a model whose template TRL supports (Qwen, Llama 3, GLM, "
                "gpt-oss, Gemma) or set tokenizer.response_template before building the trainer.")

    def __call__(self, ids: Sequence[int], prefix: Sequence[int],
                 tools: Tools | None) -> Message:
        """``{"role": "assistant", "content": ..., "tool_calls": [...]}``; arguments as objects."""
        from trl.chat_template_utils import parse_response

        return parse_response(self._tokenizer, list(ids), prefix=list(prefix), tools=[dict(tool) for tool in tools] if tools else None)
