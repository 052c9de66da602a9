"""Demonstrations of BrowserGym's action format on MiniWoB pages, for cloning a tiny policy (``cloning``).

Each demonstration is the first turn of one task exactly as training prompts it: the eval's own first messages
and its prompt builder's text for the page a real reset of the BrowserGym server shows (the accessibility tree with
the clickable element ids). Its answers are every action of :data:`ELEMENT_ACTIONS` on every clickable element of
that page and every action of :data:`PAGE_ACTIONS`, equally often. So a model cloned on them writes a valid action
but does not know which one completes the task: on click-test (one button) and on focus-text (one text box) only
``click`` of them scores, one answer in three.

:func:`format_demonstrations` does the same for a real model (``recipes/miniwob/smollm2.py``) on several pages of
each task, answered with every action a page allows (each click, and each fill of a text box with the goal's text):
the base model answers the eval's prompt with code, and after cloning it writes well-formed actions on unseen pages
without knowing which one the task wants.
"""

import asyncio
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..envs.browsergym import BrowserGymEnv, BrowserGymObservation
from ..evalprotocol import read_eval_spec, resolve_eval_test, strip_row_key, training_prompts
from .cloning import CloningTarget

#: The BrowserGym element actions demonstrated, on each clickable element.
ELEMENT_ACTIONS: tuple[str, ...] = ("click", "hover")
#: The BrowserGym page actions demonstrated (no element).
PAGE_ACTIONS: tuple[str, ...] = ("scroll(0, 200)",)


def first_turn_demonstrations(
    env_path: str,
    env_url: str,
    tasks: Sequence[str],
    *,
    seed: int = 0,
    actions: Sequence[str] = ELEMENT_ACTIONS,
    page_actions: Sequence[str] = PAGE_ACTIONS,
) -> tuple[CloningTarget, ...]:
    """One demonstration per task: the eval's first prompt for the page of ``reset(task_name=task, seed=seed)`` on
    the server at ``env_url``, answered with each of ``actions`` on each clickable element and each of
    ``page_actions``."""
    spec, first = _eval_first_turn(env_path)
    demonstrations = []
    for task, observation in zip(tasks, asyncio.run(_first_observations(env_url, [(t, seed) for t in tasks]))):
        if not observation.clickable_bids:
            raise ValueError(
                f"the first page of MiniWoB task {task!r} has no clickable element to demonstrate "
                "actions on; train without the warm start or on other tasks"
            )
        user = {"role": "user", "content": spec.prompt_builder(observation, 1, [])}
        answers = (*(f"{action}('{bid}')" for action in actions for bid in observation.clickable_bids), *page_actions)
        demonstrations.append(CloningTarget(messages=(*first, user), answers=answers))
    return tuple(demonstrations)


def format_demonstrations(
    env_path: str, env_url: str, instances: Sequence[tuple[str, int]]
) -> tuple[CloningTarget, ...]:
    """One demonstration per ``(task, reset seed)`` in ``instances``: the eval's first prompt for that page, answered
    with every action of the format that page allows, equally often: ``click`` on each clickable element, and
    ``fill`` of each text box with each text the goal quotes. A real model cloned on them writes well-formed actions
    without being shown which one the task wants; the pages should be training instances
    (``ep_trl.devtools.miniwob_instances``), never held-out ones."""
    spec, first = _eval_first_turn(env_path)
    demonstrations = []
    for (task, _), observation in zip(instances, asyncio.run(_first_observations(env_url, instances))):
        answers = page_actions_of(observation)
        if not answers:
            raise ValueError(
                f"the first page of MiniWoB task {task!r} has no clickable element to demonstrate "
                "actions on; train on other tasks"
            )
        user = {"role": "user", "content": spec.prompt_builder(observation, 1, [])}
        demonstrations.append(CloningTarget(messages=(*first, user), answers=answers))
    return tuple(demonstrations)


def page_actions_of(observation: BrowserGymObservation) -> tuple[str, ...]:
    """Every well-formed action on a page that the goal does not pick out: ``click`` on each clickable element and
    ``fill`` of each text box (an element the accessibility tree calls ``textbox``) with each text the goal quotes."""
    clicks = [f"click('{bid}')" for bid in observation.clickable_bids]
    boxes = re.findall(r"\[(\w+)\] textbox\b", observation.axtree_txt or "")
    quoted = list(dict.fromkeys(re.findall(r'"([^"\']+)"', observation.goal or "")))
    return tuple(dict.fromkeys([*clicks, *(f"fill('{bid}', '{text}')" for bid in boxes for text in quoted)]))


def _eval_first_turn(env_path: str) -> tuple[Any, tuple[Mapping[str, Any], ...]]:
    """The eval's spec and the first messages of its training prompt; refused unless its prompts are built from
    environment observations."""
    eval_test = resolve_eval_test(env_path)
    spec = read_eval_spec(eval_test)
    if spec.prompt_builder is None:
        raise ValueError(
            f"{env_path} runs {spec.processor_name}, not OpenEnvRolloutProcessor: its prompts are not "
            "built from environment observations, so there is no first page to demonstrate on"
        )
    return spec, tuple(strip_row_key(training_prompts(eval_test)[0]))


async def _first_observations(env_url: str, instances: Sequence[tuple[str, int]]) -> list[BrowserGymObservation]:
    env = BrowserGymEnv(base_url=env_url)
    try:
        return [(await env.reset(task_name=task, seed=seed)).observation for task, seed in instances]
    finally:
        await env.close()
