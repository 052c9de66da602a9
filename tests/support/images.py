"""Small PNG images as data URIs and image content parts, for tests of vision-language paths."""

import base64
import io
from typing import Any

from PIL import Image


def png_data_uri(color: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> str:
    """A one-colour PNG as a ``data:image/png;base64,...`` URI (the form BrowserGym screenshots take)."""
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def user_with_image(text: str, uri: str) -> dict[str, Any]:
    """A user message of OpenAI-style content parts: text, then the image."""
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        {"type": "image_url", "image_url": {"url": uri}}]}


def token_logprobs(model: Any, processor: Any, ids: list[int], images: list[Any], *, pixels: bool = True) -> list[float]:
    """Teacher-forced log-probability of each of ``ids[1:]`` given the ids before it, with the images' pixel inputs
    (built as ep_trl builds them) or, with ``pixels=False``, from the ids alone (what TRL computed before the seam)."""
    import torch

    from ep_trl.vision_inputs import vision_inputs

    input_ids = torch.tensor([ids])
    vision = vision_inputs(processor, input_ids, [images]) if pixels else None
    with torch.no_grad():
        logits = model(input_ids=input_ids, **(vision.model_kwargs if vision else {})).logits[0, :-1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[0, 1:, None])[:, 0].tolist()
