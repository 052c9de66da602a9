"""Training rollouts in the real ``ep logs`` UI, seen through headless Chromium.

A short GRPO run on the letters env logs to the session's default store ($HOME/.eval_protocol). Then
``ep logs`` serves that store and the page must show every training rollout of the run: eval name, step, score
(the reward TRL got), finished/error status. A rollout call made while the page is open must appear without
a reload (eval-protocol's event bus + websocket), and its token view must show the training mask. The
screenshots go to the test's temporary directory, or to docs/images/ with ``EP_TRL_UPDATE_DOC_IMAGES=1`` (how the
docs' pictures are made; a plain test run leaves the checkout as it found it).
"""

import os
from concurrent.futures import ThreadPoolExecutor
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

from ep_trl import EvalOverrides, create_openenv_vllm_rollout_func
from ep_trl.adapters.rollout_func import RolloutFunction
from tests.support.ep_logs import chromium_page, row_text, start_ep_logs, table_url, wait_for_row, wait_for_text
from tests.support.trainers import PROMPT, make_trainer

EVAL = "tests.evals.eval_letters::test_letters_pointwise"
PROMPTS = [PROMPT, "Play the letters game, round two."]
DOC_IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"


def shown_score(score: float) -> str:
    """A score as the UI prints it: JavaScript's ``toFixed(3)`` (exact binary value, ties away from zero)."""
    return str(Decimal(score).quantize(Decimal("0.001"), rounding=ROUND_HALF_UP))


def test_training_rollouts_show_in_ep_logs(tiny_model_dir: Path, letters_server: str, tmp_path: Path) -> None:
    given: dict[str, float | None] = {}
    step_of: dict[str, int] = {}

    def recording_eval_score(
        completions: list[Any], eval_score: list[float | None], rollout_id: list[str], **kwargs: object
    ) -> list[float | None]:
        given.update(zip(rollout_id, eval_score))
        step_of.update((rid, trainer.state.global_step) for rid in rollout_id)
        return eval_score

    # two prompt groups per step; tasks rotate per group, and "crash" episodes fail at step 2 (error rows)
    rollout = create_openenv_vllm_rollout_func(
        EVAL, overrides=EvalOverrides(tasks=["vowels", "digits", "crash"])
    )  # default store
    assert isinstance(rollout, RolloutFunction)
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        rollout,
        reward_funcs=[recording_eval_score],
        max_steps=2,
        batch_size=8,
        prompts=PROMPTS * 8,
    )
    pool = ThreadPoolExecutor(1)
    booting = pool.submit(start_ep_logs, os.environ["HOME"], tmp_path / "logs")  # boots (~5 s) during training
    try:
        trainer.train()
        rollout.flush_logs()
        server = booting.result()
        images = DOC_IMAGES if os.environ.get("EP_TRL_UPDATE_DOC_IMAGES") == "1" else tmp_path / "images"
        images.mkdir(parents=True, exist_ok=True)
        assert len(given) == 16 and sum(s is None for s in given.values()) == 4  # one crashed group of 4
        with chromium_page(height=1450) as (page, console_errors):
            page.goto(table_url(server, [rollout.invocation_id]))
            wait_for_text(page, ["Connected", "test_letters_pointwise", *given])
            for rid, score in given.items():
                text = row_text(page, rid)
                assert f"step-{step_of[rid]}" in text, text
                if score is None:
                    assert "error" in text and "N/A" in text, text  # a crashed episode: error, no score
                else:
                    assert "finished" in text and shown_score(score) in text, text
            crashed = next(rid for rid, score in given.items() if score is None)
            page.locator("tbody tr", has_text=crashed).first.click()  # expanded: the status message
            wait_for_text(page, ["crashed on purpose"])
            page.locator("tbody tr", has_text=crashed).first.click()

            # live: rows logged while the page is open arrive over the websocket, then their final state
            out = rollout(PROMPTS[:1] * 4 + PROMPTS[1:] * 4, trainer)
            rollout.flush_logs()
            live = dict(zip(out["rollout_id"], out["eval_score"]))
            wait_for_text(page, list(live))
            for rid, score in live.items():
                text = wait_for_row(page, rid, "finished" if score is not None else "error")
                assert "step-2" in text and (score is None or shown_score(score) in text), text
            page.screenshot(path=str(images / "ep-logs-training.png"))  # three steps of rows

            # the token view of a finished rollout shows exactly the tokens TRL trains on
            i = out["episode_status"].index("finished")
            trained = sum(out["env_mask"][i])
            total = len(out["prompt_ids"][i]) + len(out["completion_ids"][i])
            clicked = page.locator("tbody tr", has_text=out["rollout_id"][i]).first
            clicked.click()
            wait_for_text(page, ["Token Debug", f"unmasked: {trained}", f"masked: {total - trained}"])
            # the clicked row just under the table's sticky header, the screenshot down to the token view's end
            clicked.evaluate(
                "row => { row.scrollIntoView({block: 'start'}); row.closest('.overflow-auto').scrollTop -= 40; }"
            )
            box = page.locator("div.rounded", has_text="Text + Mask").last.bounding_box()
            page.screenshot(
                path=str(images / "ep-logs-token-view.png"),
                clip={"x": 0, "y": 0, "width": 1600, "height": min(1450, box["y"] + box["height"] + 16)},
            )
        assert all(
            (images / name).stat().st_size > 10_000 for name in ("ep-logs-training.png", "ep-logs-token-view.png")
        )
        assert not [e for e in console_errors if "Failed to parse" in e], console_errors  # rows fit the UI schema
        assert server.output().count("WebSocket connected.") == 1  # the live rows came without a reconnect
    finally:
        rollout.close()
        if booting.exception() is None:  # waits for the boot to end either way
            booting.result().stop()
        pool.shutdown()
