"""The rollout function called directly, as GRPOTrainer calls it, against the real letters env server."""

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from ep_trl import EvalOverrides, RolloutOptions, create_openenv_vllm_rollout_func
from tests.support.references import sampled_texts, teacher_forced_logprobs
from tests.support.tracked_env import TrackedLettersEnv
from tests.support.trainers import PROMPT, make_trainer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase
    from trl import GRPOConfig, GRPOTrainer

    from ep_trl.adapters.rollout_func import RolloutFunction
    from ep_trl.adapters.sharded import ShardedRolloutFunction
    from tests.support.letters import LettersEpisodes


EVAL = "tests.evals.eval_letters::test_letters_pointwise"


@pytest.fixture(scope="module")
def pointwise(
    tiny_model_dir: Path, letters_server: str, tmp_path_factory: pytest.TempPathFactory
) -> "Iterator[tuple[RolloutFunction | ShardedRolloutFunction, GRPOTrainer]]":
    rollout = create_openenv_vllm_rollout_func(EVAL)
    trainer = make_trainer(tiny_model_dir, tmp_path_factory.mktemp("out"), rollout)
    yield rollout, trainer
    rollout.close()


def rollout_once(
    env_path: str,
    model_dir: Path,
    tmp_path: Path,
    prompts: list[Any],
    trainer_kwargs: dict[str, Any] | None = None,
    **options: Any,
) -> dict[str, list[Any]]:
    """A fresh rollout function and trainer, one call with ``prompts``, then closed."""
    rollout = create_openenv_vllm_rollout_func(env_path, **options)
    trainer = make_trainer(model_dir, tmp_path, rollout, **(trainer_kwargs or {}))
    try:
        return rollout(prompts, trainer)
    finally:
        rollout.close()


def test_rows_match_prompts_in_count_order_and_shape(
    pointwise: "tuple[RolloutFunction | ShardedRolloutFunction, GRPOTrainer]", letters_episodes: "LettersEpisodes"
) -> None:
    rollout, trainer = pointwise
    prompts = ["Play the letters game."] * 4 + ["Play the letters game, round two."] * 4
    out = rollout(prompts, trainer)
    assert set(out) >= {
        "prompt_ids",
        "completion_ids",
        "logprobs",
        "env_mask",
        "eval_score",
        "step_rewards",
        "num_turns",
        "episode_status",
        "template_realigned",
    }
    for key, values in out.items():
        assert len(values) == len(prompts), key
    tok = cast("PreTrainedTokenizerBase", trainer.processing_class)
    for i, prompt in enumerate(prompts):
        assert prompt in tok.decode(out["prompt_ids"][i])  # row i belongs to prompt i
        n = len(out["completion_ids"][i])
        assert n > 0 and len(out["logprobs"][i]) == n and len(out["env_mask"][i]) == n
        assert out["episode_status"][i] == "finished"
        assert out["num_turns"][i] == 3 == len(out["step_rewards"][i])
    # tasks rotate per prompt group: the first group plays one task, the second the next
    tasks = [ep["task_name"] for ep in letters_episodes()]
    assert Counter(tasks) == Counter({"vowels": 4, "digits": 4})


def test_sampled_segments_are_the_actions_the_env_received(
    pointwise: "tuple[RolloutFunction | ShardedRolloutFunction, GRPOTrainer]", letters_episodes: "LettersEpisodes"
) -> None:
    rollout, trainer = pointwise
    out = rollout([PROMPT] * 4, trainer)
    received = [tuple(ep["actions"]) for ep in letters_episodes()]
    assert Counter(sampled_texts(cast("PreTrainedTokenizerBase", trainer.processing_class), out)) == Counter(received)
    # environment tokens between turns are masked, and only there
    assert len(out["completion_ids"]) == len(out["env_mask"]) == len(out["num_turns"]) == 4
    for ids, mask, n in zip(out["completion_ids"], out["env_mask"], out["num_turns"]):
        runs = sum(1 for i, m in enumerate(mask) if m == 1 and (i == 0 or mask[i - 1] == 0))
        assert runs == n and mask[0] == 1 and mask[-1] == 1


def test_mask1_logprobs_are_the_models_teacher_forced_logprobs(
    pointwise: "tuple[RolloutFunction | ShardedRolloutFunction, GRPOTrainer]",
) -> None:
    rollout, trainer = pointwise
    out = rollout([PROMPT] * 4, trainer)
    model = trainer.model
    assert model is not None
    model.eval()
    worst = 0.0
    assert len(out["prompt_ids"]) == len(out["completion_ids"]) == len(out["logprobs"]) == len(out["env_mask"]) == 4
    for p, c, lps, mask in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"]):
        reference = teacher_forced_logprobs(model, p, c, cast("GRPOConfig", trainer.args).temperature)
        for lp, ref, m in zip(lps, reference, mask):
            if m:
                worst = max(worst, abs(lp - ref))
                assert lp < 0
            else:
                assert lp == 0.0
    assert worst < 1e-3, worst


def test_scores_are_the_eval_bodys_and_step_rewards_the_envs(
    pointwise: "tuple[RolloutFunction | ShardedRolloutFunction, GRPOTrainer]", letters_episodes: "LettersEpisodes"
) -> None:
    rollout, trainer = pointwise
    out = rollout([PROMPT] * 4, trainer)
    env_rewards = Counter(tuple(ep["rewards"]) for ep in letters_episodes())
    assert Counter(tuple(r) for r in out["step_rewards"]) == env_rewards
    assert len(out["eval_score"]) == len(out["step_rewards"]) == 4
    for score, rewards in zip(out["eval_score"], out["step_rewards"]):
        # the eval body: mean step reward + its evaluation_test_kwargs bonus (0.0)
        assert score == pytest.approx(sum(rewards) / len(rewards))


def test_eval_kwargs_override_reaches_the_body(tiny_model_dir: Path, letters_server: str, tmp_path: Path) -> None:
    out = rollout_once(
        EVAL, tiny_model_dir, tmp_path, [PROMPT] * 4, overrides=EvalOverrides(evaluation_test_kwargs={"bonus": 10.0})
    )
    assert len(out["eval_score"]) == len(out["step_rewards"]) == 4
    for score, rewards in zip(out["eval_score"], out["step_rewards"]):
        assert score == pytest.approx(10.0 + sum(rewards) / len(rewards))


def test_groupwise_body_scores_each_prompt_group(tiny_model_dir: Path, letters_server: str, tmp_path: Path) -> None:
    out = rollout_once(
        "tests.evals.eval_letters_groupwise",
        tiny_model_dir,
        tmp_path,
        [PROMPT] * 4 + ["Another prompt."] * 4,
        trainer_kwargs=dict(num_generations=4, batch_size=8),
    )
    assert len(out["eval_score"]) == len(out["step_rewards"]) == 8
    for group in (range(0, 4), range(4, 8)):
        sums = [sum(out["step_rewards"][i]) for i in group]
        best = max(sums)
        for i, s in zip(group, sums):
            assert out["eval_score"][i] == pytest.approx(s / best if best else 0.0)
        assert max(out["eval_score"][i] for i in group) == pytest.approx(1.0 if best else 0.0)


def test_episode_budget_stops_before_the_limit(tiny_model_dir: Path, letters_server: str, tmp_path: Path) -> None:
    out = rollout_once(EVAL, tiny_model_dir, tmp_path, [PROMPT] * 4, max_episode_tokens=40)
    assert len(out["completion_ids"]) == len(out["num_turns"]) == 4
    for ids, turns in zip(out["completion_ids"], out["num_turns"]):
        assert 0 < len(ids) <= 40
        assert turns < 3  # a bridge is ~40 tokens with this tokenizer: the budget ends the episode early


def test_env_crash_mid_episode_is_reported_and_unscored(
    tiny_model_dir: Path, letters_server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = rollout_once("tests.evals.eval_crash", tiny_model_dir, tmp_path, [PROMPT] * 4)
    assert out["episode_status"] == ["error"] * 4
    assert out["eval_score"] == [None] * 4
    for ids, mask, rewards, turns in zip(out["completion_ids"], out["env_mask"], out["step_rewards"], out["num_turns"]):
        assert len(rewards) == 1 and turns == 2  # step 1 succeeded; the env died on step 2
        assert len(ids) == len(mask) and all(isinstance(t, int) for t in ids)
    assert "crashed on purpose" in caplog.text


def test_raising_eval_body_leaves_rows_unscored(
    tiny_model_dir: Path, letters_server: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = rollout_once("tests.evals.eval_raising", tiny_model_dir, tmp_path, [PROMPT] * 4)
    assert out["episode_status"] == ["finished"] * 4
    assert out["eval_score"] == [None] * 4
    assert all(len(r) == 3 for r in out["step_rewards"])
    assert "scoring exploded" in caplog.text


def test_a_failing_episode_does_not_abort_the_others(tiny_model_dir: Path, letters_server: str, tmp_path: Path) -> None:
    # the first prompt group plays the crashing task, the second a normal one (tasks rotate per group)
    out = rollout_once(
        EVAL,
        tiny_model_dir,
        tmp_path,
        [PROMPT] * 4 + ["Second prompt."] * 4,
        trainer_kwargs=dict(batch_size=8),
        overrides=EvalOverrides(tasks=["crash", "vowels"]),
    )
    assert out["episode_status"] == ["error"] * 4 + ["finished"] * 4
    assert out["eval_score"][:4] == [None] * 4
    assert all(isinstance(s, float) for s in out["eval_score"][4:])
    assert [len(r) for r in out["step_rewards"][4:]] == [3] * 4


@pytest.mark.parametrize("reuse", [True, False])
def test_env_sessions_are_reused_within_a_call_and_all_closed(
    tiny_model_dir: Path, letters_server: str, letters_episodes: "LettersEpisodes", tmp_path: Path, reuse: bool
) -> None:
    TrackedLettersEnv.clients = []
    rollout = create_openenv_vllm_rollout_func(
        EVAL,
        env_factory=lambda: TrackedLettersEnv(base_url=letters_server),
        overrides=EvalOverrides(tasks=["crash", "vowels"]),
        max_concurrent_rollouts=2,
        options=RolloutOptions(reuse_env_sessions=reuse),
    )
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout, batch_size=8)
    try:
        out = rollout([PROMPT] * 4 + ["Second prompt."] * 4, trainer)
    finally:
        rollout.close()
    assert out["episode_status"] == ["error"] * 4 + ["finished"] * 4
    assert [len(r) for r in out["step_rewards"][4:]] == [3] * 4  # episodes on reused sessions run in full
    clients = TrackedLettersEnv.clients
    assert sum(c.events.count("reset") for c in clients) == 8 == len(letters_episodes())
    assert all(c.events[-1] == "close" and c.events.count("close") == 1 for c in clients)  # none left open
    for client in clients:  # a session whose episode failed is never handed to another episode
        if "crash" in client.events:
            assert client.events[client.events.index("crash") + 1 :] == ["close"]
    opened = trainer._metrics["train"]["ep_trl/env_sessions_opened"]
    assert opened == [float(len(clients))]
    # 4 crashed sessions are replaced, the rest reused: at most 4 + 2 sessions, against one per episode without reuse
    assert len(clients) <= 6 if reuse else len(clients) == 8


@pytest.mark.timeout(120)
def test_a_forked_child_that_closes_its_parents_rollout_function_releases_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33: ``close()`` called in a forked child released its parent's resources; here the per-rollout copy of
    the eval's MCP config that the parent's episode in flight reads (the processor source's) was deleted. What a
    rollout function holds belongs to the process that made it, as ``ep_trl.runtime.shutdown`` and
    ``ep_trl.runtime.runner`` have it."""
    from ep_trl.adapters.rollout_func import RolloutFunction
    from ep_trl.sources.processor import ProcessorSource

    agent = "tests.evals.eval_calculator_agent"
    config = tmp_path / "calc_stdio.json"  # a stdio server: ep_trl keeps per-rollout copies of the config
    config.write_text(json.dumps({"mcpServers": {"calc": {"command": sys.executable, "args": ["-c", "pass"]}}}))
    monkeypatch.setenv("CALC_MCP_CONFIG", str(config))
    sys.modules.pop(agent, None)
    rollout = create_openenv_vllm_rollout_func(agent, log_rollouts=False)
    try:
        assert isinstance(rollout, RolloutFunction) and isinstance(rollout.source, ProcessorSource)
        copy = Path(rollout.source._mcp.for_rollout("rollout-in-flight").config_path)
        forked = time.monotonic()
        child = os.fork()
        if child == 0:
            code = 1
            try:
                rollout.close()
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(child, 0)
        assert os.waitstatus_to_exitcode(status) == 0 and time.monotonic() - forked < 30
        assert copy.is_file()  # the parent's episode still has its config
    finally:
        rollout.close()
        sys.modules.pop(agent, None)
    assert not copy.exists()  # the parent's own close() removes it
