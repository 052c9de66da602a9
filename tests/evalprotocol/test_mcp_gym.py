"""MCP-gym sessions start on their row's seed (``ep_trl.evalprotocol.mcp_gym``), pinned against the installed
eval-protocol and its own FrozenLake MCP server (started as its processor starts it, on a free port)."""

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ep_trl.devtools.frozen_lake_rows import seeded_lake
from ep_trl.evalprotocol import mcp_gym
from ep_trl.runtime.processes import free_port

SEEDS = (339, 42, 7)  # lakes of 4x4 whose seeded map differs from most unseeded draws
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture
def frozen_lake_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """eval-protocol's FrozenLake server, started with its ``MCPServerManager`` (as ``MCPGymRolloutProcessor`` does)
    and stopped by it; its log goes to ``tmp_path``."""
    import os

    import eval_protocol
    from eval_protocol.pytest.default_mcp_gym_rollout_processor import MCPServerManager

    monkeypatch.chdir(tmp_path)
    script = os.path.join(os.path.dirname(eval_protocol.__file__), "mcp_servers", "frozen_lake", "server.py")
    server = MCPServerManager(script, port=free_port())
    server.start()
    try:
        yield f"http://localhost:{server.port}/mcp/"
    finally:
        server.stop()


def first_lakes(url: str, tag: str) -> list[list[str]]:
    """The lake each of ``SEEDS``'s rows starts on, as the processor's client reads it (a new session per row, named
    by a model name of its own, as ep_trl names every episode's)."""
    import eval_protocol as ep
    from eval_protocol.models import EvaluationRow, InputMetadata, Message

    async def main() -> list[list[str]]:
        lakes: list[list[str]] = []
        for seed in SEEDS:
            row = EvaluationRow(
                messages=[Message(role="system", content="Play.")],
                input_metadata=InputMetadata(
                    row_id=f"lake-{seed}",
                    dataset_info={
                        "environment_context": {"game": "FrozenLake", "seed": seed},
                        "user_prompt_template": "{observation}",
                    },
                ),
            )
            envs = ep.make(url, evaluation_rows=[row], model_id=f"hosted_vllm/ep-trl/{tag}-{seed}")
            session = envs.sessions[0]
            observation, _ = await envs.reset(session)
            await envs.connection_manager.close_session(session)
            lakes.append([line for line in ANSI.sub("", observation["grid"]).splitlines() if line])
        return lakes

    return asyncio.run(main())


@pytest.mark.timeout(120)
def test_a_new_session_plays_its_rows_seeded_lake_only_with_ep_trl(frozen_lake_server: str) -> None:
    """Alone, the installed eval-protocol's server ignores a new session's seed (if this half fails, eval-protocol
    has fixed it and ``mcp_gym`` can go); while ep_trl's seeding is on, every row starts on its seeded lake; after
    it, eval-protocol's own method is back."""
    expected = [seeded_lake(seed) for seed in SEEDS]
    assert not mcp_gym.seeded_sessions_on()
    alone = first_lakes(frozen_lake_server, "alone")
    assert alone != expected, (
        "eval-protocol's server now honours a new session's seed: ep_trl.evalprotocol.mcp_gym is no longer needed"
    )
    mcp_gym.start_seeded_sessions()
    mcp_gym.start_seeded_sessions()  # two users (training and a held-out evaluation, say): counted
    try:
        assert mcp_gym.seeded_sessions_on()
        assert first_lakes(frozen_lake_server, "seeded") == expected
        mcp_gym.stop_seeded_sessions()
        assert mcp_gym.seeded_sessions_on()  # the other user still has it
    finally:
        mcp_gym.stop_seeded_sessions()
    assert not mcp_gym.seeded_sessions_on()
    with pytest.raises(AssertionError, match="without start_seeded_sessions"):
        mcp_gym.stop_seeded_sessions()


def test_rows_of_seed_zero_are_named_they_play_a_random_lake() -> None:
    """eval-protocol's server builds a seeded environment only ``if seed:``: seed 0 is no seed there."""
    from eval_protocol.models import EvaluationRow, InputMetadata, Message

    def row(row_id: str, context: dict[str, Any] | None) -> EvaluationRow:
        return EvaluationRow(
            messages=[Message(role="system", content="Play.")],
            input_metadata=InputMetadata(
                row_id=row_id, dataset_info={"environment_context": context} if context is not None else None
            ),
        )

    rows = [row("lake-0", {"seed": 0}), row("lake-1", {"seed": 1}), row("plain", None), row("none", {"seed": None})]
    assert mcp_gym.seed_zero_rows(rows) == ["lake-0"]


def test_an_mcp_gym_source_warns_of_rows_of_seed_zero(caplog: pytest.LogCaptureFixture) -> None:
    """The training source of an MCP-gym eval names its rows of seed 0 and the fix, once, as it is built."""
    import copy
    import logging

    from ep_trl.evalprotocol import read_eval_spec, resolve_eval_test
    from ep_trl.sources.processor import ProcessorSource
    from tests.evals.eval_frozen_lake import ROWS

    spec = read_eval_spec(resolve_eval_test("tests.evals.eval_frozen_lake"))
    zero = copy.deepcopy(ROWS[0])
    zero.input_metadata.row_id = "lake-0"
    zero.input_metadata.dataset_info["environment_context"]["seed"] = 0
    caplog.set_level(logging.WARNING, logger="ep_trl")
    ProcessorSource(spec, ROWS)
    assert "environment seed 0" not in caplog.text
    ProcessorSource(spec, [*ROWS, zero])
    assert re.search(
        r"1 row\(s\) have environment seed 0 \(lake-0\), which eval-protocol's MCP-gym server takes for "
        r"no seed: .* Give those rows another seed\.",
        caplog.text,
    ), caplog.text


def test_setup_and_cleanup_of_an_mcp_gym_processor_turn_the_seeding_on_and_off(monkeypatch: pytest.MonkeyPatch) -> None:
    """``processors.setup`` turns it on for an MCP-gym processor once its ``setup()`` succeeded, ``cleanup`` off; a
    ``setup()`` that raised leaves it off, and the clean-up after it (as ``evaluation_test`` does one) raises
    nothing."""
    from ep_trl.evalprotocol import processors, read_eval_spec, resolve_eval_test

    spec = read_eval_spec(resolve_eval_test("tests.evals.eval_frozen_lake"))
    processors.setup(spec)
    assert mcp_gym.seeded_sessions_on()
    asyncio.run(processors.cleanup(spec))
    assert not mcp_gym.seeded_sessions_on()

    def failing_setup() -> None:
        raise RuntimeError("the processor's setup failed")

    monkeypatch.setattr(spec.processor, "setup", failing_setup)
    with pytest.raises(RuntimeError, match="setup failed"):
        processors.setup(spec)
    assert not mcp_gym.seeded_sessions_on()
    asyncio.run(processors.cleanup(spec))
    assert not mcp_gym.seeded_sessions_on()
