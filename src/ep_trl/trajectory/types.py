"""The shapes that cross ep_trl's layers, named once so every module says the same thing the same way: chat
messages and prompts (OpenAI's JSON form, as eval-protocol, TRL's chat templates and vLLM read them), tool schemas,
eval-protocol rows, and JSON bodies.

A leaf module (it imports nothing of ep_trl), so the adapters, the sources, the capture endpoint and eval-protocol's
boundary can all import it without an import pointing up. It sits in ``trajectory`` because a trajectory is made of
these: the prompt, its messages and the tools its template renders.

The message aliases keep ``Any`` for a field's value: a message's ``content`` is a string or a list of content parts,
``tool_calls`` a list of objects, and providers add fields of their own; the code that reads a field checks its type
(``trajectory.content``, ``capture.wire``).
"""

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:  # names for the checker only: ``import ep_trl`` imports neither transformers nor PIL
    from PIL.Image import Image as PILImage
    from transformers import PreTrainedModel, PreTrainedTokenizerBase, ProcessorMixin

#: A JSON object, as ``json.loads`` returns it or ``json.dumps`` takes it: a request or response body.
JSONObject: TypeAlias = dict[str, Any]
#: Keyword settings read and passed on (completion params, chat-template keywords, ``evaluation_test`` keywords).
Settings: TypeAlias = Mapping[str, Any]

#: One chat message that ep_trl builds: ``{"role": ..., "content": ..., "tool_calls": [...], ...}``.
Message: TypeAlias = dict[str, Any]
#: A conversation that ep_trl builds.
Messages: TypeAlias = list[Message]
#: One chat message that is only read (a dict, or a mapping another library made).
MessageView: TypeAlias = Mapping[str, Any]
#: A conversation that is only read.
MessagesView: TypeAlias = Sequence[MessageView]
#: One tool's schema as the eval offers it (``{"type": "function", "function": {...}}``).
Tool: TypeAlias = Mapping[str, Any]
#: The tools a turn offers.
Tools: TypeAlias = Sequence[Tool]

#: One prompt of TRL's dataset ``prompt`` column: a string, or a conversation (checked where an episode starts,
#: ``sources.initial_messages``).
Prompt: TypeAlias = str | MessagesView

#: eval-protocol's ``EvaluationRow`` (a pydantic model). eval-protocol ships no type information, so to mypy it is
#: ``Any``; the alias names what is passed, and keeps eval-protocol out of import time (it takes seconds to import).
Row: TypeAlias = Any

#: A Hugging Face tokenizer (``AutoTokenizer``'s), or a multimodal processor's ``.tokenizer``.
Tokenizer: TypeAlias = "PreTrainedTokenizerBase"
#: TRL's ``processing_class``: a tokenizer, or a multimodal processor (``AutoProcessor``'s: a tokenizer and an image
#: processor; ``trajectory.content.supports_images`` tells them apart).
ProcessingClass: TypeAlias = "PreTrainedTokenizerBase | ProcessorMixin"
#: A multimodal processor: its ``.tokenizer`` and ``.image_processor``, called on text and images together.
MultimodalProcessingClass: TypeAlias = "ProcessorMixin"
#: A Hugging Face model (the policy being trained).
Model: TypeAlias = "PreTrainedModel"
#: One image of a conversation, decoded (a ``PIL.Image.Image``).
Image: TypeAlias = "PILImage"
