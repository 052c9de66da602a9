"""The chat template: the only text→ids step of an episode (prompt, bridges, tools and images), and how each image
of an episode is processed once.

Bridge rule. Render the whole conversation with the template. If that rendering starts with the tokens held
so far (the template is prefix-preserving and the sampled text re-tokenizes to the same ids), the bridge is
the rest of it ("clean"). Otherwise ("realigned": BPE re-tokenization differs, or the template rewrites
history, e.g. strips reasoning), the sampled ids are kept and the bridge is the template text that follows
the last assistant message, found by rendering it with a sentinel in place of its content; an end-of-turn
token the model already sampled is not repeated. Each realigned boundary is counted per episode.

Images. With a multimodal processing class (one with an ``image_processor``), every piece of template text is tokenized
by the processing class with its images, so the ids hold each image's expanded tokens (Qwen-VL: one ``<|image_pad|>``
per merged patch; Idefics3: ``<fake_token_around_image><global-img>`` + n ``<image>`` + ...). The trajectory keeps its
images in placeholder order across prompt and completion; an image that arrives with an observation is part of a
bridge, so its tokens are ``env_mask`` 0. It also keeps the same ids with the placeholders unexpanded, which is how a
vLLM engine takes a prompt with its images (``generation.PromptImages``).

Each image is processed once per episode. An episode renders its whole conversation every turn, so the processing class
would process every earlier screenshot again each turn (1 + 2 + ... + n processings). Instead the processing class
expands each image alone, once (:class:`EpisodeImages` keeps the expansion for the episode), and the expanded ids of a
text are its ids with each placeholder id replaced by its image's expansion: the same ids as the processing class gives
the whole text, for a fast tokenizer whose image placeholder and the tokens each expansion starts and ends with are
cut tokens (``cut_tokens``; a text cut there encodes part by part to the ids of the whole). A processing class for
which that does not hold has each render's images processed whole, with a warning. The episodes process an
observation's new images in a thread before they render it (:meth:`ChatTemplate.prepare_images`), so the event loop
that plays every episode in flight processes none.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, cast

from ..runtime.threads import run_blocking
from .content import image_parts, image_source, load_image, supports_images, template_messages, tokenizer_of
from .sampling import Generation
from .tokens import Encoded, PrefixEncoder, Trajectory, cut_tokens
from .types import (
    Image,
    MessagesView,
    MessageView,
    MultimodalProcessingClass,
    ProcessingClass,
    Settings,
    Tokenizer,
    Tools,
)

if TYPE_CHECKING:  # torch and numpy are imported by the processing class, not with ep_trl
    import torch


logger = logging.getLogger(__name__)

_SENTINEL = "\u2063ep_trl:assistant-content\u2063"

#: How long an episode waits for its new images to be processed (a thread) before the rollout fails.
_PREPARE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ImageExpansion:
    """One image as the processing class expands it on its own: ``ids`` replace its placeholder's id; ``pixels`` are
    the pixel tensors it made of the image (one row holding it alone), kept when the chat template keeps them
    (``ChatTemplate(keep_pixels=True)``), else None."""

    image: Image
    ids: tuple[int, ...]
    pixels: Mapping[str, torch.Tensor] | None = None


class EpisodeImages:
    """The images one episode has rendered, each with its expansion, processed once (``ChatTemplate.prepare_images``
    or at the first render that holds it). Keyed by the image part's source: a data URI, URL or path as the
    conversation holds it, or an image object by identity (the object is kept here, so its id is not reused). One per
    episode, dropped with it: nothing is shared across episodes, and an image is kept no longer than its episode
    keeps its messages anyway."""

    def __init__(self) -> None:
        self._expansions: dict[str | int, ImageExpansion] = {}
        self._by_image: dict[int, ImageExpansion] = {}  # by the decoded image's identity (each entry holds its image)
        self._objects: list[Image] = []  # the image objects keyed by identity, alive while their ids are keys
        #: How many images the processing class expanded for this episode (one each).
        self.processed = 0

    def get(self, source: str | Image) -> ImageExpansion | None:
        return self._expansions.get(source if isinstance(source, str) else id(source))

    def of(self, image: Image) -> ImageExpansion | None:
        """The expansion of a decoded image this episode rendered (an ``Encoded``'s image), by identity."""
        return self._by_image.get(id(image))

    def put(self, source: str | Image, expansion: ImageExpansion) -> None:
        """Keep ``expansion`` as ``source``'s (counted as one processing)."""
        if not isinstance(source, str):
            self._objects.append(source)
        self._expansions[source if isinstance(source, str) else id(source)] = expansion
        self._by_image[id(expansion.image)] = expansion
        self.processed += 1

    def __len__(self) -> int:
        return len(self._expansions)


class ChatTemplate:
    """Renders conversations with the trainer's processing class; the only place text becomes token ids."""

    def __init__(
        self, processing_class: ProcessingClass, template_kwargs: Settings | None = None, *, keep_pixels: bool = False
    ) -> None:
        self._renderer = processing_class
        #: Keep the pixel tensors each image's expansion makes, for trajectories to carry (``carried``).
        self._keep_pixels = keep_pixels
        self._tokenizer = tokenizer_of(processing_class)
        self._kwargs = dict(template_kwargs or {})
        self._images = supports_images(processing_class)  # else image parts are dropped, text parts joined
        #: The placeholder the template writes per image, counted to tell which images a piece of text holds.
        self._image_token = getattr(processing_class, "image_token", None) if self._images else None
        #: The placeholder's id, and the ids of the tokens an image's expansion may start and end with for the
        #: expanded ids to be spliced into a text's own (the tokenizer's cut tokens); None: every render's images are
        #: processed whole (the placeholder is not a cut token).
        self._image_token_id: int | None = None
        self._cut_ids: frozenset[int] = frozenset()
        #: Ids that stand for pixels (image and video placeholders); a turn never keeps one it sampled.
        self._placeholder_ids = frozenset(
            getattr(processing_class, name)
            for name in ("image_token_id", "video_token_id")
            if self._images and isinstance(getattr(processing_class, name, None), int)
        )
        #: Decoded images by source, held weakly: an episode re-renders its screenshots every turn and finds them
        #: here while it holds them, and the cache keeps none alive (the images a rollout worker holds are bounded).
        self._decoded: weakref.WeakValueDictionary[str, Image] = weakref.WeakValueDictionary()
        source = str(getattr(processing_class, "chat_template", None) or self._tokenizer.chat_template)
        # cut only before the special tokens the template writes (a text holds few others; any subset is exact)
        self._prefixes = PrefixEncoder(self._encode_whole, [t for t in cut_tokens(self._tokenizer) if t in source])
        self._warned_dropped_images = False
        if (
            getattr(self._tokenizer, "chat_template", None) is None
            and getattr(processing_class, "chat_template", None) is None
        ):
            raise ValueError(
                "The trainer's processing class has no chat template; multi-turn episodes need one. "
                "Load a chat/instruct tokenizer or set tokenizer.chat_template."
            )
        if self._images and not isinstance(self._image_token, str):
            raise ValueError(
                f"{type(processing_class).__name__} has an image processor but no image_token, so the images a "
                "piece of template text holds cannot be counted; use a processing class that names its image "
                "placeholder "
                "(Qwen-VL, Idefics3/SmolVLM, LLaVA processing classes do)."
            )
        if isinstance(self._image_token, str):
            cuts = cut_tokens(self._tokenizer)
            if self._image_token in cuts:
                self._image_token_id = _token_id(self._tokenizer, self._image_token)
                self._cut_ids = frozenset(_token_id(self._tokenizer, t) for t in cuts)
            else:
                self._whole_images(
                    f"its image placeholder {self._image_token!r} is not a token the tokenizer "
                    "always splits the text at"
                )

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def render(self, messages: MessagesView, tools: Tools | None = None, *, generation_prompt: bool = True) -> str:
        """The conversation as the model sees it, ending with the assistant's generation prompt (without it when
        ``generation_prompt`` is false: a conversation whose last assistant turn is complete); ``tools`` (JSON
        schemas, as an OpenAI request carries them) are rendered the template's way."""
        return self._render(messages, tools, generation_prompt)[0]

    def _render(
        self, messages: MessagesView, tools: Tools | None, generation_prompt: bool = True
    ) -> tuple[str, list[MessageView]]:
        """The rendered text and the image parts it holds, in placeholder order."""
        converted, dropped = template_messages(messages, images=self._images)
        if dropped and not self._warned_dropped_images:
            self._warned_dropped_images = True
            logger.warning(
                "The prompt builder returns image parts but %s is a text-only processing class: images "
                "are dropped and the text parts joined (see docs/browsergym.md, vision-language models).",
                type(self._renderer).__name__,
            )
        extra: Settings = {"tools": list(tools)} if tools else {}
        text = self._renderer.apply_chat_template(
            converted, tokenize=False, add_generation_prompt=generation_prompt, **extra, **self._kwargs
        )
        assert isinstance(text, str), "apply_chat_template(tokenize=False) returns the text"
        return text, image_parts(converted)

    def encode(self, text: str) -> list[int]:
        """``text`` as ids, as the tokenizer encodes it whole; a conversation's earlier turns are not encoded again
        (``PrefixEncoder``)."""
        return self._prefixes(text)

    def _encode_whole(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def _whole_images(self, why: str) -> None:
        """Process every render's images whole from now on (the expansions cannot be spliced), and say why once."""
        self._image_token_id = None
        logger.warning(
            "%s: %s, so each render processes every image of the conversation again (1 + 2 + ... + n "
            "processings for an episode of n images, on the episode's event loop) instead of each image "
            "once (docs/benchmarks.md).",
            type(self._renderer).__name__,
            why,
        )

    def encode_with_images(
        self, text: str, parts: Sequence[MessageView], images: EpisodeImages | None = None
    ) -> Encoded:
        """``text`` as ids with the images of ``parts`` (one per placeholder in ``text``, in order) expanded by the
        processing class; each image's expansion is taken from ``images`` (the episode's), or made and kept there
        (None: made for this call alone)."""
        ids = self.encode(text)
        if not self._images:
            return Encoded(tuple(ids))
        assert self._image_token is not None
        placeholders = text.count(self._image_token)
        if placeholders != len(parts):
            raise ValueError(
                f"the chat template wrote {placeholders} image placeholder(s) {self._image_token!r} for {len(parts)} "
                "image part(s); a template must write one placeholder per image part, in order."
            )
        if not parts:
            return Encoded(tuple(ids))
        if self._image_token_id is not None:
            episode = images if images is not None else EpisodeImages()
            expansions = [self._expansion(p, episode) for p in parts]
            if self._image_token_id is not None:  # each expansion starts and ends with a cut token
                return Encoded(
                    _spliced(ids, self._image_token_id, expansions), tuple(e.image for e in expansions), tuple(ids)
                )
        decoded = tuple(self._image(p) for p in parts)
        expanded = self._renderer(text=[text], images=[list(decoded)], add_special_tokens=False)["input_ids"][0]
        return Encoded(tuple(int(t) for t in expanded), decoded, tuple(ids))

    def _expansion(self, part: MessageView, images: EpisodeImages) -> ImageExpansion:
        """The part's image and its expansion: the episode's, or made now and kept there."""
        source = image_source(part)
        found = images.get(source)
        if found is None:
            found = self.expand(self._image(part))
            images.put(source, found)
        return found

    def expand(self, image: Image) -> ImageExpansion:
        """``image`` processed on its own: the ids its placeholder expands into. Thread-safe (``prepare_images``
        runs it in a thread). When the expansion does not start and end with a cut token, splicing it would not give
        the ids of the whole text: every later render's images are processed whole (with a warning)."""
        assert self._image_token is not None
        if self._keep_pixels:
            from .sample_images import pixel_outputs

            made = self._renderer(
                text=[self._image_token], images=[[image]], add_special_tokens=False, return_tensors="pt"
            )
            pixels = pixel_outputs(
                cast("MultimodalProcessingClass", self._renderer), made, 1
            )  # it names an image token
        else:
            made, pixels = self._renderer(text=[self._image_token], images=[[image]], add_special_tokens=False), None
        ids = tuple(int(t) for t in made["input_ids"][0])
        if self._image_token_id is not None and not (ids and ids[0] in self._cut_ids and ids[-1] in self._cut_ids):
            self._whole_images(
                f"an image's expanded tokens ({len(ids)}) do not start and end with tokens the "
                "tokenizer always splits the text at"
            )
        return ImageExpansion(image, ids, pixels)

    def carried(self, trajectory: Trajectory, images: EpisodeImages) -> Trajectory:
        """``trajectory`` carrying what the processing class made of its images as the episode rendered them (their
        kept pixel tensors joined as one row, and the image tokens they expand into), so that nothing processes them
        again; unchanged when this template keeps no pixels or one of its images was not expanded alone."""
        if not self._keep_pixels or not trajectory.images:
            return trajectory
        from .sample_images import ProcessedImages, image_token_id
        from .vision_inputs import joined_pixels

        expansions = [images.of(image) for image in trajectory.images]
        kept = [e for e in expansions if e is not None and e.pixels is not None]
        if len(kept) != len(expansions):
            return trajectory
        token = image_token_id(self._renderer)
        pixels = [e.pixels for e in kept if e.pixels is not None]
        # one image's tensors are carried as they are: joining copies, and the copy would hold its pixels twice
        processed = ProcessedImages(
            dict(pixels[0]) if len(pixels) == 1 else joined_pixels(pixels), sum(e.ids.count(token) for e in kept)
        )
        return replace(trajectory, processed=processed)

    async def prepare_images(self, messages: MessagesView, images: EpisodeImages) -> None:
        """Decode and expand, in a thread, the images of ``messages`` that the episode (``images``) has not
        processed yet, so that rendering them on the event loop processes none."""
        if self._image_token_id is None:
            return
        converted, _ = template_messages(messages, images=True)
        new: dict[str | int, MessageView] = {}  # a screenshot the conversation holds twice is one image
        for part in image_parts(converted):
            source = image_source(part)
            if images.get(source) is None:
                new.setdefault(source if isinstance(source, str) else id(source), part)
        if not new:
            return
        parts = list(new.values())

        def expand_all() -> list[tuple[str | Image, ImageExpansion]]:
            return [(image_source(p), self.expand(load_image(image_source(p)))) for p in parts]

        for source, expansion in await run_blocking(
            expand_all, timeout_s=_PREPARE_TIMEOUT_S, what=f"processing {len(parts)} image(s) of an episode"
        ):
            images.put(source, expansion)

    def _image(self, part: MessageView) -> Image:
        """The part's image, decoded once per source while something holds it (an episode re-renders its screenshots
        every turn)."""
        source = image_source(part)
        if not isinstance(source, str):  # an image object already
            return load_image(source)
        image = self._decoded.get(source)
        if image is None:
            image = self._decoded[source] = load_image(source)
        return image

    def sampled_turn(self, generation: Generation) -> Generation:
        """``generation`` cut before the first image placeholder it sampled, if any: a placeholder stands for an
        image's pixels and the model has none to give, so the turn ends there (the bridge adds the end-of-turn
        marker, as for a turn cut at ``max_tokens``). Cutting a sample early leaves a valid sample with exact
        logprobs."""
        at = next((i for i, t in enumerate(generation.token_ids) if t in self._placeholder_ids), None)
        if at is None:
            return generation
        logger.info(
            "A turn sampled an image placeholder (id %d) after %d tokens; the turn ends before it.",
            generation.token_ids[at],
            at,
        )
        return Generation(generation.token_ids[:at], generation.logprobs[:at], "stop")

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        text = self._tokenizer.decode(list(token_ids), skip_special_tokens=skip_special_tokens)
        assert isinstance(text, str), "decode of one sequence returns its text"
        return text

    def prompt(
        self, messages: MessagesView, tools: Tools | None = None, images: EpisodeImages | None = None
    ) -> Encoded:
        """The rendered conversation as ids, with its images (expanded once per episode: ``images``)."""
        return self.encode_with_images(*self._render(messages, tools), images)

    def prompt_ids(self, messages: MessagesView, tools: Tools | None = None) -> list[int]:
        return list(self.prompt(messages, tools).ids)

    def bridge(
        self,
        messages: MessagesView,
        held: Encoded,
        last_turn: Generation,
        stop_ids: Sequence[int],
        tools: Tools | None = None,
        images: EpisodeImages | None = None,
    ) -> tuple[Encoded, bool]:
        """Tokens between the last sampled turn and the next generation prompt (with the images they hold), and
        whether they were realigned.

        ``messages`` is the whole conversation, ending with the new user (or tool) messages; the last assistant
        message holds what ``last_turn`` sampled (its text, or the tool calls parsed from it). ``held`` is what
        the episode holds so far (``TrajectoryBuilder.held()``); ``images`` the episode's image expansions, so that
        the conversation's earlier images are not processed again.
        """
        text, parts = self._render(messages, tools)
        # sampled text that reads as an image placeholder re-renders as one: then only the realignment rule applies
        if self._image_token is None or text.count(self._image_token) == len(parts):
            full = self.encode_with_images(text, parts, images)
            n, k = len(held.ids), len(held.unexpanded_ids)
            if full.ids[:n] == held.ids and full.unexpanded_ids[:k] == held.unexpanded_ids:
                new_images = full.images[len(held.images) :]
                return Encoded(full.ids[n:], new_images, full.unexpanded_ids[k:] if new_images else None), False
        assistant_at = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if assistant_at is None:
            raise ValueError("bridge() needs a conversation with an assistant message")
        marked = [dict(m) for m in messages]
        marked[assistant_at] = {"role": "assistant", "content": _SENTINEL}  # tool calls were sampled too: held
        text, parts = self._render(marked, tools)
        at = text.rfind(_SENTINEL)
        if at < 0:
            raise ValueError(
                "The chat template drops the assistant's content, so the tokens between turns cannot be found; "
                "pass chat_template_kwargs or a template that renders assistant messages."
            )
        tail = text[at + len(_SENTINEL) :]
        if last_turn.token_ids and last_turn.token_ids[-1] in set(stop_ids):
            end_text = self.decode(last_turn.token_ids[-1:], skip_special_tokens=False)
            if end_text and tail.startswith(end_text):
                tail = tail[len(end_text) :]
        new = tail.count(self._image_token) if self._image_token else 0
        if len(held.images) + new != len(parts):
            raise ValueError(
                f"the chat template renders {len(parts)} image(s) where the episode holds {len(held.images)} and "
                f"the new messages add {new}: it rewrites earlier images, which ep_trl cannot train on token-exactly."
            )
        return self.encode_with_images(tail, parts[len(parts) - new :], images), True


def _token_id(tokenizer: Tokenizer, token: str) -> int:
    """The id of one token the tokenizer has."""
    found = tokenizer.convert_tokens_to_ids(token)
    if not isinstance(found, int):
        raise TypeError(f"the tokenizer gave {found!r} as the id of {token!r}")
    return found


def _spliced(ids: Sequence[int], placeholder: int, expansions: Sequence[ImageExpansion]) -> tuple[int, ...]:
    """``ids`` with each ``placeholder`` replaced by the next expansion's ids, in order."""
    out: list[int] = []
    start = 0
    for expansion in expansions:
        at = ids.index(placeholder, start)
        out.extend(ids[start:at])
        out.extend(expansion.ids)
        start = at + 1
    if placeholder in ids[start:]:
        raise ValueError(
            f"the text's ids hold more image placeholders ({placeholder}) than its {len(expansions)} image part(s)"
        )
    out.extend(ids[start:])
    return tuple(out)
