"""Convert BrowserGym's raw observation dict into a JSON-ready ``BrowserGymObservation``.

BrowserGym returns numpy arrays (screenshot, elapsed time), CDP trees and DOM
snapshots; the wire model wants text and plain JSON values. Text views use
BrowserGym's own flatteners so the model sees what BrowserGym agents see.
"""

import base64
import io
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np
from browsergym.utils.obs import IGNORED_AXTREE_ROLES, flatten_axtree_to_str, flatten_dom_to_str, prune_html
from PIL import Image

from ep_trl.envs.browsergym.models import BrowserGymObservation

#: Chromium splits every text into InlineTextBox layout nodes that repeat their parent's text;
#: dropping them shortens the tree (and the prompt) without losing content.
AXTREE_IGNORED_ROLES = (*IGNORED_AXTREE_ROLES, "InlineTextBox")


def to_jsonable(value: Any) -> Any:
    """Recursively turn numpy scalars/arrays and tuples into plain JSON values."""
    if isinstance(value, np.ndarray):
        return value.item() if value.size == 1 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {str(key): to_jsonable(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(item) for item in value]
    return value


def screenshot_png_base64(screenshot: Optional[np.ndarray]) -> Optional[str]:
    """Encode an RGB screenshot array as base64 PNG (None when there is none)."""
    if screenshot is None or getattr(screenshot, "size", 0) == 0:
        return None
    buffer = io.BytesIO()
    Image.fromarray(np.asarray(screenshot, dtype=np.uint8)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def clickable_bids(extra_properties: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """BrowserGym ids marked clickable, in document order."""
    return [str(bid) for bid, props in extra_properties.items() if props.get("clickable")]


def build_observation(
    raw: Mapping[str, Any],
    *,
    reward: float,
    done: bool,
    include_screenshot: bool,
    info: Mapping[str, Any],
) -> BrowserGymObservation:
    """Build the wire observation from BrowserGym's ``obs`` plus reward, done and extra info."""
    extra_properties = raw.get("extra_element_properties") or {}
    axtree_txt = flatten_axtree_to_str(
        raw["axtree_object"],
        extra_properties=extra_properties,
        with_clickable=True,
        ignored_roles=AXTREE_IGNORED_ROLES,
    )
    pruned_html = prune_html(flatten_dom_to_str(raw["dom_object"]))
    full_info = {
        "focused_element_bid": raw.get("focused_element_bid", ""),
        "elapsed_s": to_jsonable(raw.get("elapsed_time")),
        "open_pages_urls": to_jsonable(raw.get("open_pages_urls", ())),
        **to_jsonable(dict(info)),
    }
    return BrowserGymObservation(
        goal=str(raw.get("goal", "")),
        url=str(raw.get("url", "")),
        last_action=str(raw.get("last_action", "")),
        last_action_error=str(raw.get("last_action_error", "") or ""),
        axtree_txt=axtree_txt,
        pruned_html=pruned_html,
        clickable_bids=clickable_bids(extra_properties),
        screenshot=screenshot_png_base64(raw.get("screenshot")) if include_screenshot else None,
        info=full_info,
        reward=float(reward),
        done=bool(done),
        metadata=full_info,
    )
