"""Training rollouts in eval-protocol's store: every episode, its status, its score and its ids."""

import os
from collections import Counter, defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eval_protocol.dataset_logger.sqlite_dataset_logger_adapter import SqliteDatasetLoggerAdapter
from eval_protocol.models import Status

from ep_trl import RolloutOptions, create_openenv_vllm_rollout_func
from ep_trl.adapters.rollout_func import RolloutFunction
from tests.support.trainers import PROMPT, make_trainer

if TYPE_CHECKING:
    from eval_protocol.models import EvaluationRow


def stored_rows(home: str, invocation_id: str) -> "list[EvaluationRow]":
    store = SqliteDatasetLoggerAdapter(db_path=str(Path(home) / ".eval_protocol" / "logs.db"))
    return [r for r in store.read() if r.execution_metadata.invocation_id == invocation_id]


def test_training_rollouts_are_stored_scored_and_grouped(
    tiny_model_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    given: dict[str, float | None] = {}

    def recording_eval_score(
        completions: list[Any], eval_score: list[float | None], rollout_id: list[str], **kwargs: object
    ) -> list[float | None]:
        given.update(zip(rollout_id, eval_score))
        return eval_score

    rollout = create_openenv_vllm_rollout_func("tests.evals.eval_letters::test_letters_pointwise")  # default store
    assert isinstance(rollout, RolloutFunction)
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        rollout,
        reward_funcs=[recording_eval_score],
        max_steps=2,
        prompts=[PROMPT] * 4 + ["Second prompt."] * 4,
    )
    try:
        trainer.train()
        rollout.flush_logs()
    finally:
        rollout.close()
    rows = stored_rows(os.environ["HOME"], rollout.invocation_id)
    assert len(rows) == 8 == len(given)  # 2 steps x 4 rollouts, one row each
    by_step = defaultdict(list)
    for row in rows:
        meta, extra = row.execution_metadata, row.execution_metadata.extra
        assert row.rollout_status.code == Status.Code.FINISHED
        assert row.evaluation_result.score == given[meta.rollout_id]  # the reward TRL received
        assert row.eval_metadata.name == "test_letters_pointwise"
        assert extra["ep_trl"]["status"] == "finished" and len(extra["step_rewards"]) == 3
        assert [m.role for m in row.messages].count("assistant") == 3  # per-turn completion text
        assert extra["ep_trl"]["sampled_tokens"] == sum(extra["ep_trl"]["turn_sampled_tokens"]) > 0
        assert extra["ep_trl"]["mean_sampled_logprob"] < 0
        assert row.input_metadata.completion_params["policy_step"] == extra["ep_trl"]["global_step"]
        by_step[meta.run_id].append(row)
    assert sorted(by_step) == ["step-0", "step-1"]
    for step_rows in by_step.values():
        assert len({r.execution_metadata.experiment_id for r in step_rows}) == 1
        # one prompt group per step: one row id, one group, generations 0..3
        assert len({r.input_metadata.row_id for r in step_rows}) == 1
        assert len({r.execution_metadata.extra["ep_trl"]["group"] for r in step_rows}) == 1
        assert sorted(r.execution_metadata.extra["ep_trl"]["member"] for r in step_rows) == [0, 1, 2, 3]
    assert len({r.execution_metadata.rollout_id for r in rows}) == 8


def test_rows_are_logged_while_running_and_failures_carry_their_message(
    tiny_model_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    rollout = create_openenv_vllm_rollout_func(
        "tests.evals.eval_crash", options=RolloutOptions(log_home=tmp_path / "store")
    )
    assert isinstance(rollout, RolloutFunction)
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout)
    try:
        out = rollout([PROMPT] * 4, trainer)
        rollout.flush_logs()
        writer = rollout.log_writer
        assert writer is not None
        # started + one update per completed environment step (1 before the crash) + final, per episode
        assert writer.queued == 4 * (1 + 1 + 1) and writer.failures == 0
    finally:
        rollout.close()
    rows = stored_rows(str(tmp_path / "store"), rollout.invocation_id)
    assert Counter(r.execution_metadata.rollout_id for r in rows) == Counter(out["rollout_id"])
    for row in rows:
        assert row.rollout_status.code != Status.Code.FINISHED
        assert "crashed on purpose" in row.rollout_status.message
        assert row.evaluation_result is None
        assert "not scored" in row.execution_metadata.extra["unscored_reason"]


def test_logging_can_be_turned_off(tiny_model_dir: Path, letters_server: str, tmp_path: Path) -> None:
    rollout = create_openenv_vllm_rollout_func(
        "tests.evals.eval_letters", log_rollouts=False, options=RolloutOptions(log_home=tmp_path)
    )
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout)
    try:
        rollout([PROMPT] * 4, trainer)
    finally:
        rollout.close()
    assert not (tmp_path / ".eval_protocol" / "logs.db").exists()
