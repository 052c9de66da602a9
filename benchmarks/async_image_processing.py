"""Async image path: the CPU time one training step spends processing its screenshots, from the worker's samples to
the trainer's packed rows, and how many times each image is processed.

A step's episodes are released groups of synthesized full-size BrowserGym screenshots (``--width`` x ``--height``,
default 1280x720: BrowserGym's default viewport; its MiniWoB pages are 332x214), ``--screenshots`` per episode
(one per observation). Their samples are made as ``EvalRolloutWorker`` makes them (``group_samples``, which the
worker runs on its event loop before this change and in a thread after it) and collated as
``AsyncImagesGRPOTrainer`` collates them (``ImagesRolloutCollator`` over TRL ``TreeRow`` micro-batches of
``--batch-size``). An instrument around the real image processor (tests/support/images.py) counts the images it
processes. The forward pass is not timed: no version processes images there. ``--render`` also times how episodes
render their turns (``ChatTemplate.prompt`` over each turn's conversation so far, as an
episode does): before issue 48, every render processed every screenshot in the conversation, on the event loop;
since, each episode's new screenshots are processed in a thread (``ChatTemplate.prepare_images``), each once per
episode (``EpisodeImages``), and with the worker's template (``keep_pixels``) the samples take those pixels instead of
processing the screenshots again. With ``--render`` a row also has the step's image CPU (``image_cpu_ms``: the
renders' CPU less that of their text, ``render_text_cpu_ms``, the same turns rendered by the text tokenizer with the
image parts dropped; plus the samples' and the collator's), the processings per image over the whole step, and
``image_cpu_over_one_processing``: the image CPU over ``one_processing_cpu_ms``, the CPU of processing each of the
step's screenshots once (one processing of each episode's screenshots, timed after the step).

Processors (``--processors``): ``tiny``, the tiny VLM's (64-pixel frames, what CI trains); ``smolvlm``, SmolVLM's
image settings (splitting into 512-pixel frames, 64 image tokens each) over the tiny VLM's tokenizer, built locally.

    python benchmarks/async_image_processing.py --out benchmarks/results/async_image_processing.json

``benchmarks/compare_code.py --before REV ... -- benchmarks/async_image_processing.py ...`` runs it on two versions
of ``src/`` (rows tagged ``before``/``after``).
"""

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from ep_trl.devtools import run_record  # noqa: E402


def screenshot_uri(width: int, height: int, seed: int) -> str:
    """A page-like PNG data URI (bands and boxes on white, different per seed), the form BrowserGym sends."""
    import base64

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    page = np.full((height, width, 3), 255, dtype=np.uint8)
    page[: height // 12] = rng.integers(0, 255, 3)
    for _ in range(12):
        x, y = int(rng.integers(0, width - 40)), int(rng.integers(height // 12, height - 20))
        page[y : y + int(rng.integers(10, 80)), x : x + int(rng.integers(20, 300))] = rng.integers(0, 255, 3)
    buffer = io.BytesIO()
    Image.fromarray(page).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def processor_of(name: str, tiny_dir: Path) -> Any:
    from transformers import AutoProcessor, Idefics3Processor
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tiny = AutoProcessor.from_pretrained(tiny_dir)
    if name == "tiny":
        return tiny
    if name == "smolvlm":  # SmolVLM's processor_config.json image settings
        image_processor = Idefics3ImageProcessorPil(
            do_image_splitting=True, size={"longest_edge": 2048}, max_image_size={"longest_edge": 512}
        )
        return Idefics3Processor(
            image_processor=image_processor,
            tokenizer=tiny.tokenizer,
            image_seq_len=64,
            chat_template=tiny.chat_template,
        )
    raise SystemExit(f"unknown processor {name!r} (tiny, smolvlm)")


def conversation(uris: list[str], turns: int) -> list[dict[str, Any]]:
    """An episode's conversation up to its ``turns``-th observation: each observation a screenshot, each answer an
    action."""
    messages: list[dict[str, Any]] = []
    for step, uri in enumerate(uris[:turns]):
        if step:
            messages.append({"role": "assistant", "content": "click('13')"})
        messages.append(
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"Step {step + 1}: the page."},
                    {"type": "image_url", "image_url": {"url": uri}},
                ],
            }
        )
    return messages


def template_module() -> Any:
    """The module of ``ChatTemplate`` in the ep_trl imported: ``trajectory.template`` since issue 49 split it out of
    ``trajectory.tokens``, where the code this benchmark compares with has it."""
    import importlib

    try:
        return importlib.import_module("ep_trl.trajectory.template")
    except ModuleNotFoundError:
        return importlib.import_module("ep_trl.trajectory.tokens")


def renders_once(templates: Any) -> bool:
    """Whether the ep_trl imported renders each image once per episode (``EpisodeImages`` in its ``templates``
    module, :func:`template_module`; the code before did not)."""
    return hasattr(templates, "EpisodeImages")


def one_step(args: argparse.Namespace, processor: Any, uris: list[list[str]]) -> dict[str, Any]:
    import asyncio

    from trl.experimental.async_grpo.packing import TreeRow

    from ep_trl.adapters.async_worker import group_samples
    from ep_trl.trainers.async_images import ImagesRolloutCollator
    from ep_trl.trajectory.sample_images import images_of, process_images
    from ep_trl.trajectory.tokens import Trajectory
    from tests.support.async_training import released_group
    from tests.support.images import ImageProcessorCalls

    templates = template_module()
    ChatTemplate = templates.ChatTemplate
    once = renders_once(templates)
    # the worker's template: it keeps the pixels of each image's one processing for the samples (this code on)
    template = ChatTemplate(processor, keep_pixels=True) if once else ChatTemplate(processor)
    completion = tuple(processor.tokenizer.encode("click('13')"))
    text_only = ChatTemplate(processor.tokenizer)  # the renders' text part: the same turns, image parts dropped
    text_cpu = time.process_time()
    for episode in uris:
        for k in range(1, args.screenshots + 1) if args.render else [args.screenshots]:
            text_only.prompt(conversation(episode, k))
    text_cpu = time.process_time() - text_cpu
    calls = ImageProcessorCalls(processor)  # every image processed in the step: renders, samples, collator
    render_cpu = time.process_time()
    trajectories = []
    for episode in uris:  # each turn renders the conversation so far, as an episode does
        turns = range(1, args.screenshots + 1) if args.render else [args.screenshots]
        if once:
            episode_images = templates.EpisodeImages()
            for k in turns:  # the turn's new screenshots processed in a thread, then the render on the "loop"
                asyncio.run(template.prepare_images(conversation(episode, k), episode_images))
                prompt = template.prompt(conversation(episode, k), images=episode_images)
        else:
            for k in turns:
                prompt = template.prompt(conversation(episode, k))
        trajectory = Trajectory(
            prompt.ids, completion, (-0.5,) * len(completion), (1,) * len(completion), images=prompt.images
        )
        trajectories.append(template.carried(trajectory, episode_images) if once else trajectory)
    render_cpu = time.process_time() - render_cpu
    rendered = calls.images
    groups = [
        released_group(
            g,
            f"Task {g}",
            trajectories[g * args.generations : (g + 1) * args.generations],
            scores=[float(k) for k in range(args.generations)],
        )
        for g in range(args.groups)
    ]
    worker_cpu, worker_wall = time.process_time(), time.perf_counter()
    samples = [s for group in groups for s in group_samples(group, processor.tokenizer, processor).samples]
    worker_cpu, worker_wall = time.process_time() - worker_cpu, time.perf_counter() - worker_wall
    after_render = calls.images
    carried = sum(
        t.numel() * t.element_size()
        for s in samples
        if getattr(s.input_ids, "processed", None)
        for t in s.input_ids.processed.pixels.values()
    )
    collator = ImagesRolloutCollator(pad_token_id=processor.tokenizer.pad_token_id or 0, processing_class=processor)
    collate_cpu, collate_wall = time.process_time(), time.perf_counter()
    for start in range(0, len(samples), args.batch_size):
        row = TreeRow()
        for s in samples[start : start + args.batch_size]:  # as TRL's RolloutQueueDataset hands samples on
            row.add(
                {
                    "input_ids": s.input_ids,
                    "completion_mask": s.completion_mask,
                    "old_log_probs": s.old_log_probs,
                    "advantage": s.advantage,
                    "group_id": s.group_id,
                    "metrics": s.metrics,
                }
            )
        collator.torch_call([[row]])
    collate_cpu, collate_wall = time.process_time() - collate_cpu, time.perf_counter() - collate_wall
    images = sum(len(images_of(s.input_ids)) for s in samples)
    step_processed = calls.images
    calls.remove()  # the next step counts afresh
    # the yardstick: each of the step's images processed once (one processing of each episode's screenshots)
    once_cpu = time.process_time()
    for s in samples:
        process_images(processor, images_of(s.input_ids))
    once_cpu = time.process_time() - once_cpu
    image_cpu = (render_cpu - text_cpu if args.render else 0.0) + worker_cpu + collate_cpu
    return {
        "images": images,
        "renders_once": once,
        "worker_cpu_ms": round(worker_cpu * 1e3, 1),
        "worker_wall_ms": round(worker_wall * 1e3, 1),
        "collate_cpu_ms": round(collate_cpu * 1e3, 1),
        "collate_wall_ms": round(collate_wall * 1e3, 1),
        "step_cpu_ms": round((worker_cpu + collate_cpu) * 1e3, 1),
        "images_processed": step_processed - rendered,
        "processings_per_image": round((step_processed - rendered) / images, 2),
        "carried_mb": round(carried / 1e6, 1),
        "carried_mb_per_image": round(carried / images / 1e6, 2),
        "render_cpu_ms": round(render_cpu * 1e3, 1) if args.render else None,
        "render_images_processed": rendered if args.render else None,
        "render_text_cpu_ms": round(text_cpu * 1e3, 1) if args.render else None,
        "step_processings_per_image": round(step_processed / images, 2) if args.render else None,
        "image_cpu_ms": round(image_cpu * 1e3, 1) if args.render else None,
        "one_processing_cpu_ms": round(once_cpu * 1e3, 1),
        "image_cpu_over_one_processing": round(image_cpu / once_cpu, 2) if args.render else None,
        "worker_images_processed": after_render - rendered,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processors", nargs="+", default=["tiny", "smolvlm"])
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--generations", type=int, default=2)
    parser.add_argument("--screenshots", type=int, default=5, help="screenshots per episode (one per observation)")
    parser.add_argument("--batch-size", type=int, default=4, help="samples per micro-batch (one packed row)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--render", action="store_true", help="also time the episodes' turn rendering")
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = parser.parse_args()
    record = run_record.start(REPO)

    from ep_trl.devtools.tiny_vlm import build_tiny_vlm

    tiny_dir = build_tiny_vlm(Path(tempfile.gettempdir()) / "ep_trl_bench_tiny_vlm", seed=0)
    episodes = args.groups * args.generations
    uris = [
        [screenshot_uri(args.width, args.height, seed=e * args.screenshots + k) for k in range(args.screenshots)]
        for e in range(episodes)
    ]
    runs = []
    for name in args.processors:
        processor = processor_of(name, tiny_dir)
        for repeat in range(args.repeats):
            row = {
                "processor": name,
                "width": args.width,
                "height": args.height,
                "episodes": episodes,
                "screenshots": args.screenshots,
                "repeat": repeat,
                **one_step(args, processor, uris),
            }
            runs.append(row)
            print(json.dumps(row), flush=True)
        rows = [r for r in runs if r["processor"] == name]
        median = {
            key: statistics.median(r[key] for r in rows)
            for key in ("step_cpu_ms", "worker_cpu_ms", "collate_cpu_ms", "one_processing_cpu_ms")
        }
        print(
            f"{name}: {rows[0]['images']} images, step CPU {median['step_cpu_ms']:.0f} ms (worker "
            f"{median['worker_cpu_ms']:.0f}, collator {median['collate_cpu_ms']:.0f}), "
            f"{rows[0]['processings_per_image']} processings per image, carried {rows[0]['carried_mb']} MB",
            flush=True,
        )
        if args.render:
            image_cpu = statistics.median(r["image_cpu_ms"] for r in rows)
            print(
                f"{name}: with the renders, image CPU {image_cpu:.0f} ms (render "
                f"{statistics.median(r['render_cpu_ms'] for r in rows):.0f}), "
                f"{rows[0]['step_processings_per_image']} processings per image; each image processed once costs "
                f"{median['one_processing_cpu_ms']:.0f} ms: {image_cpu / median['one_processing_cpu_ms']:.2f}x",
                flush=True,
            )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"run": run_record.finish(record), "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
