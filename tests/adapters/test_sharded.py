"""Episodes played by shard processes (``RolloutOptions(worker_processes=N)``): the same output, in prompt order."""

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from ep_trl import ConfigError, RolloutOptions, create_openenv_vllm_rollout_func, dataset_from_eval
from ep_trl.adapters.sharded import join_metrics, join_outputs, shard_bounds
from tests.runtime.test_shutdown import (
    CHILD_PYTHONPATH,
    GRACE_ENV,
    REPO,
    child_environment,
    lines,
    processes_tagged,
    run_program,
)
from tests.support.faulty_vllm import FaultyVLLMServer
from tests.support.trainers import make_trainer

if TYPE_CHECKING:
    from collections.abc import Sequence
    from multiprocessing.process import BaseProcess
    from typing import Any

ARITHMETIC = "tests.evals.eval_arithmetic"
LETTERS = "tests.evals.eval_letters::test_letters_pointwise"


def test_shards_are_whole_contiguous_groups() -> None:
    assert shard_bounds(groups=4, group_size=2, total=8, processes=2) == [(0, 4), (4, 8)]
    assert shard_bounds(groups=3, group_size=2, total=6, processes=2) == [(0, 2), (2, 6)]
    assert shard_bounds(groups=1, group_size=4, total=4, processes=3) == [(0, 4)]
    assert shard_bounds(groups=2, group_size=4, total=7, processes=2) == [(0, 4), (4, 7)]


def test_outputs_join_in_shard_order_and_metrics_combine() -> None:
    a: dict[str, list[Any]] = {"prompt_ids": [[1], [2]], "eval_score": [1.0, 0.0]}
    b: dict[str, list[Any]] = {"prompt_ids": [[3]], "eval_score": [None], "images": [["img"]]}
    assert join_outputs([a, b]) == {
        "prompt_ids": [[1], [2], [3]],
        "eval_score": [1.0, 0.0, None],
        "images": [[], [], ["img"]],
    }
    joined = join_metrics(
        [
            {
                "ep_trl/failed_fraction": 0.5,
                "ep_trl/mean_turns": 2.0,
                "ep_trl/errors/generation": 1.0,
                "ep_trl/episodes_per_s": 9.0,
            },
            {
                "ep_trl/failed_fraction": 0.0,
                "ep_trl/mean_turns": 5.0,
                "ep_trl/errors/generation": 2.0,
                "ep_trl/episodes_per_s": 9.0,
            },
        ],
        [2, 1],
        seconds=0.5,
    )
    assert joined == {
        "ep_trl/failed_fraction": pytest.approx(1 / 3),
        "ep_trl/mean_turns": pytest.approx(3.0),
        "ep_trl/errors/generation": 3.0,
        "ep_trl/episodes_per_s": 6.0,
    }


def group_numbers(log_home: Path, rollout_ids: "Sequence[str]") -> list[int]:
    """The run-wide prompt group of each rollout, as its ep logs row records it."""
    from ep_trl.evalprotocol.store import StoreLogger

    store = StoreLogger(log_home / ".eval_protocol" / "logs.db")
    return [store.read(rollout_id)[-1].execution_metadata.extra["ep_trl"]["group"] for rollout_id in rollout_ids]


def shard_processes() -> "list[BaseProcess]":
    """This process's shard processes (its children named ep-trl-shard-N), in order."""
    import multiprocessing

    return sorted(
        (p for p in multiprocessing.active_children() if p.name.startswith("ep-trl-shard-")), key=lambda p: p.name
    )


@pytest.mark.timeout(300)
def test_two_workers_return_what_one_process_returns(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A processor eval (LiteLLM's SingleTurn-like arithmetic eval) on a server with canned tokens: the rows, ids,
    masks, logprobs and scores of two workers are those of one process, in prompt order, and so are the run-wide
    prompt group numbers (task rotation, ep logs), call after call; close() ends the workers."""
    prompts = [p for p in dataset_from_eval(ARITHMETIC)["prompt"] for _ in range(2)]
    with FaultyVLLMServer(ok_token_ids=(20, 21, 22)) as server:
        one = create_openenv_vllm_rollout_func(
            ARITHMETIC, vllm_base_url=server.url, options=RolloutOptions(log_home=str(tmp_path / "one"))
        )
        two = create_openenv_vllm_rollout_func(
            ARITHMETIC,
            vllm_base_url=server.url,
            options=RolloutOptions(worker_processes=2, log_home=str(tmp_path / "two")),
        )
        trainer = make_trainer(
            tiny_model_dir,
            tmp_path,
            one,
            num_generations=2,
            batch_size=4,
            max_steps=1,
            max_completion_length=32,
            prompts=prompts,
        )
        try:
            expected, got = one(prompts, trainer), two(prompts, trainer)
            expected_again, again = one(prompts, trainer), two(prompts, trainer)  # settings sent once, then reused
            one.flush_logs()
            workers = shard_processes()
            assert [w.name for w in workers] == ["ep-trl-shard-0", "ep-trl-shard-1"] and all(
                w.is_alive() for w in workers
            )
        finally:
            one.close()
            two.close()
    assert not any(w.is_alive() for w in workers)
    for key in ("prompt_ids", "completion_ids", "logprobs", "env_mask", "eval_score", "num_turns", "episode_status"):
        assert got[key] == expected[key], key
        assert again[key] == expected[key], key
    assert sorted(got) == sorted(expected) and len(set(got["rollout_id"])) == len(prompts)
    groups = group_numbers(tmp_path / "one", expected["rollout_id"] + expected_again["rollout_id"])
    assert groups == [g for g in range(len(prompts)) for _ in range(2)]  # two calls of len(prompts) / 2 groups
    assert group_numbers(tmp_path / "two", got["rollout_id"] + again["rollout_id"]) == groups


def test_workers_need_a_server_and_a_batch_they_can_split() -> None:
    with pytest.raises(ConfigError, match="backend='trainer'"):
        create_openenv_vllm_rollout_func(ARITHMETIC, backend="trainer", options=RolloutOptions(worker_processes=2))
    with pytest.raises(ConfigError, match="worker_processes"):
        RolloutOptions(worker_processes=0)


@pytest.mark.timeout(300)
def test_a_worker_gone_is_named_and_the_others_answers_are_read(tiny_model_dir: Path, tmp_path: Path) -> None:
    prompts = [p for p in dataset_from_eval(ARITHMETIC)["prompt"] for _ in range(2)]
    with FaultyVLLMServer(ok_token_ids=(20, 21, 22)) as server:
        two = create_openenv_vllm_rollout_func(
            ARITHMETIC, vllm_base_url=server.url, log_rollouts=False, options=RolloutOptions(worker_processes=2)
        )
        trainer = make_trainer(
            tiny_model_dir,
            tmp_path,
            two,
            num_generations=2,
            batch_size=4,
            max_steps=1,
            max_completion_length=32,
            prompts=prompts,
        )
        try:
            two(prompts, trainer)
            first, second = shard_processes()
            first.kill()
            first.join(10)
            with pytest.raises(RuntimeError, match="ep-trl-shard-0.*ended during a rollout call"):
                two(prompts, trainer)
            assert second.is_alive() and shard_processes() == [second]  # the other worker lives on
        finally:
            two.close()


@pytest.mark.timeout(300)
def test_a_fork_closing_it_leaves_the_parents_workers_alone_and_a_closed_or_terminating_one_refuses_calls(
    tiny_model_dir: Path,
) -> None:
    """Issue 40: a forked child's close() sent the stop message down the pipes it shares with the parent (and its
    exit had multiprocessing terminate the parent's workers); a call after close() returned {} (TRL failed far
    away); a call after a swallowed SIGTERM started anyway."""
    prompts = [p for p in dataset_from_eval(ARITHMETIC)["prompt"][:2] for _ in range(2)]
    with FaultyVLLMServer(ok_token_ids=(20, 21, 22)) as server:
        result, _ = run_program(
            textwrap.dedent(f"""
            from transformers import AutoTokenizer
            from ep_trl import create_openenv_vllm_rollout_func
            from ep_trl.engine.caller import DetachedCaller, TrainingConfig
            from ep_trl.generation import SamplingParams
            from ep_trl.adapters.sharded import ShardedRolloutFunction

            prompts = {prompts!r}
            config = TrainingConfig(AutoTokenizer.from_pretrained({str(tiny_model_dir)!r}), num_generations=2,
                                    max_completion_length=32, sampling=SamplingParams(), vllm_mode="server")
            # one shard process (what worker_processes=N makes, N times): the test's cost is the worker's start-up
            factory_kwargs = dict(vllm_base_url={server.url!r}, log_rollouts=False)
            sharded = ShardedRolloutFunction({ARITHMETIC!r}, factory_kwargs, 1, "sharded",
                                             build=create_openenv_vllm_rollout_func)

            def call(what):
                try:
                    out = sharded.run(prompts, DetachedCaller(config, 0, None, {{}}.update))
                    print(what, "ANSWERED", len(out.get("prompt_ids", [])), flush=True)
                except BaseException as error:
                    print(what, "REFUSED", f"{{type(error).__name__}}: {{error}}", flush=True)

            call("FIRST")
            child = os.fork()
            if child == 0:
                call("IN THE CHILD")
                sharded.close()
                sys.exit(0)  # a normal exit: the child's exit handlers run
            os.waitpid(child, 0)
            call("AFTER THE CHILD")
            sharded.close()
            call("AFTER CLOSE")
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
            except BaseException:  # library code that swallows everything
                print("SWALLOWED", flush=True)
            call("AFTER SIGTERM")
        """),
            timeout=240,
        )
    out = lines(result.stdout)
    assert [line.split(":")[0] for line in out] == [
        "FIRST ANSWERED 4",
        "IN THE CHILD REFUSED RuntimeError",
        "AFTER THE CHILD ANSWERED 4",
        "AFTER CLOSE REFUSED RuntimeError",
        "SWALLOWED",
        "AFTER SIGTERM REFUSED Terminated",
        "CLOSED",
    ], (result.stdout, result.stderr[-3000:])
    assert "was forked from it and cannot use them" in out[1] and "was closed (close())" in out[3], out
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_a_trainer_ended_mid_call_has_its_shards_cancel_the_call_and_write_their_rows(
    signum: signal.Signals, tiny_model_dir: Path, letters_server: str, tmp_path: Path
) -> None:
    """Issue 48: at SIGTERM, close() waited 30 s on each shard in turn for a call it never cancelled, past the 20 s
    grace here, and the shards, their trainer force-exited, ended with os._exit(1), their queued rows lost. Now
    both shards' calls (every episode waiting on a generation that never comes) are cancelled at once, their rows
    written, and the trainer ends by itself within seconds; a trainer SIGKILLed has its shards do the same."""
    tag, home = uuid.uuid4().hex, tmp_path / "home"
    program = textwrap.dedent(f"""
        from transformers import AutoTokenizer
        from ep_trl.adapters.sharded import ShardedRolloutFunction
        from ep_trl.engine.caller import DetachedCaller, TrainingConfig
        from ep_trl.generation import SamplingParams
        from ep_trl.options import RolloutOptions
        from tests.support.shard_faults import rows_held_until_closed

        config = TrainingConfig(AutoTokenizer.from_pretrained({str(tiny_model_dir)!r}), num_generations=2,
                                max_completion_length=32, sampling=SamplingParams(), vllm_mode="server")
        sharded = ShardedRolloutFunction({LETTERS!r}, dict(vllm_base_url=URL, options=RolloutOptions(
            log_home={str(home)!r})), 2, "sharded", build=rows_held_until_closed)
        sharded.run([[{{"role": "user", "content": "Play the letters game."}}]] * 4,
                    DetachedCaller(config, 0, None, {{}}.update))
        print("ANSWERED", flush=True)
    """)
    with FaultyVLLMServer(default="hang") as server:  # every generation waits until the server closes
        env = {**child_environment(), "PYTHONPATH": CHILD_PYTHONPATH, "EP_TRL_TEST_RUN": tag, GRACE_ENV: "20"}
        trainer = subprocess.Popen(
            [sys.executable, "-c", program.replace("URL", repr(server.url))],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 180
            while server.max_concurrent_prompts < 4:  # both shards' episodes are waiting on their first turn
                assert trainer.poll() is None and time.monotonic() < deadline, trainer.communicate()
                time.sleep(0.2)
            trainer.send_signal(signum)
            sent = time.monotonic()
            stdout, stderr = trainer.communicate(timeout=60)
            seconds = time.monotonic() - sent
        finally:
            if trainer.poll() is None:
                trainer.kill()
                trainer.wait()
        gone = time.monotonic() + 15
        while (left := processes_tagged(tag)) and time.monotonic() < gone:
            time.sleep(0.2)
        for pid, _ in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, left
        shards_gone_s = time.monotonic() - sent
    if signum == signal.SIGTERM:
        assert trainer.returncode == 143 and "did not exit within" not in stderr, stderr[-3000:]
        assert "ANSWERED" not in stdout and seconds < 10, (seconds, stderr[-3000:])  # not the 20 s grace
    from ep_trl.evalprotocol.store import StoreLogger

    rows = StoreLogger(home / ".eval_protocol" / "logs.db").read()
    assert len({row.execution_metadata.rollout_id for row in rows}) == 4, (shards_gone_s, stderr[-3000:])
