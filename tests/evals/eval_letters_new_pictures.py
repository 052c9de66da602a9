"""The image letters eval with a picture no other observation shares: its colour counts the observations of the
process, so every image an episode holds is its own decoded image (in ``eval_letters_images`` the episodes of a task
see the same pictures, which the chat template decodes once). A test can then count the images alive to check what
the rollout worker holds. Each picture is a 1280x720 screenshot (BrowserGym's viewport: 2.7 MB decoded, a few KB as
its PNG data URI), so decoded images stand out from everything else in memory. One environment step per episode, so
one image each; 8 episodes at once.
"""

import itertools
from typing import TYPE_CHECKING

from eval_protocol.models import EvaluationRow

from tests.evals.eval_letters_images import image_letters_test, mean_step_reward
from tests.support.images import png_data_uri

if TYPE_CHECKING:
    from typing import Any

    from ep_trl.envs.letters import LettersObservation

_OBSERVATIONS = itertools.count()
#: The pictures' size, BrowserGym's viewport.
SCREENSHOT_SIZE = (1280, 720)


def prompt_builder(obs: "LettersObservation", step: int, history: list[str]) -> "list[dict[str, Any]]":
    """The env's prompt, then a picture of a colour no earlier observation had."""
    n = next(_OBSERVATIONS)
    return [
        {"type": "text", "text": obs.prompt},
        {"type": "image_url", "image_url": {"url": png_data_uri((n % 256, n // 256 % 256, 77), SCREENSHOT_SIZE)}},
    ]


@image_letters_test(prompt_builder, steps=1, max_concurrent_rollouts=8)
def test_letters_new_pictures(row: EvaluationRow) -> EvaluationRow:
    """Scored as ``eval_letters_images`` scores (the mean step reward)."""
    return mean_step_reward(row)
