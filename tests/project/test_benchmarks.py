"""Every script in ``benchmarks/`` runs at its smallest size, so none can rot unnoticed (docs/benchmarks.md names
them as the commands behind its figures).

Each runs in its own interpreter, as a user runs it; a script that writes a result file must record its command
line, commit and machine load in it (``ep_trl.devtools.run_record``). The scripts that need a vLLM server
share the session's (``shared_vllm_url``), through their ``--vllm-url``.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: script -> its smallest run (``{out}``: the result file, ``{vllm}``: the shared vLLM server's URL).
SMALLEST: dict[str, list[str]] = {
    "async_image_processing.py": [
        "--processors",
        "tiny",
        "--repeats",
        "1",
        "--groups",
        "1",
        "--screenshots",
        "2",
        "--render",
        "--width",
        "320",
        "--height",
        "200",
        "--out",
        "{out}",
    ],
    "async_overlap.py": [
        "--server",
        "sleep",
        "--smoke",
        "--arms",
        "sync,async,per-call",
        "--repeats",
        "2",
        "--out",
        "{out}",
    ],
    "ceiling_table.py": ["--results", "benchmarks/results/history", "--out", "{out}"],
    "bridge_ceiling.py": [
        "--arms",
        "openenv",
        "openenv_client",
        "single_turn",
        "agent",
        "chat",
        "--concurrency",
        "1",
        "--turns",
        "1",
        "--logs",
        "on",
        "--episodes",
        "2",
        "--repeats",
        "1",
        "--out",
        "{out}",
    ],
    "bridge_concurrency.py": [
        "--concurrency",
        "2",
        "4",
        "--processes",
        "1",
        "--episodes",
        "8",
        "--seconds",
        "0",
        "--repeats",
        "1",
        "--env-replicas",
        "2",
        "--out",
        "{out}",
    ],
    "compare_code.py": [
        "--before",
        "HEAD",
        "--rounds",
        "1",
        "--field",
        "cpu_ms",
        "--out",
        "{out}",
        "--",
        "benchmarks/http_client_cpu.py",
        "--vllm-url",
        "{vllm}",
        "--requests",
        "2",
        "--repeats",
        "1",
    ],
    "doors_first_replies.py": ["--result", "benchmarks/results/smollm2_doors_seed0_wordings.json", "--out", "{out}"],
    "frozen_lake_baselines.py": [
        "--lakes",
        "4",
        "--draws",
        "1",
        "--caps",
        "6",
        "--sequence",
        "RIGHT,DOWN",
        "--out",
        "{out}",
    ],
    "episode_processes.py": ["--concurrency", "1", "--episodes", "1", "--guard-runs", "2", "--out", "{out}"],
    "generation_backends.py": [
        "--arms",
        "trainer",
        "--episodes",
        "4",
        "--concurrency",
        "1",
        "--repeats",
        "1",
        "--no-warm-up",
        "--out",
        "{out}",
    ],
    "http_client_cpu.py": ["--vllm-url", "{vllm}", "--requests", "2", "--repeats", "1", "--out", "{out}"],
    "import_time.py": ["--repeats", "1", "--episodes", "2", "--measures", "import", "processor_run", "--out", "{out}"],
    "logging_overhead.py": [
        "--repeats",
        "1",
        "--episodes",
        "4",
        "--max-steps",
        "1",
        "--max-tokens",
        "2",
        "--no-warm-up",
        "--out",
        "{out}",
    ],
    "real_model.py": [
        "--vllm-url",
        "{vllm}",
        "--concurrency",
        "1",
        "--episodes",
        "2",
        "--repeats",
        "1",
        "--train-steps",
        "1",
        "--no-warm-up",
        "--out",
        "{out}",
    ],
    "processor_overlap.py": [
        "--episodes",
        "2",
        "--concurrency",
        "2",
        "--repeats",
        "1",
        "--tool-latency-s",
        "0",
        "--no-warm-up",
        "--out",
        "{out}",
    ],
    "rollout_phases.py": [
        "--vllm-url",
        "{vllm}",
        "--concurrency",
        "2",
        "--episodes",
        "2",
        "--batches",
        "1",
        "--env-latency-s",
        "0",
        "--no-warm-up",
        "--out",
        "{out}",
    ],
    "rollout_throughput.py": [
        "--vllm-url",
        "{vllm}",
        "--episodes",
        "2",
        "--concurrency",
        "2",
        "--repeats",
        "1",
        "--env-latency-s",
        "0",
        "--no-warm-up",
        "--out",
        "{out}",
    ],
    "soak.py": ["--calls", "2", "--episodes", "4"],
    "start_here.py": ["--max-steps", "2", "--out", "{out}"],
    "main_job_spread.py": ["--runs", "1", "--steps", "1", "--out", "{out}"],
    "repeat_tests.py": [
        "--runs",
        "2",
        "--load",
        "1",
        "--durations",
        "3",
        "--out",
        "{out}",
        "--",
        "tests/runtime/test_shutdown.py",
        "-k",
        "stop_grace",
    ],
}


def rollout_throughput_ran_every_arm(result: dict, stdout: str) -> None:
    """Every arm of docs/benchmarks.md's throughput comparison ran against the server, and the table it quotes."""
    assert sorted((r["arm"], r["concurrency"]) for r in result["runs"]) == [
        ("ep_trl", 2),
        ("eval_protocol", 2),
        ("sequential", 1),
    ]
    assert all(r["generated_tokens"] > 0 and r["episodes_per_s"] > 0 for r in result["runs"])
    ep_trl = next(r for r in result["summary"] if r["arm"] == "ep_trl")
    assert ep_trl["x_sequential"] > 0 and ep_trl["x_eval_protocol"] > 0 and ep_trl["mean_episode_wall_s"] > 0
    assert "| ep_trl | 2 |" in stdout


def async_overlap_interleaved_its_repeats(result: dict, stdout: str) -> None:
    """docs/benchmarks.md's async figures are medians of interleaved repeats, with the overlap-only ratio computed
    from each repeat's own sync and async rows."""
    rows = result["results"]
    assert [(r["repeat"], r["arm"]) for r in rows] == [
        (0, "sync"),
        (0, "async"),
        (0, "per-call"),
        (1, "sync"),
        (1, "async"),
        (1, "per-call"),
    ]
    summary = result["summary"]
    assert summary["repeats"] == 2 and [p["repeat"] for p in summary["per_repeat"]] == [0, 1]
    for ratios in summary["per_repeat"]:
        sync, run = (
            next(r for r in rows if r["repeat"] == ratios["repeat"] and r["arm"] == arm) for arm in ("sync", "async")
        )
        assert ratios["overlap_only"] == pytest.approx(run["wall_s"] / (sync["rollout_s"] + run["train_s"]))
        assert ratios["async_over_sync"] == pytest.approx(run["wall_s"] / sync["wall_s"])
    walls = sorted(r["wall_s"] for r in rows if r["arm"] == "async")
    assert summary["arms"]["async"]["wall_s"] == pytest.approx(sum(walls) / 2)  # the median of two
    assert "median of 2: async / sync wall" in stdout


def async_image_processing_processed_each_image_once(result: dict, stdout: str) -> None:
    """Over the whole step (the episodes' renders, two turns each, the samples, the collator) each screenshot is
    processed once, by the renders, and the ratio to one processing is reported."""
    for row in result["runs"]:
        assert row["renders_once"] and row["images"] == 4
        assert row["render_images_processed"] == 4 and row["step_processings_per_image"] == 1.0
        assert row["worker_images_processed"] == 0 and row["images_processed"] == 0
        assert row["image_cpu_over_one_processing"] > 0
    assert "processings per image; each image processed once costs" in stdout


def repeat_tests_ran_each_run(result: dict, stdout: str) -> None:
    """Both runs of the selection ran under the load, passed, and are counted, with their slowest tests."""
    assert result["load_processes"] == 1 and result["runs_total"] == 2 and result["runs_passed"] == 2
    assert all(run["returncode"] == 0 and run["passed"] >= 1 and run["failed_tests"] == [] for run in result["runs"])
    assert "2 of 2 runs passed" in stdout
    # --durations 3: each run's slowest test phases, slowest first, each a test of the selection
    for run in result["runs"]:
        assert 1 <= len(run["slowest"]) <= 3 and all(
            s["test"].startswith("tests/runtime/test_shutdown.py::") for s in run["slowest"]
        )
        assert [s["seconds"] for s in run["slowest"]] == sorted((s["seconds"] for s in run["slowest"]), reverse=True)


def main_job_spread_read_the_probabilities(result: dict, stdout: str) -> None:
    """The run's right-action probabilities before and after, read from the main job's output, for both tasks."""
    [run] = result["runs"]
    assert set(run["before"]) == set(run["after"]) == {"click-test", "focus-text"}
    assert all(0 < p <= 1 for p in [*run["before"].values(), *run["after"].values()])
    assert result["after_right_probability_lowest_task"]["min"] == min(run["after"].values())


def bridge_concurrency_measured_every_point(result: dict, stdout: str) -> None:
    """Each (processes, in flight) point played its episodes with up to that many turns at the stand-in server at
    once (the bridge does not cap them), and its CPU per turn is over the smallest concurrency's of the same
    processes. One process only: shard processes start in tens of seconds each on a loaded 2-core machine (the
    full run measures them; their CPU is read as bridge_ceiling.py's ``cpu_seconds`` reads it)."""
    rows = result["summary"]
    assert [(r["processes"], r["concurrency"]) for r in rows] == [(1, 2), (1, 4)]
    for row in rows:
        assert row["turns"] == 5 * row["episodes"] and row["cpu_ms_per_turn"] > 0 and row["episodes_per_s"] > 0
        assert row["peak_in_flight"] <= row["concurrency"] and row["environment_servers_cpu_ms_per_turn"] > 0
        first = next(r for r in rows if r["processes"] == row["processes"] and r["concurrency"] == 2)
        assert row["cpu_over_c_first"] == pytest.approx(row["cpu_ms_per_turn"] / first["cpu_ms_per_turn"])
    assert max(r["peak_in_flight"] for r in rows) > 1  # episodes' turns overlapped at the server
    assert result["settings"]["tokens_per_turn"] * result["settings"]["per_token_s"] == pytest.approx(0.02)
    assert "| 1 | 4 |" in stdout and "trainer threads, CPU ms/turn: ep-trl-rollout-log" in stdout


def start_here_ran_the_readmes_command(result: dict, stdout: str) -> None:
    (run,) = result["runs"]
    assert result["readme_command"] == "python recipes/letters/tiny.py"
    assert run["steps"] == 2 and run["ended"] == "finished" and 0 < run["run_wall_s"] < run["command_wall_s"]
    assert run["command_cpu_s"] > 0 and any(line.startswith("done: 2 steps") for line in run["last_lines"]), run


#: script -> what its smallest run must also show, beyond a result file with a run record and rows.
CHECKS = {
    "bridge_concurrency.py": bridge_concurrency_measured_every_point,
    "rollout_throughput.py": rollout_throughput_ran_every_arm,
    "async_image_processing.py": async_image_processing_processed_each_image_once,
    "async_overlap.py": async_overlap_interleaved_its_repeats,
    "repeat_tests.py": repeat_tests_ran_each_run,
    "main_job_spread.py": main_job_spread_read_the_probabilities,
    "start_here.py": start_here_ran_the_readmes_command,
}
NEEDS_VLLM = sorted(name for name, args in SMALLEST.items() if "{vllm}" in args)
STANDALONE = sorted(name for name in SMALLEST if name not in NEEDS_VLLM)


def run_script(name: str, out: Path, vllm: str = "") -> subprocess.CompletedProcess:
    args = [a.format(out=out, vllm=vllm) for a in SMALLEST[name]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    return subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / name), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=540,
    )


def check(done: subprocess.CompletedProcess, name: str, out: Path) -> None:
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    if "{out}" not in SMALLEST[name]:
        return
    result = json.loads(out.read_text())
    run = result["run"]
    assert run["command"].split()[1] == f"benchmarks/{name}" and str(out) in run["command"]  # the script relative
    assert len(run["commit"]) == 40 and len(run["load_start"]) == 3 and len(run["load_end"]) == 3
    rows = next(result[k] for k in ("runs", "results", "batches", "table") if k in result)
    assert rows, f"{name} wrote no rows"
    if name in CHECKS:
        CHECKS[name](result, done.stdout)


def test_every_script_has_a_smallest_run() -> None:
    """A new script in benchmarks/ must be added here."""
    assert sorted(p.name for p in (REPO / "benchmarks").glob("*.py")) == sorted(SMALLEST)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", STANDALONE)
def test_script_runs_at_its_smallest_size(name: str, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    check(run_script(name, out), name, out)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", NEEDS_VLLM)
def test_script_runs_at_its_smallest_size_on_the_shared_vllm_server(
    name: str, shared_vllm_url: str, tmp_path: Path
) -> None:
    out = tmp_path / "result.json"
    check(run_script(name, out, shared_vllm_url), name, out)


def test_repeat_tests_keeps_what_a_failed_run_reported() -> None:
    """A failed run's record keeps pytest's FAILURES section (the traceback and assertion), not only its name: a
    shutdown test failed once in 20 and the record said only that it failed."""
    spec = importlib.util.spec_from_file_location("repeat_tests", REPO / "benchmarks" / "repeat_tests.py")
    assert spec is not None and spec.loader is not None
    repeat_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(repeat_tests)
    report = (
        "..F\n=================== FAILURES ===================\n___ test_a ___\n>   assert 1 == 2\nE   assert 1 == 2\n"
        "=========== short test summary info ===========\nFAILED tests/t.py::test_a - assert 1 == 2\n"
    )
    section = repeat_tests.failures_section(report)
    assert "E   assert 1 == 2" in section and "FAILED tests/t.py" not in section and not section.startswith("..F")
