"""Fixtures of the trajectory tests."""

from typing import Any

import pytest

from tests.support.images import shaped_images


@pytest.fixture
def images() -> list[Any]:
    """The three shaped images, made per test: a module-level list held its 1280x720 one for the whole session, one
    of the two screenshots an image-memory test later found alive (tests/generation/test_vllm_images.py)."""
    return shaped_images()
