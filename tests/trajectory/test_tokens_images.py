"""Images through a trajectory: every piece of template text is tokenized with its images, so the ids hold the
expanded image tokens; the images stay in placeholder order across prompt and completion, an observation's image
is part of a masked bridge, and the unexpanded ids (what vLLM takes with the images) are kept beside them."""

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from transformers import AutoProcessor

from ep_trl.devtools.tiny_vlm import IMAGE, IMAGE_SEQ_LEN
from ep_trl.generation import Generation
from ep_trl.trajectory.template import ChatTemplate
from ep_trl.trajectory.tokens import TrajectoryBuilder
from tests.support.images import png_data_uri, user_with_image

if TYPE_CHECKING:
    from collections.abc import Sequence

    from transformers import ProcessorMixin


RED, BLUE = (255, 0, 0), (0, 0, 255)


@pytest.fixture(scope="module")
def processor(tiny_vlm_dir: Path) -> "ProcessorMixin":
    return AutoProcessor.from_pretrained(tiny_vlm_dir)


def sampled(ids: "Sequence[int]") -> Generation:
    return Generation(tuple(ids), tuple(-1.0 for _ in ids), "stop")


def conversation(answer: str) -> list[dict[str, Any]]:
    return [
        user_with_image("Step 1", png_data_uri(RED)),
        {"role": "assistant", "content": answer},
        user_with_image("Step 2", png_data_uri(BLUE, size=(64, 48))),
    ]


def play(template: ChatTemplate, answer: str, turn: "Sequence[int]") -> tuple[TrajectoryBuilder, bool]:
    """Prompt, one sampled turn, the bridge to the second observation: the builder and whether it realigned."""
    end = template.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert isinstance(end, int)
    builder = TrajectoryBuilder.start(template.prompt(conversation(answer)[:1]))
    builder.add_sampled(sampled(turn))
    bridge, realigned = template.bridge(conversation(answer), builder.held(), sampled(turn), [end])
    builder.add_inserted(bridge)
    return builder, realigned


def test_prompt_and_bridge_hold_expanded_images_in_placeholder_order(processor: "ProcessorMixin") -> None:
    template = ChatTemplate(processor)
    image = processor.tokenizer.convert_tokens_to_ids(IMAGE)
    end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    turn = template.encode("click('13')") + [end]
    builder, realigned = play(template, "click('13')", turn)
    assert not realigned
    trajectory = builder.build()
    assert trajectory.prompt_ids.count(image) == IMAGE_SEQ_LEN  # expanded: one token per image feature
    assert [im.getpixel((0, 0)) for im in trajectory.images] == [RED, BLUE]  # prompt's, then the observation's
    in_completion = [m for t, m in zip(trajectory.completion_ids, trajectory.env_mask) if t == image]
    assert in_completion == [0] * IMAGE_SEQ_LEN  # the environment's image tokens are masked
    full = template.prompt(conversation("click('13')"))  # what the processor makes of the whole conversation
    assert trajectory.prompt_ids + trajectory.completion_ids == full.ids
    held = builder.held_images()
    assert held is not None and held.unexpanded_ids == full.unexpanded_ids and held.unexpanded_ids.count(image) == 2
    assert held.images == trajectory.images


def test_realigned_bridge_keeps_the_new_image_and_the_unexpanded_ids(processor: "ProcessorMixin") -> None:
    template = ChatTemplate(processor)
    image = processor.tokenizer.convert_tokens_to_ids(IMAGE)
    end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    turn = [i for ch in "hello" for i in template.encode(ch)] + [end]  # decodes to "hello", re-encodes otherwise
    builder, realigned = play(template, "hello", turn)
    assert realigned
    trajectory = builder.build()
    assert [im.getpixel((0, 0)) for im in trajectory.images] == [RED, BLUE]
    assert trajectory.completion_ids.count(image) == IMAGE_SEQ_LEN
    held = builder.held_images()
    assert held is not None
    assert processor.tokenizer.decode(held.unexpanded_ids) == template.render(conversation("hello"))


def test_a_template_that_writes_no_placeholder_for_an_image_is_refused(
    processor: "ProcessorMixin", tiny_vlm_dir: Path
) -> None:
    blind = AutoProcessor.from_pretrained(tiny_vlm_dir)
    blind.chat_template = blind.chat_template.replace("{{ '<image>' }}", "")
    with pytest.raises(ValueError, match="wrote 0 image placeholder"):
        ChatTemplate(blind).prompt(conversation("")[:1])


def test_a_sampled_image_placeholder_ends_the_turn_before_it(processor: "ProcessorMixin") -> None:
    template = ChatTemplate(processor)
    image = processor.tokenizer.convert_tokens_to_ids(IMAGE)
    turn = Generation((5, 6, image, 7), (-0.1, -0.2, -0.3, -0.4), "length")
    assert template.sampled_turn(turn) == Generation((5, 6), (-0.1, -0.2), "stop")
    assert template.sampled_turn(Generation((5, 6), (-0.1, -0.2), "length")).finish_reason == "length"


def test_sampled_text_that_reads_as_a_placeholder_is_realigned_not_counted_as_an_image(
    processor: "ProcessorMixin",
) -> None:
    template = ChatTemplate(processor)
    end = processor.tokenizer.convert_tokens_to_ids("<|im_end|>")
    turn = [i for ch in "<image>" for i in template.encode(ch)] + [end]  # the characters, not the special token
    builder, realigned = play(template, "<image>", turn)
    assert realigned and [im.getpixel((0, 0)) for im in builder.build().images] == [RED, BLUE]


def test_the_decode_cache_keeps_no_image_alive_and_finds_those_an_episode_holds(processor: "ProcessorMixin") -> None:
    """A screenshot re-rendered while the episode holds it is the same decoded image; once nothing else holds it,
    the template's cache does not keep it alive (a rollout worker bounds the images it holds)."""
    import gc
    import weakref

    template = ChatTemplate(processor)
    prompt = template.prompt(conversation("a")[:1])
    again = template.prompt(conversation("b")[:1])
    assert again.images[0] is prompt.images[0]  # decoded once while held
    freed = weakref.ref(prompt.images[0])
    del prompt, again
    gc.collect()
    assert freed() is None
