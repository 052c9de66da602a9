"""Held-out play (``ep-trl train --held-out N``): the three figures (task success, well-formed actions, success among
well-formed episodes), the seed split of OpenEnv evals, and end to end on an OpenEnv eval, an MCP-gym eval and an
environment that ignores seeds; each held-out instance under several values of a reset keyword."""

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest

from ep_trl.cli.heldout import ResetVariants, SeedSplit
from ep_trl.cli.heldout_figures import HeldOutEpisode, HeldOutEpisodes, per_value_summary
from ep_trl.devtools.miniwob_demonstrations import page_actions_of
from tests.sources.test_processor import agent_eval, agent_model_dir, calc_server  # noqa: F401  (fixtures)

if TYPE_CHECKING:
    from ep_trl.envs.browsergym import BrowserGymObservation
    from tests.support.letters import LettersEpisodes


def test_success_among_well_formed_episodes_leaves_out_any_episode_with_a_fallen_back_action() -> None:
    played = HeldOutEpisodes(
        (
            HeldOutEpisode("click-button", ("click('12')",), (True,), 1.0, "finished"),
            HeldOutEpisode("click-button", ("click('13')",), (True,), 0.0, "finished"),
            HeldOutEpisode(
                "enter-text", ("fill('14', 'Ann')", "I would"), (True, False), 0.0, "finished", instance={"seed": 14}
            ),
            HeldOutEpisode("enter-text", (), (), None, "error"),
        )
    )
    assert played.success == pytest.approx(0.25)
    assert played.well_formed_rate == pytest.approx(3 / 4)
    assert played.success_when_well_formed == pytest.approx(0.5)
    assert played.per_task() == {"click-button": 0.5, "enter-text": 0.0}
    assert HeldOutEpisodes(()).success_when_well_formed is None
    assert played.summary("after training") == (
        "held-out after training: task success 0.250 (click-button 0.500, enter-text 0.000); well-formed actions "
        "0.750; success among well-formed episodes 0.500 (4 episodes, greedy)"
    )
    assert "success among well-formed episodes n/a (0 episodes" in HeldOutEpisodes(()).summary("before training")
    assert played.rows()[2] == {
        "task": "enter-text",
        "instance": {"seed": 14},
        "turns": ["fill('14', 'Ann')", "I would"],
        "parsed": [True, False],
        "score": 0.0,
        "status": "finished",
        "prompt_tokens": 0,
        "completion_tokens": 0,
    }
    assert played.rows()[3]["instance"] is None


def test_reset_variants_play_each_instance_under_each_value_value_by_value_and_figures_split_by_value() -> None:
    variants = ResetVariants.parse(" wording = is-open, locked ", instances=2)
    assert (variants.name, variants.values, variants.episodes) == ("wording", ("is-open", "locked"), 4)
    assert [(variants.instance(g), variants.kwargs(g)) for g in range(4)] == [
        (0, {"wording": "is-open"}),
        (1, {"wording": "is-open"}),
        (0, {"wording": "locked"}),
        (1, {"wording": "locked"}),
    ]
    with pytest.raises(ValueError, match="are 4 episodes"):
        variants.kwargs(4)
    for text, problem in (
        ("wording", "is not NAME=V1,V2"),
        ("=a,b", "is not NAME=V1,V2"),
        ("w=", "is not NAME"),
        ("seed=1,2", "the reset seed is the held-out instance"),
        ("w=a,b,a", "more than once"),
    ):
        with pytest.raises(ValueError, match=problem):
            ResetVariants.parse(text, instances=2)
    played = HeldOutEpisodes(
        (
            HeldOutEpisode(None, ("red",), (True,), 1.0, "finished", seed=5, reset_kwargs={"wording": "is-open"}),
            HeldOutEpisode(None, ("hm",), (False,), 0.0, "finished", seed=5, reset_kwargs={"wording": "locked"}),
            HeldOutEpisode(None, ("blue",), (True,), 1.0, "finished", seed=6, reset_kwargs={"wording": "locked"}),
        )
    )
    figures = played.per_value("wording", ("is-open", "locked", "never-played"))
    assert list(figures) == ["is-open", "locked"]
    assert (figures["locked"]["success"], figures["locked"]["episodes"]) == (0.5, 2)
    assert figures["locked"]["success_when_well_formed"] == 1.0 and figures["is-open"]["success"] == 1.0
    assert (
        played.rows()[1]["reset_kwargs"] == {"wording": "locked"}
        and "reset_kwargs" not in HeldOutEpisodes((HeldOutEpisode(None, (), (), None, "error"),)).rows()[0]
    )
    assert per_value_summary(variants, played, "after training") == (
        "held-out after training, task success per wording: is-open 1.000, locked 0.500"
    )


def test_the_format_demonstrated_on_a_page_is_every_click_and_every_fill_with_the_goal_s_text() -> None:
    page = SimpleNamespace(
        clickable_bids=["14", "15"],
        goal='Enter "Kanesha" into the text field and press Submit.',
        axtree_txt="RootWebArea\n\t[14] textbox '', clickable\n\t[15] button 'Submit', clickable",
    )
    assert page_actions_of(cast("BrowserGymObservation", page)) == (
        "click('14')",
        "click('15')",
        "fill('14', 'Kanesha')",
    )
    no_text = SimpleNamespace(clickable_bids=["13"], goal="Click the button.", axtree_txt="[13] button 'Click Me!'")
    assert page_actions_of(cast("BrowserGymObservation", no_text)) == ("click('13')",)


# ---------------------------------------------------------------- `ep-trl train --held-out` end to end

ROOT = Path(__file__).resolve().parents[2]
LETTERS = f"{ROOT / 'evals' / 'eval_letters.py'}::test_letters"
FROZEN_LAKE = f"{ROOT / 'tests' / 'evals' / 'eval_frozen_lake.py'}::test_frozen_lake"
UNSEEDED = f"{ROOT / 'tests' / 'evals' / 'eval_unseeded.py'}::test_unseeded"
SMALL = [
    "--max-steps",
    "2",
    "--per-device-train-batch-size",
    "8",
    "--num-generations",
    "4",
    "--max-completion-length",
    "32",
    "--learning-rate",
    "3e-3",
]
SUMMARY = (
    r"^held-out {when} training: task success ([0-9.]+){tasks}; well-formed actions ([0-9.]+); success among "
    r"well-formed episodes (n/a|[0-9.]+) \({n} episodes, greedy\)$"
)
CHANGE = (
    r"^held-out task success [0-9.]+ -> [0-9.]+ \([+-][0-9.]+\); well-formed actions [0-9.]+ -> [0-9.]+; "
    r"success among well-formed episodes (n/a|[0-9.]+) -> (n/a|[0-9.]+)$"
)


def train_cli(args: list[str], cwd: Path, timeout: float) -> "subprocess.CompletedProcess[str]":
    """``python -m ep_trl.cli train ARGS`` (what ``ep-trl train`` runs), to its end."""
    return subprocess.run(
        [sys.executable, "-m", "ep_trl.cli", "train", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def check_figures(rows: list[dict[str, Any]], figures: dict[str, Any], success: float) -> None:
    """The three figures are those of the rows: mean score, share of parsed turns, mean score of all-parsed rows."""
    assert figures["episodes"] == len(rows) and success == figures["success"]
    assert figures["success"] == pytest.approx(sum(r["score"] or 0.0 for r in rows) / len(rows), abs=1e-4)
    parsed = [p for r in rows for p in r["parsed"]]
    assert figures["well_formed_rate"] == pytest.approx(sum(parsed) / len(parsed), abs=1e-4)
    formed = [r["score"] or 0.0 for r in rows if r["parsed"] and all(r["parsed"])]
    assert figures["success_when_well_formed"] == (
        pytest.approx(sum(formed) / len(formed), abs=1e-4) if formed else None
    )


@pytest.mark.timeout(400)
def test_held_out_on_an_openenv_eval_plays_reset_seeds_that_training_never_resets(
    tiny_model_dir: Path, tmp_path: Path, letters_episodes: "LettersEpisodes"
) -> None:
    """The letters eval (OpenEnv, tasks vowels and abc) on the session's letters server (which records each reset's
    seed): 4 held-out seeds drawn from --held-out-seed, played before and after training with the tasks rotated; every
    training reset names a seed of its prompt group that is not held out; the result file keeps each episode (seed,
    task, turns as the server received them, parse flags, score) and the three figures."""
    proc = train_cli(
        [
            LETTERS,
            "--model",
            str(tiny_model_dir),
            *SMALL,
            "--held-out",
            "4",
            "--held-out-seed",
            "5",
            "--output-dir",
            "run",
        ],
        tmp_path,
        timeout=380,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    for when in ("before", "after"):
        assert re.search(SUMMARY.format(when=when, tasks=r" \(abc [0-9.]+, vowels [0-9.]+\)", n=4), out, re.M), out
    assert re.search(CHANGE, out, re.M), out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    split = SeedSplit.draw(5, 4)
    held = list(split.held_out)
    assert result["held_out_seeds"] == held and result["held_out_rows"] == 4
    episodes = letters_episodes()
    for when, nth in (("before", 0), ("after", 1)):
        rows = result[f"held_out_{when}_rows"]
        check_figures(rows, result[f"held_out_{when}_figures"], result[f"held_out_{when}"])
        assert [(r["seed"], r["task"], r["status"]) for r in rows] == [
            (seed, task, "finished") for seed, task in zip(held, ["vowels", "abc"] * 2)
        ]
        for row in rows:
            # the letters parser falls back to an empty action for a reply with nothing in it
            assert row["parsed"] == [bool(turn) for turn in row["turns"]] and row["completion_tokens"] > 0
            played = [e for e in episodes if e["seed"] == row["seed"]][nth]
            assert (played["task_name"], played["actions"]) == (row["task"], row["turns"])
            assert row["score"] == pytest.approx(sum(played["rewards"]) / len(played["rewards"]), abs=1e-4)
    seen = Counter(e["seed"] for e in episodes)
    assert all(seen[seed] == 2 for seed in held)  # before and after; never in training
    training = {split.training_seed(group): 4 for group in range(4)}  # 2 steps of 2 groups of 4 episodes
    probes = {split.probe_seed(): 2, split.training_seed(-2): 1}  # the seed check at start
    assert {s: n for s, n in seen.items() if s not in held} == {**training, **probes}


@pytest.mark.timeout(400)
def test_held_out_tasks_keep_training_off_those_tasks_and_hold_out_no_seed(
    tiny_model_dir: Path, tmp_path: Path, letters_episodes: "LettersEpisodes"
) -> None:
    """--held-out-tasks abc on the letters eval (tasks vowels, abc): training plays vowels alone, the 2 held-out
    episodes play abc before and after training; no seed is held out, checked or sent."""
    proc = train_cli(
        [
            LETTERS,
            "--model",
            str(tiny_model_dir),
            *SMALL,
            "--held-out",
            "2",
            "--held-out-tasks",
            "abc",
            "--output-dir",
            "run",
        ],
        tmp_path,
        timeout=380,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 held-out episodes of the held-out tasks ['abc']" in proc.stdout, proc.stdout
    for when in ("before", "after"):
        assert re.search(SUMMARY.format(when=when, tasks=r" \(abc [0-9.]+\)", n=2), proc.stdout, re.M), proc.stdout
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert (result["held_out_tasks"], result["held_out_seeds"], result["held_out_rows"]) == (["abc"], None, 2)
    for when in ("before", "after"):
        rows = result[f"held_out_{when}_rows"]
        assert [r["task"] for r in rows] == ["abc", "abc"] and all("seed" not in r for r in rows)
        check_figures(rows, result[f"held_out_{when}_figures"], result[f"held_out_{when}"])
    episodes = letters_episodes()
    assert Counter(e["task_name"] for e in episodes) == {"abc": 4, "vowels": 16}
    assert all(e["seed"] is None for e in episodes)


@pytest.mark.timeout(400)
def test_held_out_on_an_mcp_gym_eval_plays_held_out_rows_through_the_processor(
    qwen_template_model_dir: Path, tmp_path: Path
) -> None:
    """eval-protocol's FrozenLake MCP-gym processor, tool calls in the Qwen 2.5 template, in-process generation: one
    row held out and played before and after training through the processor, with its row id, its turns and whether
    each parsed into a tool call; it is never logged to ``ep logs`` (the training row is)."""
    from ep_trl.evalprotocol import make_dataset_logger

    proc = train_cli(
        [
            FROZEN_LAKE,
            "--model",
            str(qwen_template_model_dir),
            "--max-steps",
            "1",
            "--per-device-train-batch-size",
            "2",
            "--num-generations",
            "2",
            "--max-completion-length",
            "48",
            "--held-out",
            "1",
            "--log-home",
            str(tmp_path / "logs"),
            "--output-dir",
            "run",
        ],
        tmp_path,
        timeout=380,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for when in ("before", "after"):
        assert re.search(SUMMARY.format(when=when, tasks="", n=1), proc.stdout, re.M), proc.stdout
    assert re.search(CHANGE, proc.stdout, re.M), proc.stdout
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["held_out_rows"] == 1 and result["held_out_seeds"] is None
    (held,) = {row["row_id"] for when in ("before", "after") for row in result[f"held_out_{when}_rows"]}
    assert held in ("lake-42", "lake-7")
    for when in ("before", "after"):
        rows = result[f"held_out_{when}_rows"]
        check_figures(rows, result[f"held_out_{when}_figures"], result[f"held_out_{when}"])
        (row,) = rows
        assert row["status"] == "finished" and row["turns"] and len(row["parsed"]) == len(row["turns"])
        for turn, parsed in zip(row["turns"], row["parsed"]):  # a turn is well formed when it called lake_move
            assert parsed == bool(re.search(r'<tool_call>\s*\{"name": "lake_move"', turn)), (turn, parsed)
    logged = {row.input_metadata.row_id for row in make_dataset_logger(tmp_path / "logs").read()}
    assert logged == {"lake-42", "lake-7"} - {held}


@pytest.mark.timeout(200)
def test_held_out_is_refused_for_an_environment_that_ignores_reset_seeds(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Two resets with one seed show different words: held-out seeds would name nothing, so the run is refused with
    exit status 2 before the model loads, saying why and what to do, and leaves no run folder."""
    proc = train_cli(
        [UNSEEDED, "--model", str(tiny_model_dir), "--held-out", "2", "--output-dir", "run"], tmp_path, timeout=180
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert re.search(
        r"--held-out: .*eval_unseeded\.py::test_unseeded: its environment does not honour reset seeds: "
        r"two resets with seed \d+ \(task None\) showed different first observations \('Word: [a-j]{8}', "
        r"then 'Word: [a-j]{8}'\).*Make the environment's reset\(seed=\.\.\.\) choose the instance",
        proc.stderr,
        re.S,
    ), proc.stderr[-3000:]
    assert "held-out reset seeds" not in proc.stdout and not (tmp_path / "run").exists()


DOORS = f"{ROOT / 'evals' / 'eval_doors.py'}::test_doors"
DOORS_SERVER = ["--env-server", "python -m ep_trl.envs.doors --port {port}", "--env-url-var", "DOORS_ENV_URL"]


@pytest.mark.timeout(400)
def test_held_out_reset_kwarg_plays_each_held_out_seed_under_each_value(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The doors eval (OpenEnv; its reset takes a sign ``wording``) with --held-out 2 --held-out-reset-kwarg
    wording=is-open,locked: each held-out seed is played under each wording, value by value, before and after
    training; each row records the keyword its reset was given, and the house and wording the environment says it
    played agree with it; result.json has the three figures per wording, those of the rows."""
    proc = train_cli(
        [
            DOORS,
            "--model",
            str(tiny_model_dir),
            *DOORS_SERVER,
            "--max-steps",
            "1",
            "--per-device-train-batch-size",
            "4",
            "--num-generations",
            "2",
            "--max-completion-length",
            "48",
            "--held-out",
            "2",
            "--held-out-seed",
            "3",
            "--held-out-reset-kwarg",
            "wording=is-open,locked",
            "--output-dir",
            "run",
        ],
        tmp_path,
        timeout=380,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "2 held-out reset seeds, each under 2 values of wording (is-open, locked): 4 held-out episodes" in out, out
    for when in ("before", "after"):
        assert re.search(SUMMARY.format(when=when, tasks="", n=4), out, re.M), out
        assert re.search(
            rf"^held-out {when} training, task success per wording: is-open [0-9.]+, locked [0-9.]+$", out, re.M
        ), out
    assert re.search(
        r"^held-out task success per wording, before -> after: is-open [0-9.]+ -> [0-9.]+, locked "
        r"[0-9.]+ -> [0-9.]+$",
        out,
        re.M,
    ), out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    held = list(SeedSplit.draw(3, 2).held_out)
    assert result["held_out_seeds"] == held and result["held_out_rows"] == 4
    assert result["held_out_reset_kwarg"] == {"name": "wording", "values": ["is-open", "locked"]}
    for when in ("before", "after"):
        rows = result[f"held_out_{when}_rows"]
        check_figures(rows, result[f"held_out_{when}_figures"], result[f"held_out_{when}"])
        plays = [(seed, wording) for wording in ("is-open", "locked") for seed in held]
        assert [(r["seed"], r["reset_kwargs"]) for r in rows] == [(s, {"wording": w}) for s, w in plays]
        assert [r["instance"] for r in rows] == [{"seed": s, "wording": w} for s, w in plays]  # what each reset said
        per_value = result[f"held_out_{when}_per_value"]
        assert list(per_value) == ["is-open", "locked"]
        for wording, figures in per_value.items():
            chosen = [r for r in rows if r["reset_kwargs"]["wording"] == wording]
            check_figures(chosen, figures, figures["success"])


@pytest.mark.timeout(200)
def test_a_reset_kwarg_value_the_environment_refuses_is_refused_before_the_model_loads(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A wording the doors game does not have: its reset fails once the environment server is up, so the run is
    refused with exit status 2, naming the keyword, the value and the environment's answer, and leaves no run
    folder."""
    proc = train_cli(
        [
            DOORS,
            "--model",
            str(tiny_model_dir),
            *DOORS_SERVER,
            "--held-out",
            "2",
            "--held-out-reset-kwarg",
            "wording=is-open,shouted",
            "--output-dir",
            "run",
        ],
        tmp_path,
        timeout=180,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert re.search(
        r"--held-out-reset-kwarg wording=is-open,shouted: .*eval_doors\.py::test_doors: its environment's "
        r"reset\(wording='shouted'\) failed \(.*\), so held-out instances cannot be played under that "
        r"wording\. Give a keyword and values the environment's reset\(\) takes",
        proc.stderr,
        re.S,
    ), proc.stderr[-3000:]
    assert "held-out reset seeds" not in proc.stdout and not (tmp_path / "run").exists()


MINIWOB = f"{ROOT / 'evals' / 'eval_miniwob.py'}::test_miniwob"
BROWSERGYM_SERVER = [
    "--env-server",
    "python -m ep_trl.envs.browsergym --host 127.0.0.1 --port {port}",
    "--env-url-var",
    "BROWSERGYM_ENV_URL",
]


@pytest.mark.timeout(500)
def test_held_out_on_the_browsergym_eval_plays_held_out_miniwob_seeds_task_by_task(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """What ``recipes/miniwob/smollm2.py`` runs, with the tiny model in-process: the BrowserGym server (headless
    Chromium) honours reset seeds (the seed check passes), and the 2 held-out seeds are played one per task, each
    row saying which task and seed the environment played."""
    proc = train_cli(
        [
            MINIWOB,
            "--model",
            str(tiny_model_dir),
            *BROWSERGYM_SERVER,
            "--tasks",
            "click-test",
            "focus-text",
            "--env-steps",
            "1",
            "--max-concurrent-rollouts",
            "2",
            "--max-steps",
            "1",
            "--per-device-train-batch-size",
            "4",
            "--num-generations",
            "2",
            "--max-completion-length",
            "24",
            "--held-out",
            "2",
            "--held-out-seed",
            "4",
            "--output-dir",
            "run",
        ],
        tmp_path,
        timeout=480,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for when in ("before", "after"):
        assert re.search(
            SUMMARY.format(when=when, tasks=r" \(click-test [0-9.]+, focus-text [0-9.]+\)", n=2), proc.stdout, re.M
        ), proc.stdout
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    held = list(SeedSplit.draw(4, 2).held_out)
    assert result["held_out_seeds"] == held
    for when in ("before", "after"):
        rows = result[f"held_out_{when}_rows"]
        check_figures(rows, result[f"held_out_{when}_figures"], result[f"held_out_{when}"])
        assert [(r["seed"], r["task"], r["status"]) for r in rows] == [
            (held[0], "click-test", "finished"),
            (held[1], "focus-text", "finished"),
        ]
        assert [(r["instance"]["seed"], r["instance"]["task_name"]) for r in rows] == [
            (held[0], "click-test"),
            (held[1], "focus-text"),
        ]


def test_training_seeds_never_hit_a_held_out_seed_and_two_split_seeds_hold_out_different_sets() -> None:
    split = SeedSplit.draw(0, 50)
    assert len(set(split.held_out)) == 50 and SeedSplit.draw(0, 50) == split
    assert set(SeedSplit.draw(1, 50).held_out).isdisjoint(split.held_out)
    assert not {split.training_seed(g) for g in range(2000)} & set(split.held_out)
    crowded = SeedSplit(seed=0, held_out=(split.training_seed(3),))  # the group's first draw is held out: redrawn
    assert crowded.training_seed(3) != split.training_seed(3) and crowded.training_seed(3) not in crowded.held_out
    with pytest.raises(ValueError, match="holds out 50 seeds"):
        split.held_out_seed(50)


@pytest.mark.timeout(600)
def test_held_out_plays_on_the_vllm_server_the_run_trains_with(
    sharp_model_dir: Path, shared_vllm_url: str, tmp_path: Path, letters_episodes: "LettersEpisodes"
) -> None:
    """With --vllm-server-url on CPU (DiskSyncGRPOTrainer keeps the server on the trainer's weights) the held-out
    episodes are generated on that server too, greedily, with the trainer's chat template, and after training on the
    last step's weights."""
    proc = train_cli(
        [
            LETTERS,
            "--model",
            str(sharp_model_dir),
            "--vllm-server-url",
            shared_vllm_url,
            *SMALL,
            "--held-out",
            "2",
            "--output-dir",
            "run",
        ],
        tmp_path,
        timeout=560,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    for when in ("before", "after"):
        assert re.search(
            SUMMARY.format(when=when, tasks=r" \(abc [0-9.]+, vowels [0-9.]+\)", n=2), proc.stdout, re.M
        ), proc.stdout
    # both rollout functions, the held-out one and training's, generate on the server; the last step's weights reach
    # it when training ends, before the held-out episodes after training are played
    assert proc.stderr.count("ep_trl: vllm generates") == 2 and "ep_trl: trainer generates" not in proc.stderr
    assert re.search(r"pushed step-2 weights to the vLLM server", proc.stderr), proc.stderr[-3000:]
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    held = result["held_out_seeds"]
    for when in ("before", "after"):
        rows = result[f"held_out_{when}_rows"]
        check_figures(rows, result[f"held_out_{when}_figures"], result[f"held_out_{when}"])
        assert [r["seed"] for r in rows] == held and all(r["status"] == "finished" for r in rows)
    assert Counter(e["seed"] for e in letters_episodes())[held[0]] == 2


@pytest.mark.timeout(400)
def test_an_agent_s_held_out_turns_are_well_formed_when_they_call_an_offered_tool(
    agent_eval: str, agent_model_dir: Path, tmp_path: Path
) -> None:
    """The calculator agent (AgentRolloutProcessor, a real MCP server) and the tiny model taught its script: its
    held-out row is played greedily through the processor for the trainer, in-process; the two replies that call ``add``
    are well formed, the final plain-text answer is not (docs/cli.md: with tools, a turn is well formed when it parsed
    into a tool call), and the body's score is kept with the row's id."""
    from ep_trl import EvalOverrides, RolloutOptions, VLLMOptions, dataset_from_eval
    from ep_trl.cli.heldout import HeldOutPlay
    from tests.support.trainers import make_trainer

    prompts = list(dataset_from_eval(agent_eval)["prompt"])[:1]
    play = HeldOutPlay(
        agent_eval,
        prompts,
        openenv=False,
        count=1,
        seed=0,
        overrides=EvalOverrides(),
        options=RolloutOptions(),
        vllm=VLLMOptions(),
        max_concurrent_rollouts=None,
    )
    try:
        trainer = make_trainer(agent_model_dir, tmp_path, play.rollout, prompts=prompts * 4, max_steps=1)
        played = play.play(trainer)
    finally:
        play.close()
    (episode,) = played.episodes
    assert episode.parsed == (True, True, False) and episode.status == "finished", episode
    assert [re.sub(r"\s+", " ", turn) for turn in episode.turns[:2]] == [
        '<tool_call> {"name": "add", "arguments": {"a": 1, "b": 2}} </tool_call>',
        '<tool_call> {"name": "add", "arguments": {"a": 3, "b": 4}} </tool_call>',
    ]
    assert episode.turns[2] == "10" and episode.score == 1.0 and episode.row_id is not None
    assert played.well_formed_rate == pytest.approx(2 / 3) and played.success_when_well_formed is None
