"""Evals with eval-protocol's own processors, trained unchanged through ``env_path`` alone: a single-turn arithmetic
eval (``SingleTurnRolloutProcessor``) and a calculator agent whose tools come from a real MCP server process
(``AgentRolloutProcessor``), with real ``GRPOTrainer`` steps; a processor that rewrites history (a fork)."""

import json
import logging
import os
import re
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from eval_protocol.models import Status

from ep_trl import (ConfigError, RolloutOptions, UnsupportedEvalError, create_openenv_vllm_rollout_func,
                    dataset_from_eval)
from ep_trl.evalprotocol import StoreLogger
from ep_trl.processes import free_port, start_server
from tests.support import tool_model
from tests.support.references import teacher_forced_logprobs
from tests.support.trainers import make_trainer

ARITHMETIC = "tests/evals/eval_arithmetic.py::test_arithmetic"
AGENT = "tests.evals.eval_calculator_agent"
REWRITING = "tests.evals.eval_rewriting_processor"
REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-3  # as the native path's tests


def segments(ids, mask, logprobs=None):
    """Runs of (mask-1 or mask-0) tokens, in order: [(sampled?, ids, logprobs)]."""
    runs = []
    for k, (token, m) in enumerate(zip(ids, mask)):
        if not runs or runs[-1][0] != bool(m):
            runs.append((bool(m), [], []))
        runs[-1][1].append(token)
        runs[-1][2].append(logprobs[k] if logprobs else None)
    return runs


def record_scored_rows(rollout):
    """The rows the eval body gets, in order (the body is wrapped, not replaced)."""
    rows, body = [], rollout.spec.body
    rollout.spec = replace(rollout.spec, body=lambda row: rows.append(row) or body(row))
    return rows


def assert_logprobs_are_the_models(trainer, out):
    model = trainer.model
    model.eval()
    for p, c, lps, mask in zip(out["prompt_ids"], out["completion_ids"], out["logprobs"], out["env_mask"]):
        reference = teacher_forced_logprobs(model, p, c, trainer.args.temperature)
        assert all(lp == 0.0 for lp, m in zip(lps, mask) if not m)
        assert max(abs(lp - ref) for lp, ref, m in zip(lps, reference, mask) if m) < TOLERANCE


@pytest.mark.timeout(300)
def test_a_single_turn_eval_trains_unchanged(tiny_model_dir, tmp_path):
    """The eval's rows (ground truth included) reach the body; the reply the processor received is exactly the
    sampled tokens; a real GRPOTrainer step trains on them."""
    rollout = create_openenv_vllm_rollout_func(ARITHMETIC, log_rollouts=False)
    dataset = dataset_from_eval(ARITHMETIC)
    prompts = [p for p in dataset["prompt"] for _ in range(2)]
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=4, max_steps=1,
                           max_completion_length=32, prompts=prompts)
    scored_rows = record_scored_rows(rollout)
    try:
        out = rollout(prompts[:4], trainer)
        assert out["episode_status"] == ["finished"] * 4 and out["num_turns"] == [1] * 4
        assert [r.ground_truth for r in scored_rows] == ["5", "5", "3", "3"]  # the eval's own rows, by row key
        tokenizer = trainer.processing_class
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
    finally:
        rollout.close()
    assert "HOSTED_VLLM_API_BASE" not in os.environ


@pytest.fixture(scope="module")
def calc_server(tmp_path_factory):
    """The calculator MCP server (tests/fixtures/calc_mcp_server.py), started and stopped by PID."""
    port = free_port()
    server = start_server("calc-mcp", ["python", str(REPO / "tests/fixtures/calc_mcp_server.py"), str(port)],
                          port=port, log_dir=tmp_path_factory.mktemp("calc_logs"), cwd=REPO)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def agent_eval(calc_server, tmp_path, monkeypatch):
    """The agent eval, its MCP config pointing at the running calculator (as CALC_MCP_CONFIG names it)."""
    import sys

    config = tmp_path / "calc_mcp.json"
    config.write_text(json.dumps({"mcpServers": {"calc": {"url": f"{calc_server.base_url}/mcp"}}}))
    monkeypatch.setenv("CALC_MCP_CONFIG", str(config))
    sys.modules.pop(AGENT, None)
    yield AGENT
    sys.modules.pop(AGENT, None)


@pytest.fixture(scope="module")
def calc_tools(calc_server):
    """The tools as AgentRolloutProcessor offers them to the model (name and parameters of each MCP tool)."""
    import asyncio

    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def listed():
        async with streamable_http_client(f"{calc_server.base_url}/mcp") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return (await session.list_tools()).tools

    return [{"type": "function", "function": {"name": t.name, "parameters": t.inputSchema}}
            for t in asyncio.run(listed())]


@pytest.fixture(scope="module")
def agent_model_dir(tiny_model_dir, calc_tools, tmp_path_factory):
    from tests.evals.eval_calculator_agent import SYSTEM

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is (1 + 2) + (3 + 4)?"}]
    return tool_model.build_tool_model(tiny_model_dir, tmp_path_factory.mktemp("tool_model"), messages, calc_tools,
                                       tool_result=lambda r: json.dumps({"result": int(r)}))


@pytest.mark.timeout(600)
def test_an_mcp_agent_eval_trains_unchanged_with_its_tool_calls_captured(agent_eval, agent_model_dir, tmp_path):
    """Two tool round trips per episode through a real MCP server: each sampled run decodes to the assistant
    message the processor received (its tool call), the tool results are masked, logprobs are the model's; the
    rollouts reach the store ``ep logs`` reads as the eval's own rows, with their token view."""
    store = tmp_path / "store"
    rollout = create_openenv_vllm_rollout_func(agent_eval, options=RolloutOptions(log_home=store))
    prompts = dataset_from_eval(agent_eval, repeat=2)["prompt"]
    trainer = make_trainer(agent_model_dir, tmp_path, rollout, num_generations=2, batch_size=2, max_steps=1,
                           max_completion_length=400, prompts=prompts, temperature=0.5)
    scored_rows = record_scored_rows(rollout)
    tokenizer = trainer.processing_class
    try:
        out = rollout(prompts[:2], trainer)
        assert out["episode_status"] == ["finished"] * 2, out["episode_error"]
        assert out["num_turns"] == [3, 3] and out["eval_score"] == [1.0, 1.0]
        for row, ids, mask in zip(scored_rows, out["completion_ids"], out["env_mask"]):
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
            assert sampled[2] == replies[2].content == tool_model.ANSWER
            assert all("<tool_response>" in text for text in inserted)  # results are context, never trained on
            assert all(result in text for result, text in zip(tool_results, inserted))
        assert_logprobs_are_the_models(trainer, out)
        assert out["template_realigned"] == [0, 0]  # the Qwen 2.5 template re-renders the calls to the same ids
        rollout.flush_logs()
        stored = {r.execution_metadata.rollout_id: r for r in StoreLogger(store / ".eval_protocol" / "logs.db").read()}
        for rollout_id, row in zip(out["rollout_id"], scored_rows):
            logged = stored[rollout_id]
            assert logged.rollout_status.code == Status.Code.FINISHED and logged.evaluation_result.score == 1.0
            assert logged.ground_truth == "10" and logged.input_metadata.row_id == row.input_metadata.row_id
            assert [m.role for m in logged.messages] == ["system", "user"] + ["assistant", "tool"] * 2 + ["assistant"]
            view = logged.execution_metadata.extra["full_episode"]
            assert view["num_turns"] == 3 and max(view["mask"]) == 3  # sampled tokens marked by turn
        trainer.train()
        assert trainer.state.global_step == 1
    finally:
        rollout.close()


@pytest.mark.timeout(300)
def test_an_agent_whose_tool_server_is_down_fails_its_episodes_as_environment(agent_eval, tiny_model_dir, tmp_path,
                                                                             monkeypatch):
    """Failure is data: a dead MCP server costs the episode (counted as environment), not the run."""
    config = tmp_path / "dead.json"
    config.write_text(json.dumps({"mcpServers": {"calc": {"url": f"http://127.0.0.1:{free_port()}/mcp"}}}))
    monkeypatch.setenv("CALC_MCP_CONFIG", str(config))
    rollout = create_openenv_vllm_rollout_func(agent_eval, log_rollouts=False)
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=2, max_steps=1,
                           max_completion_length=32, prompts=dataset_from_eval(agent_eval, repeat=2)["prompt"])
    try:
        trainer.train()
        assert trainer.state.global_step == 1 and trainer.state.log_history[0]["ep_trl/errors/environment"] == 2.0
        out = rollout(list(dataset_from_eval(agent_eval)["prompt"]) * 2, trainer)
        assert out["episode_status"] == ["error"] * 2 and out["eval_score"] == [None, None]
        assert all(error.startswith("ConnectError") for error in out["episode_error"])  # the cause, not its group
    finally:
        rollout.close()


@pytest.mark.timeout(300)
def test_a_processor_that_rewrites_history_forks_counted_and_trains_on_the_last_segment(tiny_model_dir, tmp_path,
                                                                                        caplog):
    caplog.set_level(logging.WARNING, logger="ep_trl")
    rollout = create_openenv_vllm_rollout_func(REWRITING, log_rollouts=False)
    prompts = list(dataset_from_eval(REWRITING)["prompt"]) * 2
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=2, max_steps=1,
                           max_completion_length=64, prompts=prompts)
    tokenizer = trainer.processing_class
    try:
        out = rollout(prompts[:2], trainer)
        assert out["episode_status"] == ["finished"] * 2
        assert out["num_turns"] == [1, 1]  # the first segment is discarded, not concatenated
        for prompt_ids in out["prompt_ids"]:
            assert "Summary of your first draft" in tokenizer.decode(prompt_ids)  # the rewritten conversation
        assert "does not continue the conversation" in caplog.text
        trainer.train()
        assert trainer.state.log_history[0]["ep_trl/forked_segments"] == 2.0
    finally:
        rollout.close()


def test_a_processor_that_calls_no_model_is_refused_at_construction():
    with pytest.raises(UnsupportedEvalError, match="NoOpRolloutProcessor.*calls no model"):
        create_openenv_vllm_rollout_func("tests.evals.eval_noop", log_rollouts=False)


def test_openenv_settings_are_refused_for_a_processor_eval():
    with pytest.raises(ConfigError, match=r"SingleTurnRolloutProcessor.*\['env_base_url'\].*OpenEnvRolloutProcessor"):
        create_openenv_vllm_rollout_func(ARITHMETIC, env_base_url="http://127.0.0.1:1", log_rollouts=False)


def test_a_prompt_that_is_no_row_of_the_eval_is_a_clear_error(tiny_model_dir, tmp_path):
    rollout = create_openenv_vllm_rollout_func(ARITHMETIC, log_rollouts=False)
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout, num_generations=2, batch_size=2, max_steps=1)
    try:
        with pytest.raises(ConfigError, match="matches no row.*dataset_from_eval"):
            rollout(["What is 1 + 1?"] * 2, trainer)
    finally:
        rollout.close()


def run_eval_under_pytest(eval_file, served_url, tmp_path, **env):
    """``pytest EVAL`` as a user runs it, its model calls pointed at ``python -m ep_trl.serve``."""
    import subprocess
    import sys

    environment = {**os.environ, "HOSTED_VLLM_API_BASE": served_url, "DISABLE_EP_SQLITE_LOG": "1",
                   "LITELLM_LOCAL_MODEL_COST_MAP": "True", **env}
    # -o addopts=: this project's pytest settings turn eval-protocol's plugin off for its own suite; a user's run has it
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-o", "addopts=", "-p", "no:cacheprovider", eval_file,
                           "--ep-input-param", "model=hosted_vllm/local", "--ep-summary-json",
                           str(tmp_path / "summary.json")],
                          cwd=REPO, env=environment, capture_output=True, text=True, timeout=300)


@pytest.mark.timeout(300)
def test_the_same_agent_file_is_still_an_eval_against_the_served_model(agent_model_dir, calc_server, tmp_path):
    """``python -m ep_trl.serve`` serves the trained-on model; ``pytest`` runs the eval file unchanged against it."""
    port = free_port()
    served = start_server("ep-trl-serve", [sys.executable, "-m", "ep_trl.serve", str(agent_model_dir), "--port",
                                           str(port), "--temperature", "0.5"],
                          port=port, log_dir=tmp_path / "serve_logs", health_path="/v1/models", cwd=REPO)
    config = tmp_path / "calc_mcp.json"
    config.write_text(json.dumps({"mcpServers": {"calc": {"url": f"{calc_server.base_url}/mcp"}}}))
    try:
        result = run_eval_under_pytest("tests/evals/eval_calculator_agent.py", f"http://127.0.0.1:{port}/v1",
                                       tmp_path, CALC_MCP_CONFIG=str(config))
        served_output = served.output()
    finally:
        served.stop()
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # two tool calls and the answer, all answered by the served model
    assert len(re.findall(r"call \d+ \(model 'local'\)", served_output)) == 3, served_output[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["agg_score"] == 1.0, summary
