"""Each image of an episode is processed once, off the event loop, and the ids are the processing class's own.

An episode renders its whole conversation every turn. Before, every render ran the processing class over every image
in the conversation, on the event loop that plays every episode in flight: 1 + 2 + ... + n processings for n
screenshots. Now each image is expanded alone, once per episode, in a thread (``ChatTemplate.prepare_images``), and
spliced into the text's ids. Checked on the real per-turn paths (the OpenEnv loop, a processor eval's captured
calls) with the tiny VLM's processing class: n processings for n images, none on the loop's thread, a second episode
with the same screenshots processing them again (nothing is shared across episodes), and the ids equal to the
processing class run over the whole conversation; for the splice itself, equal ids for SmolVLM's image splitting
(rows and columns of frames) and on a realigned bridge; with the worker's template (``keep_pixels``), samples that take
the renders' pixels, equal to one processing of the episode's images, and nothing processed again; and a processing
class whose placeholder is no cut token processed whole, with a warning.
"""

import asyncio
import dataclasses
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from transformers import AutoProcessor, Idefics3Processor
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

from ep_trl.capture.parsing import ToolCallParser
from ep_trl.capture.placement import RolloutCapture, TurnRequest
from ep_trl.devtools.tiny_vlm import IMAGE, IMAGE_SEQ_LEN
from ep_trl.evalprotocol.spec import EnvSettings
from ep_trl.generation import Generation, SamplingParams
from ep_trl.openenv.episode import EpisodeConfig
from ep_trl.openenv.loop import run_episode
from ep_trl.openenv.pool import EnvPool
from ep_trl.trajectory.content import load_image
from ep_trl.trajectory.episode import EpisodePlan
from ep_trl.trajectory.template import ChatTemplate
from ep_trl.trajectory.tokens import TrajectoryBuilder, TurnLimits
from tests.support.images import ImageProcessorCalls, png_data_uri, user_with_image

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from transformers import PreTrainedTokenizerBase, ProcessorMixin

    from ep_trl.generation import Generator, PromptImages
    from ep_trl.trajectory.episode import Episode
    from ep_trl.trajectory.sample_images import ImageIds
    from ep_trl.trajectory.tokens import Trajectory


STEPS = 4
#: One screenshot per observation, each a different colour and shape.
SCREENSHOTS = [png_data_uri((40 * k, 200 - 30 * k, 90), size=(40 + 16 * k, 30 + 8 * k)) for k in range(STEPS + 1)]


@pytest.fixture(scope="module")
def processor(tiny_vlm_dir: Path) -> "ProcessorMixin":
    return AutoProcessor.from_pretrained(tiny_vlm_dir)


@pytest.fixture(scope="module")
def splitting_processor(processor: "ProcessorMixin") -> Idefics3Processor:
    """SmolVLM's image splitting at a small scale: each image cut into rows and columns of 32-pixel frames plus a
    global one, its expansion ``<row_i_col_j>`` text and newlines between special tokens."""
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=True, size={"longest_edge": 96}, max_image_size={"longest_edge": 32}
    )
    return Idefics3Processor(
        image_processor=image_processor,
        tokenizer=processor.tokenizer,
        image_seq_len=4,
        chat_template=cast("str | None", processor.chat_template),  # the tiny VLM's: a single template
    )


def whole(
    processor: "ProcessorMixin", template: ChatTemplate, messages: "Sequence[Mapping[str, Any]]"
) -> tuple[int, ...]:
    """The uncached rendering: the processing class over the whole conversation and every image in it, as each render
    ran it before."""
    text = template.render(messages)
    images = [
        load_image(part["image_url"]["url"])
        for m in messages
        if isinstance(m["content"], list)
        for part in m["content"]
        if part["type"] == "image_url"
    ]
    return tuple(int(t) for t in processor(text=[text], images=[images], add_special_tokens=False)["input_ids"][0])


@dataclass(frozen=True)
class Screen:
    """What the environment returns: a screenshot observation, as an OpenEnv StepResult has it."""

    observation: str
    reward: float
    done: bool


class ScreenshotEnv:
    """An environment (in process, async like an OpenEnv client) whose every observation is a new screenshot."""

    def __init__(self) -> None:
        self.steps = 0

    async def reset(self, **kwargs: Any) -> Screen:
        self.steps = 0
        return Screen(SCREENSHOTS[0], 0.0, False)

    async def step(self, action: object) -> Screen:
        self.steps += 1
        return Screen(SCREENSHOTS[self.steps], 0.0, False)

    async def close(self) -> None:
        pass


class ScriptedGenerator:
    """Fake backend (named as such): returns the ids of the same action each turn, ending with ``<|im_end|>``,
    so that the episode's rendering is all that processes images."""

    name = "scripted"
    max_model_len = None
    failure = None

    def __init__(self, tokenizer: "PreTrainedTokenizerBase") -> None:
        self._ids = tuple(
            tokenizer.encode("click('13')", add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        )

    async def begin_call(self) -> None:
        pass

    async def end_call(self) -> None:
        pass

    async def generate(
        self, prompt_ids: "Sequence[int]", params: SamplingParams, images: "PromptImages | None" = None
    ) -> Generation:
        return Generation(self._ids, (-1.0,) * len(self._ids), "stop")

    async def aclose(self) -> None:
        pass


def limits(tokenizer: "PreTrainedTokenizerBase") -> TurnLimits:
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(end, int)
    return TurnLimits(SamplingParams(max_tokens=16), 4000, (end,))


def screenshot_prompt(observation: object, step: int, history: list[str]) -> list[dict[str, Any]]:
    return [
        {"type": "text", "text": f"Step {step}: the page."},
        {"type": "image_url", "image_url": {"url": observation}},
    ]


def held_before_last_turn(trajectory: "Trajectory") -> tuple[int, ...]:
    """Prompt and completion ids up to the last sampled turn: the ids its generation was asked to continue."""
    start, _ = trajectory.sampled_runs[-1]
    return trajectory.prompt_ids + trajectory.completion_ids[:start]


def test_an_openenv_episode_processes_each_screenshot_once_off_the_event_loop(processor: "ProcessorMixin") -> None:
    template = ChatTemplate(processor)
    config = EpisodeConfig(
        env=EnvSettings(factory=ScreenshotEnv),
        prompt_builder=screenshot_prompt,
        action_parser=lambda text: text,
        max_steps=STEPS,
        limits=limits(processor.tokenizer),
    )

    async def two_episodes() -> "list[Episode]":
        envs = EnvPool(config.env, reuse=False)
        try:
            return [
                await run_episode(
                    EpisodePlan(index=i, group=0, member=i, task=None, initial_messages=()),
                    config,
                    template,
                    cast("Generator", ScriptedGenerator(processor.tokenizer)),
                    envs,
                )
                for i in range(2)
            ]
        finally:
            await envs.aclose()

    calls = ImageProcessorCalls(processor)
    try:
        episodes = asyncio.run(two_episodes())
    finally:
        calls.remove()
    assert [e.status for e in episodes] == ["finished", "finished"]
    assert all(len(e.trajectory.images) == STEPS for e in episodes)
    # each screenshot once per episode (before: 1 + 2 + 3 + 4 = 10 per episode), and a second episode with the same
    # screenshots processes them again: nothing is kept across episodes
    assert calls.images == 2 * STEPS
    loop_thread = threading.get_ident()  # asyncio.run ran the episodes' loop on this thread
    assert all(call.thread_id != loop_thread for call in calls.calls)
    for episode in episodes:
        conversation = list(episode.messages)[:-1]  # up to the last observation, before the last sampled turn
        assert held_before_last_turn(episode.trajectory) == whole(processor, template, conversation)


def test_a_processor_eval_rollout_processes_each_image_once_off_the_event_loop(processor: "ProcessorMixin") -> None:
    """The captured calls of a processor eval (each call sends the whole conversation so far)."""
    template = ChatTemplate(processor)
    rollout = RolloutCapture(
        "t",
        "test",
        limits(processor.tokenizer),
        template,
        cast("Generator", ScriptedGenerator(processor.tokenizer)),
        ToolCallParser(processor.tokenizer),
    )
    messages = [user_with_image("Step 1", SCREENSHOTS[0])]

    async def play() -> None:
        for step in range(1, STEPS + 1):
            reply = await rollout.turn(TurnRequest(tuple(messages)))
            messages.extend([reply.message, user_with_image(f"Step {step + 1}", SCREENSHOTS[step])])

    calls = ImageProcessorCalls(processor)
    try:
        asyncio.run(play())
    finally:
        calls.remove()
    trajectory = rollout.trajectory(messages)
    assert len(trajectory.images) == STEPS and rollout.forks == 0
    assert calls.images == STEPS
    assert all(call.thread_id != threading.get_ident() for call in calls.calls)
    assert held_before_last_turn(trajectory) == whole(processor, template, messages[:-2])


@pytest.mark.parametrize("which", ["tiny", "splitting"])
def test_spliced_images_are_the_ids_of_the_whole_processing_turn_after_turn(
    which: str, processor: "ProcessorMixin", splitting_processor: Idefics3Processor
) -> None:
    from ep_trl.trajectory.template import EpisodeImages

    processing_class = processor if which == "tiny" else splitting_processor
    template = ChatTemplate(processing_class)
    end = processing_class.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = template.encode("click('13')") + [end]
    turn = Generation(tuple(ids), (-1.0,) * len(ids), "stop")
    images = EpisodeImages()
    messages = [user_with_image("Step 1", SCREENSHOTS[0])]
    builder = TrajectoryBuilder.start(template.prompt(messages, images=images))
    assert builder.held().ids == whole(processing_class, template, messages)
    for step in range(1, STEPS + 1):
        builder.add_sampled(turn)
        messages += [
            {"role": "assistant", "content": "click('13')"},
            user_with_image(f"Step {step}", SCREENSHOTS[step]),
        ]
        bridge, realigned = template.bridge(messages, builder.held(), turn, [end], images=images)
        builder.add_inserted(bridge)
        assert not realigned and builder.held().ids == whole(processing_class, template, messages)
    assert images.processed == STEPS + 1 and len(images) == STEPS + 1
    if which == "splitting":  # the expansions hold rows and columns of frames
        assert "<row_1_col_1>" in processing_class.tokenizer.decode(builder.held().ids)


def test_a_realigned_bridge_splices_the_new_image_as_the_whole_processing_does(processor: "ProcessorMixin") -> None:
    """A turn whose text re-tokenizes otherwise: the bridge is the template text after it, with the new image."""
    from ep_trl.trajectory.template import EpisodeImages

    template = ChatTemplate(processor)
    end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [i for ch in "hello" for i in template.encode(ch)] + [end]  # decodes to "hello", re-encodes otherwise
    turn = Generation(tuple(ids), (-1.0,) * len(ids), "stop")
    images = EpisodeImages()
    first = [user_with_image("Step 1", SCREENSHOTS[0])]
    builder = TrajectoryBuilder.start(template.prompt(first, images=images))
    builder.add_sampled(turn)
    messages = first + [{"role": "assistant", "content": "hello"}, user_with_image("Step 2", SCREENSHOTS[1])]
    bridge, realigned = template.bridge(messages, builder.held(), turn, [end], images=images)
    assert realigned and images.processed == 2
    tail = template.decode(bridge.unexpanded_ids, skip_special_tokens=False)
    assert tail == "\n" + template.render(messages)[len(template.render(messages[:2], generation_prompt=False)) :]
    assert bridge.ids == tuple(
        int(t) for t in processor(text=[tail], images=[[bridge.images[0]]], add_special_tokens=False)["input_ids"][0]
    )


def play_openenv(template: ChatTemplate, episodes: int) -> "list[Episode]":
    """``episodes`` OpenEnv episodes of ``STEPS`` screenshots each, with ``template``."""
    tokenizer = template.tokenizer
    config = EpisodeConfig(
        env=EnvSettings(factory=ScreenshotEnv),
        prompt_builder=screenshot_prompt,
        action_parser=lambda text: text,
        max_steps=STEPS,
        limits=limits(tokenizer),
    )

    async def play() -> "list[Episode]":
        envs = EnvPool(config.env, reuse=False)
        try:
            return [
                await run_episode(
                    EpisodePlan(index=i, group=0, member=i, task=None, initial_messages=()),
                    config,
                    template,
                    cast("Generator", ScriptedGenerator(tokenizer)),
                    envs,
                )
                for i in range(episodes)
            ]
        finally:
            await envs.aclose()

    return asyncio.run(play())


def test_the_rollout_worker_takes_the_pixels_its_episodes_made_as_they_rendered(processor: "ProcessorMixin") -> None:
    """With a template that keeps pixels (an ``EvalRolloutWorker``'s), the samples carry what the episodes' renders
    made of their screenshots: from the first render to the samples, each screenshot is processed once, and the
    carried pixels are those one processing of all the episode's screenshots makes."""
    import torch

    from ep_trl.adapters.samples import group_samples
    from ep_trl.trajectory.sample_images import process_images
    from tests.support.async_training import released_group

    template = ChatTemplate(processor, keep_pixels=True)
    calls = ImageProcessorCalls(processor)
    try:
        episodes = play_openenv(template, 2)
        made = group_samples(
            released_group(0, "Task", [e.trajectory for e in episodes], scores=(1.0, 0.0)),
            processor.tokenizer,
            processor,
        )
    finally:
        calls.remove()
    assert len(made.samples) == 2 and made.image_mismatches == 0
    assert calls.images == 2 * STEPS  # the renders' processings, none in group_samples
    for episode, sample in zip(episodes, made.samples):
        carried = cast("ImageIds", sample.input_ids).processed
        assert carried is episode.trajectory.processed
        once = process_images(processor, episode.trajectory.images)
        assert carried is not None
        assert carried.image_tokens == once.image_tokens == STEPS * IMAGE_SEQ_LEN
        assert carried.pixels.keys() == once.pixels.keys()
        assert all(torch.equal(carried.pixels[key], once.pixels[key]) for key in once.pixels)
    assert episodes[0].trajectory.without_images().processed is None


def test_kept_pixels_of_split_images_of_different_shapes_join_as_one_processing_makes_them(
    splitting_processor: Idefics3Processor,
) -> None:
    """SmolVLM-style splitting: images of different shapes make different numbers and sizes of frames, which one
    processing pads to a row; the kept pixels joined are the same tensors."""
    import torch

    from ep_trl.trajectory.sample_images import process_images
    from ep_trl.trajectory.template import EpisodeImages

    template = ChatTemplate(splitting_processor, keep_pixels=True)
    images = EpisodeImages()
    messages = [user_with_image(f"Step {k}", SCREENSHOTS[k]) for k in range(3)]
    trajectory = template.carried(TrajectoryBuilder.start(template.prompt(messages, images=images)).build(), images)
    once = process_images(splitting_processor, trajectory.images)
    assert trajectory.processed is not None and trajectory.processed.image_tokens == once.image_tokens
    assert {key: value.shape for key, value in trajectory.processed.pixels.items()} == {
        key: value.shape for key, value in once.pixels.items()
    }
    assert all(torch.equal(trajectory.processed.pixels[key], once.pixels[key]) for key in once.pixels)
    unkept = dataclasses.replace(trajectory, processed=None)
    assert ChatTemplate(splitting_processor).carried(unkept, images).processed is None  # keeps no pixels


def test_a_placeholder_the_tokenizer_may_not_split_at_has_each_render_processed_whole_and_says_so(
    tiny_vlm_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A placeholder that strips the whitespace before it (``lstrip``) is no cut token: a text's ids with the
    expansions spliced in need not be the whole text's. Such a processing class has every render processed whole, as
    before, with a warning; the ids are the processing class's."""
    import logging

    from tokenizers import AddedToken

    from ep_trl.trajectory.template import EpisodeImages

    stripping = AutoProcessor.from_pretrained(tiny_vlm_dir)
    stripping.tokenizer.backend_tokenizer.add_special_tokens(
        [AddedToken(IMAGE, lstrip=True, special=True, normalized=False)]
    )
    with caplog.at_level(logging.WARNING, logger="ep_trl.trajectory.template"):
        template = ChatTemplate(stripping)
    assert f"its image placeholder {IMAGE!r} is not a token the tokenizer always splits the text at" in caplog.text
    messages = [
        user_with_image("Step 1", SCREENSHOTS[0]),
        {"role": "assistant", "content": "click('13')"},
        user_with_image("Step 2", SCREENSHOTS[1]),
    ]
    calls = ImageProcessorCalls(stripping)
    try:
        prompt = template.prompt(messages, images=EpisodeImages())
    finally:
        calls.remove()
    assert calls.images == 2 and len(calls.calls) == 1  # the whole text with its images, in one call
    assert prompt.ids == whole(stripping, template, messages)


def test_an_episode_with_one_image_carries_its_kept_pixels_without_a_copy(
    splitting_processor: Idefics3Processor,
) -> None:
    """The pixels a trajectory carries are the ones its one image's expansion kept, not a joined copy: a copy would
    hold that image's pixels twice while the episode's images are alive (what EvalRolloutWorker(max_buffered_images)
    counts as one image). Several images are joined into one row (one copy, test above)."""
    from ep_trl.trajectory.template import EpisodeImages

    template = ChatTemplate(splitting_processor, keep_pixels=True)
    images = EpisodeImages()
    trajectory = template.carried(
        TrajectoryBuilder.start(template.prompt([user_with_image("Step 0", SCREENSHOTS[0])], images=images)).build(),
        images,
    )
    kept = images.of(trajectory.images[0])
    assert trajectory.processed is not None and kept is not None and kept.pixels is not None
    assert trajectory.processed.pixels.keys() == kept.pixels.keys()
    assert all(trajectory.processed.pixels[key] is kept.pixels[key] for key in kept.pixels)
