"""Small PNG images as data URIs and image content parts, teacher-forced logprobs with pixels, and an instrument
counting the calls of a processor's image processor, for tests of vision-language paths."""

import base64
import io
import threading
from dataclasses import dataclass
from typing import Any

from PIL import Image


def png_data_uri(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> str:
    """A one-colour PNG as a ``data:image/png;base64,...`` URI (the form BrowserGym screenshots take)."""
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def shaped_images() -> list[Any]:
    """Three one-colour images of different shapes: wide (BrowserGym's 1280x720 viewport), tall, small."""
    return [
        Image.new("RGB", (1280, 720), (10, 20, 30)),
        Image.new("RGB", (300, 900), (100, 20, 30)),
        Image.new("RGB", (50, 40), (1, 2, 250)),
    ]


def user_with_image(text: str, uri: str) -> dict[str, Any]:
    """A user message of OpenAI-style content parts: text, then the image."""
    return {
        "role": "user",
        "content": [{"type": "text", "text": text}, {"type": "image_url", "image_url": {"url": uri}}],
    }


def token_logprobs(
    model: Any, processor: Any, ids: list[int], images: list[Any], *, pixels: bool = True
) -> list[float]:
    """Teacher-forced log-probability of each of ``ids[1:]`` given the ids before it, with the images' pixel inputs
    (built as ep_trl builds them) or, with ``pixels=False``, from the ids alone (what TRL computed before the seam)."""
    import torch

    from ep_trl.trajectory.vision_inputs import vision_inputs

    input_ids = torch.tensor([ids])
    vision = vision_inputs(processor, input_ids, [images]) if pixels else None
    with torch.no_grad():
        logits = model(input_ids=input_ids, **(vision.model_kwargs if vision else {})).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[0, 1:, None])[:, 0].tolist()


@dataclass(frozen=True)
class ImageProcessorCall:
    """One call of an image processor: the thread it ran on (its id, and its name then) and how many images it
    processed."""

    thread_id: int
    thread_name: str
    images: int


class ImageProcessorCalls:
    """An instrument, not a fake: it takes the place of ``processor.image_processor`` and passes every call (and
    attribute) through to the real one, recording each call's thread and number of images (``calls``). Every path
    that processes pixels goes through the image processor: the processor's own ``__call__`` and ep_trl's
    ``vision_inputs``."""

    def __init__(self, processor: Any) -> None:
        self._processor, self._real = processor, processor.image_processor
        self.calls: list[ImageProcessorCall] = []
        processor.image_processor = self

    def remove(self) -> None:
        """Put the real image processor back."""
        self._processor.image_processor = self._real

    def __call__(self, images: Any = None, *args: Any, **kwargs: Any) -> Any:
        thread = threading.current_thread()
        self.calls.append(ImageProcessorCall(thread.ident or 0, thread.name, _count_images(images)))
        return self._real(images, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    @property
    def images(self) -> int:
        """Images processed over every call."""
        return sum(call.images for call in self.calls)


def _count_images(images: Any) -> int:
    if isinstance(images, (list, tuple)):
        return sum(_count_images(item) for item in images)
    return 0 if images is None else 1
