"""``python -m ep_trl.devtools.record_demonstrations``: an eval's own processor (MCP-gym FrozenLake, eval-protocol's
own server) played by the scripted player; every assistant turn is a call of the offered tool with one of the
choices, the lines are warm-start demonstrations, and what the player cannot play is refused naming the fix."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ep_trl.cli.demonstrations import read_demonstrations
from ep_trl.devtools.record_demonstrations import ScriptedPlayer

ROOT = Path(__file__).resolve().parents[2]
LAKE = f"{ROOT / 'tests' / 'evals' / 'eval_frozen_lake.py'}::test_frozen_lake"
CHOICES = ("LEFT", "DOWN", "RIGHT", "UP")


@pytest.mark.timeout(240)
def test_the_recorder_writes_episodes_whose_turns_are_tool_calls_with_the_choices(tmp_path: Path) -> None:
    out = tmp_path / "demos.jsonl"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ep_trl.devtools.record_demonstrations",
            LAKE,
            "--out",
            str(out),
            "--choices",
            "LEFT,DOWN,RIGHT,UP",
            "--argument",
            "action",
            "--repeat",
            "2",
            "--seed",
            "3",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "wrote 4 demonstrations to" in proc.stdout, proc.stdout
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(line["row_id"] for line in lines) == ["lake-42", "lake-42", "lake-7", "lake-7"]
    seen = set()
    for line in lines:
        assert [t["function"]["name"] for t in line["tools"]] == ["lake_move"]  # what the processor offered
        turns = [m for m in line["messages"] if m["role"] == "assistant"]
        assert turns and line["messages"][0]["role"] == "system"
        for turn in turns:
            (call,) = turn["tool_calls"]
            assert call["function"]["name"] == "lake_move"
            action = json.loads(call["function"]["arguments"])["action"]
            assert action in CHOICES
            seen.add(action)
        # the environment answered each executed call
        assert any(m["role"] == "tool" and "position" in str(m["content"]) for m in line["messages"])
    assert len(seen) > 1  # drawn, not fixed
    assert len(read_demonstrations(out).lines) == 4  # the warm start reads them as they are


def test_the_player_draws_seeded_choices_for_the_one_offered_tool() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "lake_move",
                "parameters": {"type": "object", "properties": {"action": {"type": "string"}}},
            },
        }
    ]
    player = ScriptedPlayer(CHOICES, seed=1)
    answers = [player.answer(tools, "scripted-0", turn) for turn in range(12)]
    assert {name for name, _ in answers} == {"lake_move"}
    assert {tuple(arguments) for _, arguments in answers} == {("action",)}  # the tool's only parameter
    assert len({arguments["action"] for _, arguments in answers}) > 1
    assert answers == [ScriptedPlayer(CHOICES, seed=1).answer(tools, "scripted-0", turn) for turn in range(12)]
    assert answers != [ScriptedPlayer(CHOICES, seed=2).answer(tools, "scripted-0", turn) for turn in range(12)]


def test_what_the_player_cannot_play_is_refused_naming_the_fix() -> None:
    move = {
        "type": "function",
        "function": {
            "name": "move",
            "parameters": {"type": "object", "properties": {"action": {"type": "string"}, "speed": {"type": "string"}}},
        },
    }
    look = {"type": "function", "function": {"name": "look", "parameters": {"type": "object", "properties": {}}}}
    player = ScriptedPlayer(CHOICES)
    with pytest.raises(ValueError, match="offers 2 tools \\(look, move\\): name the one the player calls with --tool"):
        player.answer([move, look], "scripted-0", 0)
    with pytest.raises(ValueError, match="offered the model no tool"):
        player.answer([], "scripted-0", 0)
    with pytest.raises(
        ValueError,
        match="tool move takes 2 parameters \\(action, speed\\): name the one the player sets with --argument",
    ):
        ScriptedPlayer(CHOICES, tool="move").answer([move, look], "scripted-0", 0)
    with pytest.raises(ValueError, match="--argument aim: tool move takes action, speed"):
        ScriptedPlayer(CHOICES, tool="move", argument="aim").answer([move, look], "scripted-0", 0)
    assert ScriptedPlayer(CHOICES, tool="move", argument="action").answer([move, look], "s", 0)[0] == "move"
    with pytest.raises(ValueError, match="--choices"):
        ScriptedPlayer(())


def test_a_tool_the_eval_does_not_offer_is_refused_through_the_command(tmp_path: Path) -> None:
    """The refusal reaches the user as the command's error (exit 2), from the request the processor made."""
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ep_trl.devtools.record_demonstrations",
            f"{ROOT / 'tests' / 'evals' / 'eval_frozen_lake.py'}::test_frozen_lake",
            "--out",
            str(tmp_path / "d.jsonl"),
            "--choices",
            "LEFT",
            "--tool",
            "jump",
            "--rows",
            "1",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "--tool jump: the eval offers lake_move" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "d.jsonl").exists()


def test_a_scripted_expert_answers_from_the_messages_and_is_loaded_by_module_and_name() -> None:
    from ep_trl.devtools.record_demonstrations import load_policy

    tools = [
        {
            "type": "function",
            "function": {
                "name": "lake_move",
                "parameters": {"type": "object", "properties": {"action": {"type": "string"}}},
            },
        }
    ]
    expert = load_policy("ep_trl.devtools.frozen_lake_rows:shortest_path_move")
    # the first observation as the benchmark's user prompt shows it (Python's form), the player at the start
    first = [
        {
            "role": "user",
            "content": "The lake now:\n{'position': 0, 'grid': '\\n\\x1b[41mS\\x1b[0mFFH\\nFFFF\\n"
            "HHHF\\nFFFG\\n'}\n\nPick your next move.",
        }
    ]
    assert ScriptedPlayer((), policy=expert).answer(tools, "scripted-0", 0, first) == ("lake_move", {"action": "DOWN"})
    # a later one as the MCP server's tool result (JSON): from tile 6 the only safe way is RIGHT, then down
    later = [
        *first,
        {
            "role": "tool",
            "content": json.dumps(
                {"position": 6, "grid": "  (Right)\nSF\x1b[41mF\x1b[0mH\nFFFF\nHHHF\nFFFG\n", "action": "RIGHT"}
            ),
        },
    ]
    assert ScriptedPlayer((), policy=expert).answer(tools, "scripted-0", 1, later)[1] == {"action": "RIGHT"}
    with pytest.raises(ValueError, match="not one of --choices LEFT,UP"):
        ScriptedPlayer(("LEFT", "UP"), policy=expert).answer(tools, "scripted-0", 0, first)
    for spec, message in (
        ("no_colon", "give MODULE:FUNCTION"),
        ("ep_trl.devtools.frozen_lake_rows:nothing", "nothing"),
        ("ep_trl.nowhere:f", "No module named"),
    ):
        with pytest.raises(ValueError, match=message):
            load_policy(spec)


def test_the_expert_takes_a_shortest_safe_path_and_stays_put_on_the_goal() -> None:
    from ep_trl.devtools.frozen_lake_rows import lake_in, shortest_path_move

    lake = ["SFFH", "FHFF", "FFHF", "HFFG"]

    def observe(position: int) -> list[dict]:
        return [{"role": "tool", "content": json.dumps({"position": position, "grid": "\n".join(lake) + "\n"})}]

    moves = {"LEFT": -1, "RIGHT": 1, "UP": -4, "DOWN": 4}
    position, path = 0, list[str]()
    while lake[position // 4][position % 4] != "G":
        move = shortest_path_move(observe(position))
        position += moves[move]
        assert lake[position // 4][position % 4] != "H", path
        path.append(move)
    assert len(path) == 6  # no shorter way exists on this lake
    assert lake_in(observe(15)) == (lake, 15)
    assert shortest_path_move(observe(15)) in ("DOWN", "RIGHT")  # into the edge: the player stays on the goal
    with pytest.raises(ValueError, match="no message shows the lake"):
        shortest_path_move([{"role": "user", "content": "hello"}])
