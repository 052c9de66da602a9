"""Failure is data, proven where users meet it: faults injected into real ``GRPOTrainer.train()`` runs.

Every fault costs its episodes, is counted by kind in the step's metrics and never crashes, hangs or silently
zeroes training; what cannot be trained on (a generation backend gone for good, an eval body that breaks its
contract, several calls in a row without a single score) ends ``train()`` with an error that says what to do.
Each test states its bound with ``pytest.mark.timeout``. Faulty servers and clients here are fakes, named as such.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from transformers import AutoTokenizer, TrainerCallback

from ep_trl import (
    ConfigError,
    EvalOverrides,
    GenerationError,
    NoTrainingSignalError,
    RolloutOptions,
    UnsupportedEvalError,
    VLLMOptions,
    create_openenv_vllm_rollout_func,
)
from ep_trl.envs.letters import LettersEnv
from ep_trl.runtime.processes import free_port, start_server
from tests.support.faulty_vllm import FaultyVLLMServer
from tests.support.trainers import PROMPT, make_trainer

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from transformers import TrainerControl, TrainerState, TrainingArguments
    from trl import GRPOTrainer

    from ep_trl.runtime.processes import ServerProcess

EVAL = "tests.evals.eval_letters::test_letters_pointwise"
BODIES = "tests.evals.eval_faulty_bodies"
REPO = Path(__file__).resolve().parents[2]
FAST_VLLM = VLLMOptions(request_timeout_s=1.0, max_retries=1, retry_backoff_s=0.05, connect_timeout_s=2.0)


def letters_server_on(port: int, log_dir: Path) -> "ServerProcess":
    """A letters server on ``port`` (so a killed one can come back on the same port)."""
    cmd = [sys.executable, "-m", "ep_trl.envs.letters", "--host", "127.0.0.1", "--port", str(port)]
    return start_server("letters-env", cmd, port=port, log_dir=log_dir)


def train(
    model_dir: Path,
    tmp_path: Path,
    env_path: str = EVAL,
    steps: int = 2,
    callbacks: "Iterable[TrainerCallback]" = (),
    options: RolloutOptions | None = None,
    **factory: Any,
) -> "tuple[GRPOTrainer, list[dict[str, float]]]":
    """A real GRPOTrainer run of ``steps`` steps through ``env_path``; the trainer and its per-step logs."""
    factory.setdefault("log_rollouts", False)
    rollout = create_openenv_vllm_rollout_func(
        env_path, options=options or RolloutOptions(max_signal_free_calls=10), **factory
    )
    trainer = make_trainer(model_dir, tmp_path, rollout, max_steps=steps)
    for callback in callbacks:
        trainer.add_callback(callback)
    try:
        trainer.train()
    finally:
        rollout.close()
    return trainer, [log for log in trainer.state.log_history if "ep_trl/failed_fraction" in log]


def at_url(url: str) -> EvalOverrides:
    return EvalOverrides(env_client_cls=LettersEnv, env_base_url=url)


class AtStepEnd(TrainerCallback):
    """Runs ``actions[step]()`` when optimizer step ``step`` ends (fault injection between steps)."""

    def __init__(self, actions: "dict[int, Callable[[], None]]") -> None:
        self.actions = actions

    def on_step_end(
        self, args: "TrainingArguments", state: "TrainerState", control: "TrainerControl", **kwargs: Any
    ) -> None:
        action = self.actions.get(state.global_step)
        if action is not None:
            action()


@pytest.mark.timeout(180)
def test_an_environment_down_at_start_costs_its_episodes_not_the_run(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Before: every episode returned an empty completion and TRL's ids[-1] crashed train() with IndexError."""
    dead = f"http://127.0.0.1:{free_port()}"
    trainer, logs = train(tiny_model_dir, tmp_path, overrides=at_url(dead))
    assert trainer.state.global_step == 2 and len(logs) == 2
    assert [log["ep_trl/errors/environment"] for log in logs] == [4.0, 4.0]
    assert all(log["ep_trl/failed_fraction"] == 1.0 for log in logs)


@pytest.mark.timeout(300)
def test_an_environment_killed_mid_run_and_restarted_on_the_same_port(tiny_model_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    server = {"process": letters_server_on(port, tmp_path / "logs")}

    def kill() -> None:
        server["process"].stop()

    def restart() -> None:
        server["process"] = letters_server_on(port, tmp_path / "logs")

    try:
        _, logs = train(
            tiny_model_dir,
            tmp_path,
            steps=3,
            callbacks=[AtStepEnd({1: kill, 2: restart})],
            overrides=at_url(f"http://127.0.0.1:{port}"),
        )
    finally:
        server["process"].stop()
    assert [log["ep_trl/errors/environment"] for log in logs] == [0.0, 4.0, 0.0]
    assert logs[2]["ep_trl/failed_fraction"] == 0.0  # the same rollout function recovers


@pytest.mark.timeout(300)
def test_an_environment_hung_then_resumed(tiny_model_dir: Path, tmp_path: Path) -> None:
    """SIGSTOP (to the server's process group: the server and its watchdog): connections are accepted by the kernel
    but never answered; every wait is bounded."""
    port = free_port()
    process = letters_server_on(port, tmp_path / "logs")
    started = {}

    def stop() -> None:
        os.killpg(process.pid, signal.SIGSTOP)
        started["hung"] = time.monotonic()

    def resume() -> None:
        started["step_s"] = time.monotonic() - started["hung"]
        os.killpg(process.pid, signal.SIGCONT)

    try:
        _, logs = train(
            tiny_model_dir,
            tmp_path,
            steps=3,
            callbacks=[AtStepEnd({1: stop, 2: resume})],
            overrides=EvalOverrides(
                env_client_cls=LettersEnv, env_base_url=f"http://127.0.0.1:{port}", request_timeout_s=2.0
            ),
        )
    finally:
        os.killpg(process.pid, signal.SIGCONT)
        process.stop()
    assert [log["ep_trl/errors/environment"] for log in logs] == [0.0, 4.0, 0.0]
    assert started["step_s"] < 60  # the hung step ended within its timeouts, not whenever the server woke up


class BlockingForeverClient:
    """Fault injection: a synchronous client whose ``step`` never returns (until the test releases it)."""

    release = threading.Event()

    class Result:
        def __init__(self) -> None:
            self.observation = type("Observation", (), {"prompt": "Say something."})()
            self.reward, self.done = 0.0, False

    def reset(self, **kwargs: Any) -> Result:
        return self.Result()

    def step(self, action: object) -> Result:
        self.release.wait()
        return self.Result()

    def close(self) -> None:
        pass


@pytest.mark.timeout(120)
def test_a_sync_client_that_blocks_forever_twice_in_a_row(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Before: abandoned calls kept asyncio's shared default executor busy, and the second call hung forever."""
    try:
        started = time.monotonic()
        _, logs = train(
            tiny_model_dir, tmp_path, env_factory=BlockingForeverClient, overrides=EvalOverrides(request_timeout_s=1.0)
        )
        elapsed = time.monotonic() - started
    finally:
        BlockingForeverClient.release.set()
    assert [log["ep_trl/errors/environment"] for log in logs] == [4.0, 4.0]
    assert logs[0]["ep_trl/stuck_threads"] >= 4 and logs[1]["ep_trl/stuck_threads"] >= 8  # counted, not hidden
    assert elapsed < 90


@pytest.mark.timeout(180)
def test_calls_without_any_score_end_training_with_what_went_wrong(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Before: with every episode failing, train() went on with loss 0 and grad norm 0, and nothing said so."""
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(NoTrainingSignalError) as raised:
        train(
            tiny_model_dir, tmp_path, steps=5, overrides=at_url(dead), options=RolloutOptions(max_signal_free_calls=2)
        )
    message = str(raised.value)
    assert "2 rollout calls in a row" in message and "max_signal_free_calls=2" in message
    assert "- environment: 4 episode(s); fix: check that the environment, tool or MCP servers are up" in message
    assert f"{dead.split('//')[1]}" in message or "Connect" in message  # the error itself, grouped


@pytest.fixture(scope="module")
def canned_ids(tiny_model_dir: Path) -> tuple[int, ...]:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    return tuple(tok.encode("aei", add_special_tokens=False)) + (tok.convert_tokens_to_ids("<|im_end|>"),)


@pytest.mark.timeout(180)
def test_transient_vllm_errors_are_retried_inside_train(
    tiny_model_dir: Path, tmp_path: Path, letters_server: str, canned_ids: tuple[int, ...]
) -> None:
    with FaultyVLLMServer(plan=[("status", 503), "drop"], ok_token_ids=canned_ids) as server:
        _, logs = train(tiny_model_dir, tmp_path, vllm_base_url=server.url, vllm=replace(FAST_VLLM, max_retries=2))
    assert [log["ep_trl/errors/generation"] for log in logs] == [0.0, 0.0]
    assert [r.action for r in server.requests[:3]] == [("status", 503), "drop", "ok"]  # retried, not failed


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fault", ["hang", "dead", "no_token_ids", ("status", 500)])
def test_a_vllm_server_that_fails_for_good_ends_train_with_the_request_named(
    tiny_model_dir: Path, tmp_path: Path, letters_server: str, canned_ids: tuple[int, ...], fault: str | tuple[str, int]
) -> None:
    """A backend that is gone cannot be trained on: train() raises GenerationError within its timeouts. Before, a
    200 answer without token ids failed every episode quietly, call after call."""
    with FaultyVLLMServer(ok_token_ids=canned_ids) as server:
        if fault == "dead":

            def kill() -> None:  # a dead server: open keep-alive connections are cut too, new ones refused
                server.set_plan([], default="drop")
                server.__exit__(None, None, None)

            callbacks = [AtStepEnd({1: kill})]
        else:
            server.set_plan([], default=fault)
            callbacks = []
        started = time.monotonic()
        with pytest.raises(GenerationError) as raised:
            train(tiny_model_dir, tmp_path, steps=3, callbacks=callbacks, vllm_base_url=server.url, vllm=FAST_VLLM)
    assert time.monotonic() - started < 120
    assert f"{server.url}/v1/completions" in str(raised.value)
    if fault == "no_token_ids":
        assert "lacks token_ids" in str(raised.value)


@pytest.mark.timeout(180)
def test_a_raising_body_leaves_rows_unscored_and_training_goes_on(
    tiny_model_dir: Path, tmp_path: Path, letters_server: str
) -> None:
    _, logs = train(tiny_model_dir, tmp_path, env_path="tests.evals.eval_raising")
    assert [log["ep_trl/unscored_fraction"] for log in logs] == [1.0, 1.0]
    assert all(log["ep_trl/failed_fraction"] == 0.0 for log in logs)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("body", "returned"), [("test_returns_none", "NoneType"), ("test_returns_a_float", "float")])
def test_a_body_that_returns_no_row_is_an_error_naming_the_eval(
    tiny_model_dir: Path, tmp_path: Path, letters_server: str, body: str, returned: str
) -> None:
    """Before: every row went unscored without a word."""
    with pytest.raises(
        UnsupportedEvalError,
        match=rf"{body} returned {returned} where eval-protocol expects the "
        r"EvaluationRow",
    ):
        train(tiny_model_dir, tmp_path, env_path=f"{BODIES}::{body}")


@pytest.mark.timeout(180)
def test_nan_scores_are_counted_as_unscored_and_never_reach_the_reward(
    tiny_model_dir: Path, tmp_path: Path, letters_server: str
) -> None:
    """Before: NaN passed through, the batch reward became NaN and unscored_fraction said 0."""
    trainer, logs = train(tiny_model_dir, tmp_path, env_path=f"{BODIES}::test_nan_score")
    assert [log["ep_trl/unscored_fraction"] for log in logs] == [0.5, 0.5]
    rewards = [log["reward"] for log in trainer.state.log_history if "reward" in log]
    assert rewards and all(r == r for r in rewards)  # not NaN


@pytest.mark.timeout(120)
def test_a_body_slower_than_its_timeout_leaves_rows_unscored_in_bounded_time(
    tiny_model_dir: Path, tmp_path: Path, letters_server: str
) -> None:
    """Before: the body had no timeout (a body sleeping 75 s made a call of 8 rows take 159 s)."""
    started = time.monotonic()
    _, logs = train(
        tiny_model_dir, tmp_path, env_path=f"{BODIES}::test_slow", steps=1, options=RolloutOptions(body_timeout_s=1.0)
    )
    assert time.monotonic() - started < 60  # four bodies of 30 s each, cut at 1 s
    assert logs[0]["ep_trl/unscored_fraction"] == 1.0


def test_a_prompt_message_without_content_names_the_row_and_the_shape(
    tiny_model_dir: Path, tmp_path: Path, letters_server: str
) -> None:
    rollout = create_openenv_vllm_rollout_func(EVAL, log_rollouts=False)
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout)
    try:
        with pytest.raises(
            ConfigError,
            match=r"prompt 2, message 0 is \{'role': 'user'\}: every message needs a "
            r"'role' and a 'content'.*\[\{'role': 'user', 'content'",
        ):
            rollout([PROMPT, PROMPT, [{"role": "user"}], [{"role": "user"}]], trainer)
    finally:
        rollout.close()


EXIT_SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, _thread
    signal.signal(signal.SIGINT, signal.default_int_handler)  # interrupt_main raises even where SIGINT was ignored
    os.environ["LETTERS_ENV_URL"] = sys.argv[2]
    from ep_trl import create_openenv_vllm_rollout_func
    from tests.support.trainers import PROMPT, make_trainer
    options = {{"vllm_base_url": sys.argv[4]}} if sys.argv[4] != "-" else {{}}
    rollout = create_openenv_vllm_rollout_func("tests.evals.eval_letters", log_rollouts=False, **options)
    trainer = make_trainer(sys.argv[1], sys.argv[3], rollout)
    rollout([PROMPT] * 4, trainer)
    if sys.argv[5] == "interrupt":
        threading.Timer(1.0, _thread.interrupt_main).start()
        try:
            rollout([PROMPT] * 4, trainer)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
    print("exiting without close()", flush=True)
""")


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("backend", "ending"), [("trainer", "plain"), ("vllm", "plain"), ("trainer", "interrupt")])
def test_the_process_exits_cleanly_without_close(
    tiny_model_dir: Path, tmp_path: Path, backend: str, ending: str, canned_ids: tuple[int, ...]
) -> None:
    """Users never call close() (GRPOTrainer does not): before, exit printed 'Task was destroyed but it is
    pending!' (trainer backend), 'Exception ignored in ClientSession.__del__' (vLLM), and after Ctrl-C a dozen
    'Exception ignored' tracebacks."""
    from tests.support.letters import start_letters_server

    # the interrupt comes 1 s into the second call: with 3 s per environment step that call is surely still running
    # (at 0.5 s a loaded machine let the call end first and the test saw no interruption)
    latency = "3.0" if ending == "interrupt" else "0.5"
    letters = start_letters_server(tmp_path / "logs", env={"LETTERS_STEP_LATENCY_S": latency})
    try:
        with FaultyVLLMServer(ok_token_ids=canned_ids) as vllm:
            url = vllm.url if backend == "vllm" else "-"
            proc = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    EXIT_SCRIPT.format(),
                    str(tiny_model_dir),
                    letters.base_url,
                    str(tmp_path / "out"),
                    url,
                    ending,
                ],
                capture_output=True,
                text=True,
                timeout=240,
                cwd=REPO,
            )
    finally:
        letters.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "exiting without close()" in proc.stdout
    if ending == "interrupt":
        assert "interrupted" in proc.stdout
    for symptom in ("Task was destroyed but it is pending", "Exception ignored", "Traceback"):
        assert symptom not in proc.stderr, proc.stderr[-3000:]
