"""Evals with eval-protocol's own processors, trained unchanged through ``env_path`` alone: a single-turn arithmetic
eval (``SingleTurnRolloutProcessor``) and a calculator agent whose tools come from a real MCP server process
(``AgentRolloutProcessor``), with real ``GRPOTrainer`` steps; a processor that rewrites history (a fork)."""

import json
import logging
import os
import re
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest
from eval_protocol.models import Status

from ep_trl import (
    ConfigError,
    RolloutOptions,
    UnsupportedEvalError,
    create_openenv_vllm_rollout_func,
    dataset_from_eval,
)
from ep_trl.evalprotocol import StoreLogger
from ep_trl.runtime.processes import free_port, start_server
from tests.support import tool_model
from tests.support.references import teacher_forced_logprobs
from tests.support.trainers import assert_trained, make_trainer

if TYPE_CHECKING:
    import subprocess
    from collections.abc import Iterator, Sequence

    from transformers import PreTrainedTokenizerBase
    from trl import GRPOConfig, GRPOTrainer

    from ep_trl.adapters.rollout_func import RolloutFunction
    from ep_trl.adapters.sharded import ShardedRolloutFunction
    from ep_trl.runtime.processes import ServerProcess


ARITHMETIC = "tests/evals/eval_arithmetic.py::test_arithmetic"
AGENT = "tests.evals.eval_calculator_agent"
REWRITING = "tests.evals.eval_rewriting_processor"
REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-3  # as the native path's tests


def segments(
    ids: "Sequence[int]", mask: "Sequence[int]", logprobs: "Sequence[float] | None" = None
) -> list[tuple[bool, list[int], list[float | None]]]:
    """Runs of (mask-1 or mask-0) tokens, in order: [(sampled?, ids, logprobs)]."""
    runs: list[tuple[bool, list[int], list[float | None]]] = []
    for k, (token, m) in enumerate(zip(ids, mask)):
        if not runs or runs[-1][0] != bool(m):
            runs.append((bool(m), [], []))
        runs[-1][1].append(token)
        runs[-1][2].append(logprobs[k] if logprobs else None)
    return runs


def record_scored_rows(rollout: "RolloutFunction | ShardedRolloutFunction") -> list[Any]:
    """The rows the eval body gets, in the order it gets them (the body is wrapped, not replaced); a pointwise body
    gets each row as its episode ends (``in_prompt_order`` puts them back in the call's order)."""
    function = cast("RolloutFunction", rollout)  # unsharded
    rows: list[Any] = []
    body = function.spec.body

    def recording(row: Any) -> object:
        rows.append(row)
        return body(row)

    function.spec = replace(function.spec, body=recording)
    return rows


def in_prompt_order(rows: list[Any], out: dict[str, list[Any]]) -> list[Any]:
    """Rows recorded by ``record_scored_rows``, in the order of the rollout output (by rollout id)."""
    return sorted(rows, key=lambda row: out["rollout_id"].index(row.execution_metadata.rollout_id))


def assert_logprobs_are_the_models(trainer: "GRPOTrainer", out: dict[str, list[Any]]) -> None:
    model = trainer.model
    assert model is not None
    model.eval()
    for p, c, lps, mask in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"]):
        reference = teacher_forced_logprobs(model, p, c, cast("GRPOConfig", trainer.args).temperature)
        assert all(lp == 0.0 for lp, m in zip(lps, mask) if not m)
        assert max(abs(lp - ref) for lp, ref, m in zip(lps, reference, mask) if m) < TOLERANCE


@pytest.mark.timeout(300)
def test_a_single_turn_eval_trains_unchanged(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The eval's rows (ground truth included) reach the body; the reply the processor received is exactly the
    sampled tokens; a real GRPOTrainer step trains on them."""
    rollout = create_openenv_vllm_rollout_func(ARITHMETIC, log_rollouts=False)
    dataset = dataset_from_eval(ARITHMETIC)
    prompts = [p for p in dataset["prompt"] for _ in range(2)]
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        rollout,
        num_generations=2,
        batch_size=4,
        max_steps=1,
        max_completion_length=32,
        prompts=prompts,
    )
    scored_rows = record_scored_rows(rollout)
    try:
        out = rollout(prompts[:4], trainer)
        assert out["episode_status"] == ["finished"] * 4 and out["num_turns"] == [1] * 4
        scored_rows = in_prompt_order(scored_rows, out)
        assert [r.ground_truth for r in scored_rows] == ["5", "5", "3", "3"]  # the eval's own rows, by row key
        tokenizer = cast("PreTrainedTokenizerBase", trainer.processing_class)
        for row, ids, mask in zip(scored_rows, out["completion_ids"], out["env_mask"]):
            assert all(mask) and len(ids) <= 8  # the eval's max_tokens per call
            assert row.messages[-1].role == "assistant"
            assert row.messages[-1].content == tokenizer.decode(ids, skip_special_tokens=True)
            assert row.input_metadata.completion_params["model"] != "hosted_vllm"  # routing undone for the body
            assert not row.input_metadata.completion_params["model"].startswith("hosted_vllm/ep-trl/")
        assert_logprobs_are_the_models(trainer, out)
        assert out["eval_score"] == [float(r.evaluation_result.score) for r in scored_rows]
        trainer.train()
        assert trainer.state.global_step == 1
        assert_trained(trainer)
    finally:
        rollout.close()
    assert "HOSTED_VLLM_API_BASE" not in os.environ


@pytest.fixture(scope="module")
def calc_server(tmp_path_factory: pytest.TempPathFactory) -> "Iterator[ServerProcess]":
    """The calculator MCP server (tests/fixtures/calc_mcp_server.py), started and stopped by PID."""
    port = free_port()
    server = start_server(
        "calc-mcp",
        ["python", str(REPO / "tests/fixtures/calc_mcp_server.py"), str(port)],
        port=port,
        log_dir=tmp_path_factory.mktemp("calc_logs"),
        cwd=REPO,
    )
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def agent_eval(calc_server: "ServerProcess", tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> "Iterator[str]":
    """The agent eval, its MCP config pointing at the running calculator (as CALC_MCP_CONFIG names it)."""
    import sys

    config = tmp_path / "calc_mcp.json"
    config.write_text(json.dumps({"mcpServers": {"calc": {"url": f"{calc_server.base_url}/mcp"}}}))
    monkeypatch.setenv("CALC_MCP_CONFIG", str(config))
    sys.modules.pop(AGENT, None)
    yield AGENT
    sys.modules.pop(AGENT, None)


def calculator_tool_model(
    tiny_model_dir: Path,
    calc_server: "ServerProcess",
    out_dir: Path,
    answers: "Sequence[str]" = (tool_model.ANSWER,),
) -> Path:
    from tests.evals.eval_calculator_agent import SYSTEM

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is (1 + 2) + (3 + 4)?"}]
    return tool_model.build_tool_model(
        tiny_model_dir,
        out_dir,
        messages,
        tool_model.mcp_tools(calc_server.base_url),
        tool_result=lambda r: json.dumps({"result": int(r)}),
        answers=answers,
    )


@pytest.fixture(scope="module")
def agent_model_dir(
    tiny_model_dir: Path, calc_server: "ServerProcess", tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tool model that plays the calculator script and answers "10"."""
    return calculator_tool_model(tiny_model_dir, calc_server, tmp_path_factory.mktemp("tool_model"))


@pytest.fixture(scope="module")
def varied_agent_model_dir(
    tiny_model_dir: Path, calc_server: "ServerProcess", tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The tool model that plays the calculator script and ends with one of ``VARIED_ANSWERS``, evenly: the episodes
    of a group score differently, so a training step has a gradient (with one answer every reward is 1.0)."""
    return calculator_tool_model(
        tiny_model_dir, calc_server, tmp_path_factory.mktemp("varied_tool_model"), answers=tool_model.VARIED_ANSWERS
    )


#: What the calculator eval scores each of the varied tool model's answers.
ANSWER_SCORES = dict(zip(tool_model.VARIED_ANSWERS, (1.0, 0.5, 0.0)))
#: Episodes per group when the agent trains: all eight end with the same answer with probability 3 ** -7.
AGENT_GROUP = 8


@pytest.mark.timeout(600)
def test_an_mcp_agent_eval_trains_unchanged_with_its_tool_calls_captured(
    agent_eval: str, varied_agent_model_dir: Path, tmp_path: Path
) -> None:
    """Two tool round trips per episode through a real MCP server: each sampled run decodes to the assistant
    message the processor received (its tool call), the tool results are masked, logprobs are the model's; the
    rollouts reach the store ``ep logs`` reads as the eval's own rows, with their token view; the eval's scores of
    the answers differ within a group, so the training step has a gradient."""
    store = tmp_path / "store"
    rollout = create_openenv_vllm_rollout_func(agent_eval, options=RolloutOptions(log_home=store))
    prompts = dataset_from_eval(agent_eval, repeat=AGENT_GROUP)["prompt"]
    trainer = make_trainer(
        varied_agent_model_dir,
        tmp_path,
        rollout,
        num_generations=AGENT_GROUP,
        batch_size=AGENT_GROUP,
        max_steps=1,
        max_completion_length=400,
        prompts=prompts,
        temperature=0.5,
    )
    scored_rows = record_scored_rows(rollout)
    tokenizer = cast("PreTrainedTokenizerBase", trainer.processing_class)
    try:
        out = rollout(prompts[:2], trainer)
        assert out["episode_status"] == ["finished"] * 2, out["episode_error"]
        assert out["num_turns"] == [3, 3]
        scored_rows = in_prompt_order(scored_rows, out)
        answers = [row.messages[-1].content for row in scored_rows]
        assert out["eval_score"] == [ANSWER_SCORES[answer] for answer in answers]
        for row, ids, mask in zip(in_prompt_order(scored_rows, out), out["completion_ids"], out["env_mask"]):
            tool_results = [m.content for m in row.messages if m.role == "tool"]
            assert tool_results == ['{"result": 3}', '{"result": 7}']  # computed by the MCP server
            replies = [m for m in row.messages if m.role == "assistant"]
            runs = segments(ids, mask)
            sampled = [tokenizer.decode(r[1], skip_special_tokens=True) for r in runs if r[0]]
            inserted = [tokenizer.decode(r[1]) for r in runs if not r[0]]
            assert len(sampled) == len(replies) == 3
            for text, reply in zip(sampled[:2], replies[:2]):  # the processor got the call the model sampled
                [call] = reply.tool_calls
                assert text == tool_model.tool_call_text(json.loads(call.function.arguments))
                assert call.function.name == "add"
            assert sampled[2] == replies[2].content and sampled[2] in tool_model.VARIED_ANSWERS
            assert all("<tool_response>" in text for text in inserted)  # results are context, never trained on
            assert all(result in text for result, text in zip(tool_results, inserted))
        assert_logprobs_are_the_models(trainer, out)
        assert out["template_realigned"] == [0, 0]  # the Qwen 2.5 template re-renders the calls to the same ids
        rollout.flush_logs()
        stored = {r.execution_metadata.rollout_id: r for r in StoreLogger(store / ".eval_protocol" / "logs.db").read()}
        for rollout_id, row, score in zip(out["rollout_id"], scored_rows, out["eval_score"]):
            logged = stored[rollout_id]
            assert logged.rollout_status.code == Status.Code.FINISHED and logged.evaluation_result.score == score
            assert logged.ground_truth == "10" and logged.input_metadata.row_id == row.input_metadata.row_id
            assert [m.role for m in logged.messages] == ["system", "user"] + ["assistant", "tool"] * 2 + ["assistant"]
            view = logged.execution_metadata.extra["full_episode"]
            assert view["num_turns"] == 3 and max(view["mask"]) == 3  # sampled tokens marked by turn
        trainer.train()
        assert trainer.state.global_step == 1
        assert_trained(trainer)
    finally:
        rollout.close()


@pytest.mark.timeout(300)
def test_an_agent_whose_tool_server_is_down_fails_its_episodes_as_environment(
    agent_eval: str, tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Failure is data: a dead MCP server costs the episode (counted as environment), not the run."""
    config = tmp_path / "dead.json"
    config.write_text(json.dumps({"mcpServers": {"calc": {"url": f"http://127.0.0.1:{free_port()}/mcp"}}}))
    monkeypatch.setenv("CALC_MCP_CONFIG", str(config))
    rollout = create_openenv_vllm_rollout_func(agent_eval, log_rollouts=False)
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        rollout,
        num_generations=2,
        batch_size=2,
        max_steps=1,
        max_completion_length=32,
        prompts=dataset_from_eval(agent_eval, repeat=2)["prompt"],
    )
    try:
        trainer.train()
        assert trainer.state.global_step == 1 and trainer.state.log_history[0]["ep_trl/errors/environment"] == 2.0
        out = rollout(list(dataset_from_eval(agent_eval)["prompt"]) * 2, trainer)
        assert out["episode_status"] == ["error"] * 2 and out["eval_score"] == [None, None]
        assert all(error.startswith("ConnectError") for error in out["episode_error"])  # the cause, not its group
    finally:
        rollout.close()


def stdio_config(path: Path, *args: object) -> Path:
    """An MCP config whose calculator server is started by the processor over stdio."""
    path.write_text(json.dumps({"mcpServers": {"calc": {"command": sys.executable, "args": [str(a) for a in args]}}}))
    return path


@pytest.mark.timeout(300)
def test_a_stdio_mcp_agent_eval_trains_with_its_servers_under_the_watchdog(
    varied_agent_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The processor starts the calculator over stdio from the eval's MCP config, once per row; ep_trl hands each row
    a copy in which the command runs under its watchdog (tool calls still work, the servers are gone afterwards).
    Each calculator records, as it starts, its pid and the command line of the process that started it."""
    import psutil

    calc = REPO / "tests/fixtures/calc_mcp_server.py"
    started = tmp_path / "started"
    started.mkdir()
    config = stdio_config(tmp_path / "calc_stdio.json", calc, "stdio", started)
    monkeypatch.setenv("CALC_MCP_CONFIG", str(config))
    sys.modules.pop(AGENT, None)
    rollout = create_openenv_vllm_rollout_func(AGENT, log_rollouts=False)
    prompts = dataset_from_eval(AGENT, repeat=AGENT_GROUP)["prompt"]
    trainer = make_trainer(
        varied_agent_model_dir,
        tmp_path,
        rollout,
        num_generations=AGENT_GROUP,
        batch_size=AGENT_GROUP,
        max_steps=1,
        max_completion_length=400,
        prompts=prompts,
        temperature=0.5,
    )
    scored_rows = record_scored_rows(rollout)
    try:
        out = rollout(prompts[:2], trainer)
        assert out["episode_status"] == ["finished"] * 2, out["episode_error"]
        answers = [row.messages[-1].content for row in in_prompt_order(scored_rows, out)]
        assert out["eval_score"] == [ANSWER_SCORES[answer] for answer in answers]
        assert [[m.content for m in r.messages if m.role == "tool"] for r in scored_rows] == [
            ['{"result": 3}', '{"result": 7}']
        ] * 2
        records = [json.loads(path.read_text()) for path in sorted(started.glob("*.json"))]
        assert len(records) == 2  # one server per row
        for record in records:  # started by ep_trl's watchdog, which runs the eval's own command
            parent = record["parent_cmdline"]
            assert parent[1].endswith("ep_trl/runtime/guard.py") and parent[parent.index("--parent") + 1] == str(
                os.getpid()
            )
            assert parent[parent.index("--") + 1 :][1:] == [str(calc), "stdio", str(started)], parent
        servers = []
        for record in records:
            try:
                servers.append(psutil.Process(record["pid"]))
            except psutil.NoSuchProcess:
                continue
        assert not psutil.wait_procs(servers, timeout=5)[1]  # ended with their rows
        trainer.train()
        assert trainer.state.global_step == 1
        assert_trained(trainer)
    finally:
        rollout.close()
        sys.modules.pop(AGENT, None)


@pytest.mark.timeout(300)
def test_a_broken_stdio_mcp_server_is_named_with_its_own_stderr(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Before, every episode failed with MCP's bare "Connection closed"; the cause was on the console only. Now the
    episode error and the grouped warning quote the server's last stderr lines and its exit status."""
    caplog.set_level(logging.WARNING, logger="ep_trl")
    missing = tmp_path / "missing_server.py"
    monkeypatch.setenv("CALC_MCP_CONFIG", str(stdio_config(tmp_path / "broken.json", missing)))
    sys.modules.pop(AGENT, None)
    rollout = create_openenv_vllm_rollout_func(AGENT, log_rollouts=False)
    prompts = dataset_from_eval(AGENT, repeat=2)["prompt"]
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        rollout,
        num_generations=2,
        batch_size=2,
        max_steps=1,
        max_completion_length=32,
        prompts=prompts,
    )
    try:
        trainer.train()
        assert trainer.state.log_history[0]["ep_trl/errors/environment"] == 2.0
        out = rollout(list(prompts[:2]), trainer)
        assert out["episode_status"] == ["error"] * 2
        for error in out["episode_error"]:
            assert error.startswith("McpError: Connection closed"), error
            assert "stdio MCP server 'calc'" in error and "exited with status 2" in error
            assert "can't open file" in error and str(missing) in error
        assert "can't open file" in caplog.text and "exited with status 2" in caplog.text
    finally:
        rollout.close()
        sys.modules.pop(AGENT, None)


@pytest.mark.timeout(300)
def test_a_processor_that_rewrites_history_forks_counted_and_trains_on_the_last_segment(
    tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="ep_trl")
    rollout = create_openenv_vllm_rollout_func(REWRITING, log_rollouts=False)
    prompts = list(dataset_from_eval(REWRITING)["prompt"]) * 2
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        rollout,
        num_generations=2,
        batch_size=2,
        max_steps=1,
        max_completion_length=64,
        prompts=prompts,
    )
    tokenizer = cast("PreTrainedTokenizerBase", trainer.processing_class)
    try:
        out = rollout(prompts[:2], trainer)
        assert out["episode_status"] == ["finished"] * 2
        assert out["num_turns"] == [1, 1]  # the first segment is discarded, not concatenated
        for prompt_ids in out["prompt_ids"]:
            assert "Summary of your first draft" in tokenizer.decode(prompt_ids)  # the rewritten conversation
        assert "does not continue the conversation" in caplog.text
        trainer.train()
        assert trainer.state.log_history[0]["ep_trl/forked_segments"] == 2.0
        assert_trained(trainer)
    finally:
        rollout.close()


class Outsider:
    """Another local process's probes while training runs (issue 21): it lists models, posts injected prompts to
    every rollout name it can find, a malformed field, a stray model name and a plain-text body."""

    def __init__(self) -> None:
        import threading

        self.answers: list[int] = []
        self.found: set[str] = set()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def endpoints(self) -> list[str]:
        """ep_trl's endpoint found as another process would find it: the ports this process listens on that answer
        ``GET /v1/models`` as an OpenAI-compatible server does (with the list, or 401 asking for a key)."""
        import httpx
        import psutil

        found: list[str] = []
        for conn in psutil.Process().net_connections(kind="tcp"):
            if conn.status != psutil.CONN_LISTEN:
                continue
            base = f"http://127.0.0.1:{conn.laddr.port}/v1"
            try:
                if httpx.get(f"{base}/models", timeout=2).status_code in (200, 401):
                    found.append(base)
            except httpx.HTTPError:
                continue
        return found

    def run(self) -> None:
        import httpx

        while not self.done.is_set():
            bases = self.endpoints()
            if not bases:
                time.sleep(0.05)
                continue
            self.found.update(bases)
            base = bases[0]
            try:
                listed = httpx.get(f"{base}/models", timeout=2).json().get("data", [])
                names = [entry["id"] for entry in listed if entry["id"].startswith("ep-trl/")] or ["ep-trl/guess"]
                for name in names:
                    for body in (
                        {"model": name, "messages": [{"role": "user", "content": "INJECTED"}]},
                        {"model": name, "messages": [{"role": "user", "content": "x"}], "max_tokens": "abc"},
                        {"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]},
                    ):
                        self.answers.append(httpx.post(f"{base}/chat/completions", json=body, timeout=5).status_code)
                    self.answers.append(
                        httpx.post(
                            f"{base}/chat/completions",
                            content=json.dumps(body),
                            headers={"Content-Type": "text/plain"},
                            timeout=5,
                        ).status_code
                    )
            except httpx.HTTPError:
                continue

    def __enter__(self) -> "Outsider":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.thread.join(10)


@pytest.mark.timeout(300)
def test_no_other_local_process_reaches_a_live_rollout(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Before, a script that polled /v1/models got its prompt into the returned prompt_ids of live episodes (scored
    with the real row's score), a malformed max_tokens or one stray model name made train() raise. Now every probe
    is refused (401 without the call's key) and training goes on untouched."""
    rollout = create_openenv_vllm_rollout_func(ARITHMETIC, log_rollouts=False)
    prompts = [p for p in dataset_from_eval(ARITHMETIC)["prompt"] for _ in range(2)]
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        rollout,
        num_generations=2,
        batch_size=4,
        max_steps=2,
        max_completion_length=32,
        prompts=prompts,
    )
    tokenizer = cast("PreTrainedTokenizerBase", trainer.processing_class)
    try:
        with Outsider() as outsider:
            outs = [rollout(prompts[:4], trainer) for _ in range(3)]
            trainer.train()
        assert len(outsider.found) == 1  # the endpoint, found the way another local process would
        assert outsider.answers and set(outsider.answers) == {401, 415}  # no key; a text/plain body
        for out in outs:
            assert out["episode_status"] == ["finished"] * 4
            assert not any("INJECTED" in tokenizer.decode(ids) for ids in out["prompt_ids"])
        steps = [log for log in trainer.state.log_history if "ep_trl/failed_fraction" in log]
        assert trainer.state.global_step == 2 and [log["ep_trl/failed_fraction"] for log in steps] == [0.0, 0.0]
    finally:
        rollout.close()


def test_a_processor_that_calls_no_model_is_refused_at_construction() -> None:
    with pytest.raises(UnsupportedEvalError, match="NoOpRolloutProcessor.*calls no model"):
        create_openenv_vllm_rollout_func("tests.evals.eval_noop", log_rollouts=False)


def test_processors_that_call_the_model_on_another_machine_are_refused_at_construction() -> None:
    """RemoteRolloutProcessor's rows come back from Fireworks tracing, not from the calls made here: before, such
    an eval trained on captured tokens while the body scored its unchanged input row."""
    with pytest.raises(UnsupportedEvalError, match="RemoteRolloutProcessor: the model is called on another machine"):
        create_openenv_vllm_rollout_func("tests.evals.eval_remote", log_rollouts=False)


@pytest.mark.timeout(120)
def test_an_openai_client_built_from_the_completion_params_is_routed(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A processor that uses the OpenAI client (as LangGraph and PydanticAI factories do) sends the row's model name
    as it is, provider prefix included; the endpoint answers it."""
    env_path = "tests.evals.eval_openai_client::test_routed_client"
    rollout = create_openenv_vllm_rollout_func(env_path, log_rollouts=False)
    prompts = list(dataset_from_eval(env_path)["prompt"]) * 2
    trainer = make_trainer(
        tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=2, max_steps=1, prompts=prompts
    )
    try:
        out = rollout(prompts, trainer)
        assert out["episode_status"] == ["finished"] * 2 and out["num_turns"] == [1, 1]
    finally:
        rollout.close()


@pytest.mark.timeout(120)
def test_a_processor_that_calls_another_model_is_an_error_naming_it(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Before, every episode failed as eval_code until training stopped with no signal three calls later."""
    env_path = "tests.evals.eval_openai_client::test_fixed_model"
    rollout = create_openenv_vllm_rollout_func(env_path, log_rollouts=False)
    prompts = list(dataset_from_eval(env_path)["prompt"]) * 2
    trainer = make_trainer(
        tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=2, max_steps=1, prompts=prompts
    )
    try:
        with pytest.raises(UnsupportedEvalError, match=r"with the model \['gpt-4o-mini'\] instead of the one"):
            rollout(prompts, trainer)
    finally:
        rollout.close()


def test_several_models_per_row_are_refused_at_construction() -> None:
    with pytest.raises(
        UnsupportedEvalError, match=r"completion_params\['model'\] is a mapping \['planner', 'writer'\]"
    ):
        create_openenv_vllm_rollout_func("tests.evals.eval_openai_client::test_two_models", log_rollouts=False)


def test_openenv_settings_are_refused_for_a_processor_eval() -> None:
    with pytest.raises(ConfigError, match=r"SingleTurnRolloutProcessor.*\['env_base_url'\].*OpenEnvRolloutProcessor"):
        create_openenv_vllm_rollout_func(ARITHMETIC, env_base_url="http://127.0.0.1:1", log_rollouts=False)


def test_a_prompt_that_is_no_row_of_the_eval_is_a_clear_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    rollout = create_openenv_vllm_rollout_func(ARITHMETIC, log_rollouts=False)
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=2, max_steps=1)
    try:
        with pytest.raises(ConfigError, match="matches no row.*dataset_from_eval"):
            rollout(["What is 1 + 1?"] * 2, trainer)
    finally:
        rollout.close()


def run_eval_under_pytest(
    eval_file: str, served_url: str, tmp_path: Path, **env: str
) -> "subprocess.CompletedProcess[str]":
    """``pytest EVAL`` as a user runs it, its model calls pointed at ``ep-trl serve``."""
    import subprocess
    import sys

    environment = {
        **os.environ,
        "HOSTED_VLLM_API_BASE": served_url,
        "DISABLE_EP_SQLITE_LOG": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        **env,
    }
    # -o addopts=: this project's pytest settings turn eval-protocol's plugin off for its own suite; a user's run has it
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-o",
            "addopts=",
            "-p",
            "no:cacheprovider",
            eval_file,
            "--ep-input-param",
            "model=hosted_vllm/local",
            "--ep-summary-json",
            str(tmp_path / "summary.json"),
        ],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.timeout(300)
def test_the_same_agent_file_is_still_an_eval_against_the_served_model(
    agent_model_dir: Path, calc_server: "ServerProcess", tmp_path: Path
) -> None:
    """``ep-trl serve`` serves the trained-on model; ``pytest`` runs the eval file unchanged against it."""
    port = free_port()
    served = start_server(
        "ep-trl-serve",
        [
            sys.executable,
            "-m",
            "ep_trl.cli",
            "serve",
            str(agent_model_dir),
            "--port",
            str(port),
            "--temperature",
            "0.5",
        ],
        port=port,
        log_dir=tmp_path / "serve_logs",
        health_path="/v1/models",
        cwd=REPO,
    )
    config = tmp_path / "calc_mcp.json"
    config.write_text(json.dumps({"mcpServers": {"calc": {"url": f"{calc_server.base_url}/mcp"}}}))
    try:
        result = run_eval_under_pytest(
            "tests/evals/eval_calculator_agent.py", f"http://127.0.0.1:{port}/v1", tmp_path, CALC_MCP_CONFIG=str(config)
        )
        served_output = served.output()
    finally:
        served.stop()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # two tool calls and the answer, all answered by the served model
    assert len(re.findall(r"call \d+ \(model 'local'\)", served_output)) == 3, served_output[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["agg_score"] == 1.0, summary


@pytest.mark.timeout(300)
def test_a_raising_processor_costs_its_episodes_as_eval_code_inside_train(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Failure is data at train() level: rows whose processor raised or marked the rollout failed are failed
    episodes, counted as eval_code and unscored; the others train."""
    env_path = "tests.evals.eval_faulty_processor"
    rollout = create_openenv_vllm_rollout_func(env_path, log_rollouts=False)
    dataset = list(dataset_from_eval(env_path)["prompt"])  # three rows: all of them are in each step's batch
    trainer = make_trainer(
        tiny_model_dir,
        tmp_path,
        rollout,
        num_generations=2,
        batch_size=6,
        max_steps=1,
        max_completion_length=32,
        prompts=dataset,
    )
    prompts = [p for p in dataset for _ in range(2)]
    try:
        trainer.train()
        logged = trainer.state.log_history[0]
        assert logged["ep_trl/errors/eval_code"] == 4.0 and logged["ep_trl/unscored_fraction"] == 4 / 6
        out = rollout(prompts, trainer)
        assert out["episode_status"] == ["finished"] * 2 + ["error"] * 4
        assert out["eval_score"] == [1.0, 1.0, None, None, None, None]
        errors = out["episode_error"]
        assert all(e.startswith("ValueError: the processor's own parsing failed") for e in errors[2:4])
        assert all("marked the rollout NOT_FOUND: no remote data" in e for e in errors[4:])
        assert all(len(ids) > 1 for ids in out["completion_ids"][2:])  # the model's reply is kept, with no reward
    finally:
        rollout.close()


@pytest.mark.timeout(180)
def test_a_vllm_server_gone_for_good_ends_train_with_the_request_named(tiny_model_dir: Path, tmp_path: Path) -> None:
    """A processor's calls whose backend fails for good: train() raises GenerationError in bounded time, and the
    processor was answered (no processor task is left waiting)."""
    from ep_trl import GenerationError, VLLMOptions
    from tests.support.faulty_vllm import FaultyVLLMServer

    with FaultyVLLMServer(default=("status", 500)) as server:
        rollout = create_openenv_vllm_rollout_func(
            ARITHMETIC,
            vllm_base_url=server.url,
            log_rollouts=False,
            vllm=VLLMOptions(max_retries=0, request_timeout_s=10),
        )
        prompts = [p for p in dataset_from_eval(ARITHMETIC)["prompt"] for _ in range(2)]
        trainer = make_trainer(
            tiny_model_dir,
            tmp_path,
            rollout,
            num_generations=2,
            batch_size=4,
            max_steps=1,
            max_completion_length=32,
            prompts=prompts,
        )
        try:
            with pytest.raises(GenerationError, match=f"{server.url}/v1/completions"):
                trainer.train()
        finally:
            rollout.close()


@pytest.mark.timeout(300)
def test_an_mcp_gym_eval_plays_across_calls_with_its_own_server(
    qwen_template_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """eval-protocol's FrozenLake MCP-gym server, started by its processor: in the eval's default per_run mode the
    processor starts a server per processor call on one port, and ep_trl calls it once per row, so every row after
    the first failed ("Port 9700 is already in use"); training runs it in shared mode and says so.

    It plays rollout calls and claims no training: the eval scores 1.0 for reaching the goal, six moves from the
    start on a 4x4 lake, in the eval's four steps, so every reward is 0 and a GRPO step would have no gradient.
    (Training through processor evals is asserted by the single-turn, agent and rewriting tests above.)

    Every episode starts on its row's lake (the one eval-protocol's adapter builds from the row's seed): before
    ``ep_trl.evalprotocol.mcp_gym``, every episode's new server session played an unseeded, random lake."""
    from ep_trl.devtools.frozen_lake_rows import lake_in, seeded_lake

    caplog.set_level(logging.INFO, logger="ep_trl")
    monkeypatch.chdir(tmp_path)  # the processor writes its server's log to the working directory
    env_path = "tests.evals.eval_frozen_lake"
    rollout = create_openenv_vllm_rollout_func(env_path, log_rollouts=False)
    assert "server_mode='shared'" in caplog.text
    scored = record_scored_rows(rollout)
    prompts = [p for p in dataset_from_eval(env_path)["prompt"] for _ in range(2)]
    trainer = make_trainer(
        qwen_template_model_dir,
        tmp_path,
        rollout,
        num_generations=2,
        batch_size=4,
        max_steps=1,
        max_completion_length=48,
        prompts=prompts,
    )
    try:
        for _ in range(2):  # a second call reuses the server
            out = rollout(prompts, trainer)
            assert out["episode_status"] == ["finished"] * 4, out["episode_error"]
            assert all(n >= 1 for n in out["num_turns"])
            assert all(score is not None for score in out["eval_score"])
        assert len(scored) == 8
        for row in scored:
            seed = row.input_metadata.dataset_info["environment_context"]["seed"]
            first = [m.model_dump() for m in row.messages if m.role == "user"][:1]
            assert lake_in(first) == (seeded_lake(seed), 0), (row.input_metadata.row_id, first)
    finally:
        rollout.close()
        stop_mcp_gym_shared_server()


@pytest.mark.timeout(300)
def test_a_port_left_taken_fails_mcp_gym_episodes_as_environment_naming_its_holder(
    qwen_template_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a killed run, eval-protocol's FrozenLake server can stay on its fixed port 9700: before, the next run's
    episodes failed as eval_code ("Port 9700 is already in use") and training stopped with no signal."""
    import subprocess

    monkeypatch.chdir(tmp_path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import socket, time; s = socket.socket(); "
            "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(('0.0.0.0', 9700)); "
            "s.listen(); print('ready', flush=True); time.sleep(300)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    env_path = "tests.evals.eval_frozen_lake"
    rollout = create_openenv_vllm_rollout_func(env_path, log_rollouts=False)
    prompts = [p for p in dataset_from_eval(env_path)["prompt"] for _ in range(2)]
    trainer = make_trainer(
        qwen_template_model_dir,
        tmp_path,
        rollout,
        num_generations=2,
        batch_size=4,
        max_steps=1,
        max_completion_length=48,
        prompts=prompts,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        trainer.train()
        assert trainer.state.log_history[0]["ep_trl/errors/environment"] == 4.0
        out = rollout(prompts, trainer)
        assert out["episode_status"] == ["error"] * 4
        for error in out["episode_error"]:
            assert "Port 9700 is already in use" in error and f"port 9700 is held by pid {holder.pid}" in error
    finally:
        rollout.close()
        holder.kill()
        holder.wait()
        stop_mcp_gym_shared_server()


def stop_mcp_gym_shared_server() -> None:
    """eval-protocol stops its shared MCP-gym server only at interpreter exit; the test stops it now."""
    from eval_protocol.pytest.default_mcp_gym_rollout_processor import MCPGymRolloutProcessor, MCPServerManager

    MCPServerManager._cleanup_all_servers()
    MCPGymRolloutProcessor._shared_server, MCPGymRolloutProcessor._shared_server_started = None, False
