"""``ep-trl train``: the issue's done-when command end to end at small sizes, TRL's flags and YAML config, every bad
input refused before anything starts (the message naming the fix, no process left), SIGTERM keeping the run folder,
and the training scripts going through the same code."""

import http.server
import importlib.util
import json
import re
import signal
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psutil
import pytest

from ep_trl.cli import job as job_module
from ep_trl.cli import rows, server_checks, train

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from types import ModuleType

    from trl import GRPOConfig

    from ep_trl.cli.train import Preset, TrainJob

ROOT = Path(__file__).resolve().parents[2]
LETTERS = f"{ROOT / 'evals' / 'eval_letters.py'}::test_letters"
SENTIMENT = f"{ROOT / 'evals' / 'eval_sentiment.py'}::test_sentiment"
ENV_SERVER = ["--env-server", "python -m ep_trl.envs.letters --port {port}", "--env-url-var", "LETTERS_ENV_URL"]
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


def cli(args: list[str], cwd: Path, **kwargs: Any) -> "subprocess.Popen[str]":
    """``python -m ep_trl.cli train ARGS`` (what the ``ep-trl`` script runs) as a process."""
    return subprocess.Popen(
        [sys.executable, "-m", "ep_trl.cli", "train", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def server_pid(stderr: str) -> int:
    """The environment server's pid (its watchdog, the leader of its process group), from the run's log."""
    match = re.search(r"ready at http://127\.0\.0\.1:\d+ after [0-9.]+ s \(pid (\d+)\)", stderr)
    assert match is not None, "the run's log has no environment server ready line"
    return int(match.group(1))


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.timeout(300)
def test_the_done_when_command_trains_and_writes_the_run_folder(tiny_model_dir: Path, tmp_path: Path) -> None:
    """The issue's command with --model and small sizes: a progress line per step (bar, eval score, ETA), the first
    and last steps' score, a non-zero gradient, the run folder, and the environment server stopped."""
    proc = cli([LETTERS, *ENV_SERVER, "--model", str(tiny_model_dir), *SMALL, "--output-dir", "run"], tmp_path)
    out, err = proc.communicate(timeout=280)
    assert proc.returncode == 0, err[-3000:]
    lines = re.findall(
        r"^step (\d)/2 \| reward [0-9.]+ .*\| eval_score ([0-9.]+) .*\| grad_norm ([0-9.e+-]+) \| "
        r"\[[#.]{20}\] +\d+% \| ETA \d+s$",
        out,
        flags=re.M,
    )
    assert [step for step, _, _ in lines] == ["1", "2"], out
    assert any(float(norm) > 0 for _, _, norm in lines), out  # the policy got a gradient
    assert re.search(
        r"^done: 2 steps, 16 episodes, reward first [0-9.]+ last [0-9.]+ \(mean eval score of steps 1 "
        r"and 2\)",
        out,
        flags=re.M,
    ), out
    folder = tmp_path / "run"
    assert f"reward curve: {Path('run') / 'reward_curve.png'}" in out
    assert (folder / "reward_curve.png").read_bytes()[:4] == b"\x89PNG"
    metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics if "rewards/eval_score/mean" in m] == [1, 2]
    assert (folder / "checkpoint" / "config.json").is_file() and (folder / "checkpoint" / "model.safetensors").is_file()
    assert "num_generations: 4" in (folder / "config.yaml").read_text()
    result = json.loads((folder / "result.json").read_text())
    assert result["ended"] == "finished" and result["steps"] == 2 and 0 <= result["train_first"] <= 1
    assert result["run"]["command"].startswith("ep-trl train ") and result["run"]["commit"] is None  # no checkout
    assert result["versions"]["trl"] and result["run"]["wall_s"] > 0 and result["run"]["machine"]["cpus"]
    assert [s["step"] for s in result["steps_logged"]] == [1, 2] and 0 < result["train_s"] < result["wall_s"]
    assert result["held_out_rows"] == 0 and result["held_out_before_rows"] is None and result["seed"] == 42
    assert gone(server_pid(err))


@pytest.mark.timeout(300)
def test_sigterm_stops_the_run_keeps_its_folder_and_the_server(tiny_model_dir: Path, tmp_path: Path) -> None:
    proc = cli(
        [LETTERS, *ENV_SERVER, "--model", str(tiny_model_dir), *SMALL, "--max-steps", "200", "--output-dir", "run"],
        tmp_path,
    )
    assert proc.stdout is not None and proc.stderr is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("step 2/200"):
            proc.send_signal(signal.SIGTERM)
            break
    out = "".join(lines) + proc.stdout.read()
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 143, err[-3000:]
    assert "terminated: environment server stopped" in out, out
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["ended"] == "terminated (SIGTERM)" and result["steps"] >= 2 and result["checkpoint"] is None
    assert (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") >= 2
    assert gone(server_pid(err))


def test_help_lists_grpo_config_and_ep_trl_groups() -> None:
    text = train.make_parser().format_help()
    for flag in (
        "--num_generations",
        "--beta",
        "--loss_type",
        "--max_completion_length",
        "--report_to",
        "--config",
        "--held_out",
        "--env_server",
        "--vllm_server_url",
        "--async",
        "--screenshots",
        "--lora_r",
        "--env_steps",
        "--worker_processes",
        "--vllm_max_in_flight",
    ):
        assert flag in text, flag
    for group in (
        "ep_trl: the run:",
        "ep_trl: generation",
        "ep_trl: the eval's settings (EvalOverrides",
        "ep_trl: the bridge (RolloutOptions",
        "ep_trl: the vLLM server client (VLLMOptions",
        "TRL: GRPOConfig",
    ):
        assert group in text, group


def test_docs_list_every_ep_trl_flag() -> None:
    import dataclasses

    text = (ROOT / "docs" / "cli.md").read_text()
    for group in train.OPTION_GROUPS:
        for f in dataclasses.fields(group):
            assert f"`--{f.name.replace('_', '-')}" in text, f.name


def test_a_yaml_config_sets_grpo_fields_and_flags_win(tiny_model_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "grpo.yaml"
    config.write_text(
        f"env_path: {LETTERS}\nmodel: {tiny_model_dir}\nlearning_rate: 0.01\nnum_generations: 2\n"
        "beta: 0.1\nlora_r: 4\nenv_steps: 1\nenv:\n  EP_TRL_TEST_FROM_YAML: '1'\n"
    )
    parser = train.make_parser()
    (namespace,) = parser.parse_args_and_config(["--config", str(config), "--num_generations", "4"])
    job = train.plan(parser, vars(namespace), train.Preset(prog=train.PROG, title=""), [])
    grpo = cast("GRPOConfig", job.mode.config(**job.config_values))  # without --async
    assert (grpo.learning_rate, grpo.num_generations, grpo.beta) == (0.01, 4, 0.1)
    assert job.run.lora_r == 4 and job.overrides.max_steps == 1 and job.env_path == LETTERS
    assert (grpo.logging_steps, grpo.save_strategy, grpo.use_vllm) == (1, "no", False)  # the command's defaults
    import os

    assert os.environ.pop("EP_TRL_TEST_FROM_YAML") == "1"


class OtherModelServer(http.server.BaseHTTPRequestHandler):
    """Fault injector: a 'vLLM server' that serves another model (answers /health and /v1/models only)."""

    def do_GET(self) -> None:
        body = json.dumps({"data": [{"id": "some-org/another-model", "max_model_len": 2048}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        return None


@pytest.fixture
def other_model_server() -> "Iterator[str]":
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), OtherModelServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def not_a_model(tmp_path: Path) -> str:
    (tmp_path / "weights").mkdir()
    return str(tmp_path / "weights")


def silent_port() -> str:
    from ep_trl.runtime.processes import free_port

    return f"http://127.0.0.1:{free_port()}"


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param(
            lambda d, t, u: ["--model", d], r"ENV_PATH is required: the eval to train on, e\.g\.", id="no-env-path"
        ),
        pytest.param(
            lambda d, t, u: [f"{ROOT / 'evals' / 'eval_letters.py'}::test_nope", "--model", d],
            r"has no attribute 'test_nope'.*Eval tests in that module: test_letters",
            id="env-path-no-such-test",
        ),
        pytest.param(
            lambda d, t, u: [f"{ROOT / 'tests' / 'evals' / 'eval_noop.py'}", "--model", d],
            r"NoOpRolloutProcessor.*calls no model, so there is nothing to train\. Give the eval the processor",
            id="processor-cannot-train",
        ),
        pytest.param(
            lambda d, t, u: [
                LETTERS,
                "--model",
                d,
                "--async",
                "--vllm-mode",
                "colocate",
                "--vllm-server-url",
                "http://127.0.0.1:9",
            ],
            r"--async generates on a vLLM server .* drop --vllm-mode colocate",
            id="async-with-colocate",
        ),
        pytest.param(
            lambda d, t, u: [LETTERS, "--model", not_a_model(t)],
            r"not a model directory \(no config\.json in it\)\. Point --model at the folder save_pretrained",
            id="model-not-a-model",
        ),
        pytest.param(
            lambda d, t, u: [
                LETTERS,
                "--model",
                d,
                "--vllm-server-url",
                silent_port(),
                "--vllm-connect-timeout-s",
                "2",
            ],
            r"No vLLM server answered at .*/v1/models.*Is it running",
            id="vllm-url-silent",
        ),
        pytest.param(
            lambda d, t, u: [LETTERS, "--model", d, "--vllm-server-url", u],
            r"serves 'some-org/another-model', not --model .*: start the server on --model",
            id="vllm-serves-another-model",
        ),
        pytest.param(
            lambda d, t, u: [LETTERS, "--model", d, "--use-vllm"],
            r"--use_vllm: ep-trl sets these from its generation flags\. Drop them and use --vllm-server-url",
            id="trl-mode-flag",
        ),
        pytest.param(
            lambda d, t, u: [LETTERS, "--model", d, "--env-server", "python -m ep_trl.envs.letters"],
            r"has no \{port\}: write where the server's port goes",
            id="env-server-without-port",
        ),
        pytest.param(
            lambda d, t, u: [LETTERS, "--model", d, "--held-out", "0.5"],
            r"--held-out 0\.5: .*plays an OpenEnv environment, whose held-out instances are reset seeds: give "
            r"their number \(a whole number\)",
            id="held-out-share-of-openenv-seeds",
        ),
        pytest.param(
            lambda d, t, u: [LETTERS, "--model", d, "--held-out", "2", "--held-out-tasks", "digits"],
            r"--held-out-tasks digits: \['digits'\] are not tasks of .*\['vowels', 'abc'\]",
            id="held-out-tasks-unknown",
        ),
        pytest.param(
            lambda d, t, u: [LETTERS, "--model", d, "--held-out", "2", "--held-out-tasks", "vowels", "abc"],
            r"--held-out-tasks vowels abc holds out every task of .*leave one at least to train on",
            id="held-out-tasks-all",
        ),
        pytest.param(
            lambda d, t, u: [LETTERS, "--model", d, "--held-out-tasks", "abc"],
            r"--held-out-tasks names the tasks held out of training: add --held-out N",
            id="held-out-tasks-alone",
        ),
        pytest.param(
            lambda d, t, u: [LETTERS, "--model", d, "--held-out-reset-kwarg", "level=1,2"],
            r"--held-out-reset-kwarg level=1,2 plays each held-out instance under each value: add --held-out N",
            id="held-out-reset-kwarg-alone",
        ),
        pytest.param(
            lambda d, t, u: [LETTERS, "--model", d, "--held-out", "2", "--held-out-reset-kwarg", "level"],
            r"--held-out-reset-kwarg level: 'level' is not NAME=V1,V2,\.\.\.: name the reset keyword and its "
            r"values",
            id="held-out-reset-kwarg-no-values",
        ),
        pytest.param(
            lambda d, t, u: [LETTERS, "--model", d, "--held-out", "2", "--held-out-reset-kwarg", "seed=1,2"],
            r"the reset seed is the held-out instance itself",
            id="held-out-reset-kwarg-seed",
        ),
        pytest.param(
            lambda d, t, u: [LETTERS, "--model", d, "--held-out", "2", "--held-out-reset-kwarg", "level=1,1"],
            r"\['1'\] are given more than once: give each value once",
            id="held-out-reset-kwarg-repeated",
        ),
        pytest.param(
            lambda d, t, u: [
                LETTERS,
                "--model",
                d,
                "--held-out",
                "2",
                "--held-out-reset-kwarg",
                "task_name=vowels,abc",
            ],
            r"task_name names the task of each episode .*--held-out-tasks instead",
            id="held-out-reset-kwarg-task",
        ),
        pytest.param(
            lambda d, t, u: [SENTIMENT, "--model", d, "--held-out", "2", "--held-out-reset-kwarg", "level=1,2"],
            r"uses .*whose held-out instances are rows played by its own processor; reset keywords are for "
            r"OpenEnv evals",
            id="held-out-reset-kwarg-processor-eval",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_starts(
    args: "Callable[[str, Path, str], list[str]]",
    message: str,
    tiny_model_dir: Path,
    tmp_path: Path,
    other_model_server: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each bad input: exit status 2 and a message naming the fix; the environment server is never started and no
    process is left (the process's children are the same before and after)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    argv = args(str(tiny_model_dir), tmp_path, other_model_server)
    if "--env-server" not in argv:
        argv += ENV_SERVER
    with pytest.raises(SystemExit) as exit_info:
        train.main(argv + ["--output-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err, flags=re.S), err
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    assert not (tmp_path / "run").exists()


def test_the_console_script_resolves_to_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    script = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["ep-trl"]
    module, _, name = script.partition(":")
    entry = getattr(importlib.import_module(module), name)
    assert entry(["--help"]) == 0 and "ep-trl {train,serve}" in capsys.readouterr().out
    assert entry(["fly"]) == 2


def test_the_old_serve_module_warns_and_runs_the_new_one() -> None:
    sys.modules.pop("ep_trl.serve", None)
    with pytest.warns(DeprecationWarning, match=r"ep_trl\.serve moved to ep_trl\.cli\.serve"):
        old = importlib.import_module("ep_trl.serve")
    from ep_trl.cli import serve

    assert old.main is serve.main


def script(path: str) -> "ModuleType":
    """A recipe (``recipes/TASK/MODEL``) or the main job (``train_browsergym_trl``), imported from its file."""
    spec = importlib.util.spec_from_file_location(path.replace("/", "_"), ROOT / f"{path}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def planned(monkeypatch: pytest.MonkeyPatch) -> "list[TrainJob]":
    """The jobs that ``ep_trl.cli.train.run`` was given (run itself replaced: nothing trains)."""
    jobs: list[TrainJob] = []

    def run(job: "TrainJob") -> int:
        jobs.append(job)
        return 0

    monkeypatch.setattr(train, "run", run)
    return jobs


def test_the_letters_recipe_is_a_preset_of_the_command(planned: "list[TrainJob]") -> None:
    assert script("recipes/letters/tiny").main(["--max-steps", "3", "--seed", "1"]) == 0
    (job,) = planned
    values = job.config_values
    assert job.env_path == LETTERS and job.model is None and job.preset.start_model is not None
    assert (values["max_steps"], values["per_device_train_batch_size"], values["num_generations"]) == (3, 16, 8)
    assert (values["learning_rate"], values["seed"], values["output_dir"]) == (3e-3, 1, "outputs/letters")
    assert job.run.env_server is not None
    assert "ep_trl.envs.letters" in job.run.env_server and job.run.env_url_var == "LETTERS_ENV_URL"
    assert job.command[1].endswith("recipes/letters/tiny.py") and job.command[2:] == ["--max-steps", "3", "--seed", "1"]


def test_the_main_job_is_a_preset_of_the_command(planned: "list[TrainJob]", monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BROWSERGYM_ENV_URL", raising=False)
    assert script("train_browsergym_trl").main(["--lora-r", "4", "--tasks", "click-test", "--env-steps", "2"]) == 0
    (job,) = planned
    assert job.env_path.endswith("eval_miniwob.py::test_miniwob") and job.run.lora_r == 4
    assert job.overrides.tasks is not None
    assert list(job.overrides.tasks) == ["click-test"] and job.overrides.max_steps == 2
    assert job.max_concurrent_rollouts == 2 and job.preset.env_server_env == {"BROWSERGYM_MAX_SESSIONS": "2"}
    assert (job.config_values["optim"], job.config_values["learning_rate"]) == ("sgd", 0.05)
    assert job.run.env_server is not None
    assert "ep_trl.envs.browsergym" in job.run.env_server and job.run.env_url_var == "BROWSERGYM_ENV_URL"


def test_the_sentiment_recipe_is_a_preset_of_the_command(monkeypatch: pytest.MonkeyPatch, tiny_model_dir: Path) -> None:
    """With --model and --vllm-base-url the recipe neither builds SmolLM2 nor starts a server: it calls
    ``ep-trl train`` with its defaults (the share of held-out rows and its split seed, the real model's completion
    length, the server), and its balanced batches as the preset's ordering of the training rows."""
    called: "list[tuple[list[str], Preset]]" = []

    def main(argv: list[str], preset: "Preset") -> int:
        called.append((argv, preset))
        return 0

    monkeypatch.setattr(train, "main", main)
    url = "http://127.0.0.1:8011"
    argv = ["--model", str(tiny_model_dir), "--vllm-base-url", url, "--max-steps", "2", "--held-out", "0.05"]
    assert script("recipes/sentiment/smollm2").main(argv) == 0
    ((args, preset),) = called
    assert args == [] and preset.train_rows is not None and preset.start_model is None
    (namespace,) = train.make_parser(preset).parse_args_and_config([])
    values = vars(namespace)
    assert values["env_path"].endswith("eval_sentiment.py::test_sentiment") and values["model"] == str(tiny_model_dir)
    assert (values["vllm_server_url"], values["held_out"], values["held_out_seed"]) == (url, 0.05, 0)
    assert (values["max_steps"], values["per_device_train_batch_size"], values["num_generations"]) == (2, 32, 16)
    assert (values["learning_rate"], values["temperature"], values["max_completion_length"]) == (2e-5, 0.8, 24)
    assert (values["shuffle_dataset"], values["output_dir"]) == (False, "outputs/smollm2")
    assert preset.command[1].endswith("recipes/sentiment/smollm2.py") and preset.command[2:] == argv


def test_the_doors_recipe_is_a_preset_of_the_command(
    planned: "list[TrainJob]", probe_skipped: None, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The doors recipe is ``ep-trl train`` with its flags: the doors eval and server, the held-out houses drawn from
    --seed, each played under every sign wording (--held-out-reset-kwarg), its GRPO sizes (micro-batches as gradient
    accumulation), the time budget, --result a copy of the run's result.json; it trains nothing of its own."""
    from ep_trl.envs.doors import HELD_OUT_WORDINGS, TRAINING_WORDINGS

    url = "http://127.0.0.1:8011"
    argv = [
        "--model",
        str(tiny_model_dir),
        "--vllm-base-url",
        url,
        "--max-steps",
        "3",
        "--held-out",
        "4",
        "--seed",
        "2",
        "--batch-size",
        "16",
        "--micro-batch-size",
        "4",
        "--time-budget-s",
        "600",
        "--output-dir",
        str(tmp_path / "run"),
        "--result",
        str(tmp_path / "kept" / "doors.json"),
    ]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "result.json").write_text('{"steps": 3}')  # what the run (replaced here) would write
    assert script("recipes/doors/smollm2").main(argv) == 0
    assert (tmp_path / "kept" / "doors.json").read_text() == '{"steps": 3}'  # --result: a copy of the run's
    (job,) = planned
    values = job.config_values
    assert job.env_path.endswith("eval_doors.py::test_doors") and job.model == str(tiny_model_dir)
    assert job.mode.vllm_base_url == url and job.openenv
    assert job.run.env_server is not None
    assert "ep_trl.envs.doors" in job.run.env_server and job.run.env_url_var == "DOORS_ENV_URL"
    assert (job.run.held_out, job.run.held_out_seed, job.run.time_budget_s) == (4, 2, 600.0)
    variants = job.held_out_variants
    assert variants is not None
    assert (variants.name, variants.values, variants.episodes) == (
        "wording",
        (*TRAINING_WORDINGS, *HELD_OUT_WORDINGS),
        24,
    )
    assert (
        values["max_steps"],
        values["per_device_train_batch_size"],
        values["gradient_accumulation_steps"],
        values["num_generations"],
    ) == (3, 4, 4, 8)
    assert (values["learning_rate"], values["temperature"], values["max_completion_length"], values["seed"]) == (
        3e-5,
        0.7,
        320,
        2,
    )
    assert values["vllm_importance_sampling_correction"] is False and values["gradient_checkpointing"] is False
    assert job.command[1].endswith("recipes/doors/smollm2.py") and job.command[2:] == argv


def test_the_miniwob_recipe_is_a_preset_of_the_command(
    planned: "list[TrainJob]",
    probe_skipped: None,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The MiniWoB recipe (SmolLM2) is ``ep-trl train`` with its flags: the BrowserGym eval and server (its
    sessions capped), its tasks and episode length, --held-out per task times the tasks, its GRPO sizes; its warm
    start is the preset's model, on pages none of which is a held-out one."""
    from ep_trl.cli.heldout import SeedSplit
    from ep_trl.devtools.miniwob_instances import page_seed

    monkeypatch.delenv("BROWSERGYM_ENV_URL", raising=False)
    module = script("recipes/miniwob/smollm2")
    argv = [
        "--model",
        str(tiny_model_dir),
        "--vllm-base-url",
        "http://127.0.0.1:8011",
        "--max-steps",
        "2",
        "--held-out",
        "3",
        "--seed",
        "1",
        "--output-dir",
        str(tmp_path / "run"),
    ]
    assert module.main(argv) == 0
    (job,) = planned
    values = job.config_values
    assert job.env_path.endswith("eval_miniwob.py::test_miniwob") and job.model == str(tiny_model_dir)
    assert job.run.env_server is not None
    assert "ep_trl.envs.browsergym" in job.run.env_server and job.run.env_url_var == "BROWSERGYM_ENV_URL"
    assert job.preset.env_server_env == {"BROWSERGYM_MAX_SESSIONS": "2"} and job.preset.start_model is not None
    assert job.overrides.tasks is not None
    assert list(job.overrides.tasks) == ["click-button", "enter-text"] and job.overrides.max_steps == 2
    assert job.overrides.request_timeout_s == 60.0 and job.max_concurrent_rollouts == 2
    assert (job.run.held_out, job.run.held_out_seed, job.held_out_variants) == (6, 1, None)
    assert (
        values["max_steps"],
        values["per_device_train_batch_size"],
        values["gradient_accumulation_steps"],
        values["num_generations"],
        values["learning_rate"],
        values["max_completion_length"],
    ) == (2, 2, 4, 4, 2e-5, 384)
    assert job.command[1].endswith("recipes/miniwob/smollm2.py") and job.command[2:] == argv
    args = module.parse_args(["--held-out", "16", "--warm-start-pages", "40"])
    pages = module.warm_start_pages(args)
    held = {page_seed(s) for s in SeedSplit.draw(0, 32).held_out}
    assert [t for t, _ in pages] == ["click-button"] * 40 + ["enter-text"] * 40
    assert not {page_seed(s) for _, s in pages} & held and pages == module.warm_start_pages(args)


def test_the_sentiment_recipe_help_names_its_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        script("recipes/sentiment/smollm2").parse_args(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert all(flag in out for flag in ("--held-out", "--split-seed", "--shuffled", "--vllm-base-url"))


@pytest.fixture
def probe_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    """``plan`` without its vLLM server probe (the probe's refusals: test_bad_input_is_refused_before_anything_starts):
    the served model is taken to be --model."""
    monkeypatch.setattr(server_checks, "check_server", lambda parser, url, model, vllm: model)


def planned_job(argv: list[str]) -> "TrainJob":
    parser = train.make_parser()
    (namespace,) = parser.parse_args_and_config(argv)
    return train.plan(parser, vars(namespace), train.Preset(prog=train.PROG, title=""), argv)


def test_held_out_below_one_is_a_share_of_the_rows_split_by_its_seed(tiny_model_dir: Path, probe_skipped: None) -> None:
    """``--held-out 0.05`` holds out 6 of the sentiment eval's 120 rows, the same 6 for the same --held-out-seed
    whatever --seed is (recipes/sentiment/smollm2.py's --held-out and --split-seed); a whole number is a count of
    rows."""
    base = [SENTIMENT, "--model", str(tiny_model_dir), "--vllm-server-url", "http://127.0.0.1:8011"]
    train_rows, held_out = rows.split_rows(planned_job(base + ["--held-out", "0.05", "--held-out-seed", "0"]))
    assert (len(train_rows), len(held_out)) == (114, 6)
    _, again = rows.split_rows(planned_job(base + ["--held-out", "0.05", "--held-out-seed", "0", "--seed", "7"]))
    assert again == held_out
    _, counted = rows.split_rows(planned_job(base + ["--held-out", "10"]))
    assert len(counted) == 10


def test_held_out_refuses_a_fractional_count(
    tiny_model_dir: Path, probe_skipped: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        planned_job(
            [
                SENTIMENT,
                "--model",
                str(tiny_model_dir),
                "--vllm-server-url",
                "http://127.0.0.1:8011",
                "--held-out",
                "2.5",
            ]
        )
    assert "--held-out 2.5: give a number of rows (a whole number), or a share" in capsys.readouterr().err


@pytest.mark.parametrize(
    "gpu, flags, trainer",
    [
        (False, [], "GRPOTrainer"),
        (False, ["--vllm-server-url", "URL"], "DiskSyncGRPOTrainer"),
        (False, ["--vllm-mode", "colocate"], "CPUColocateGRPOTrainer"),
        (False, ["--async", "--vllm-server-url", "URL"], "CPUAsyncGRPOTrainer"),
        (False, ["--async", "--vllm-server-url", "URL", "--lora-r", "4"], "CPUAsyncGRPOTrainer"),
        (False, ["--async", "--vllm-server-url", "URL", "--screenshots"], "CPUAsyncImagesGRPOTrainer"),
        (False, ["--screenshots"], "RolloutImagesGRPOTrainer"),
        (False, ["--lora-r", "4"], "GRPOTrainer"),
        (True, ["--vllm-server-url", "URL"], "GRPOTrainer"),
        (True, ["--vllm-mode", "colocate", "--lora-r", "4"], "GRPOTrainer"),
        (True, ["--async", "--vllm-server-url", "URL"], "AsyncGRPOTrainer"),
        (True, ["--async", "--vllm-server-url", "URL", "--screenshots"], "AsyncImagesGRPOTrainer"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_each_generation_flag_reaches_its_trainer(
    gpu: bool,
    flags: list[str],
    trainer: str,
    tiny_model_dir: Path,
    probe_skipped: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What ``run`` trains with, from the command line through ``plan``: the trainer class, the screenshots
    (``images``), the LoRA config and, on CPU, the config's vLLM settings (on a machine with vLLM, for colocate)."""
    from ep_trl.cli import modes

    monkeypatch.setattr(modes, "cuda_available", lambda: gpu)
    monkeypatch.setattr(modes, "vllm_importable", lambda: True)
    url = "http://127.0.0.1:8011"
    job = planned_job(
        [LETTERS, "--model", str(tiny_model_dir), *ENV_SERVER, *[url if flag == "URL" else flag for flag in flags]]
    )
    assert job.mode.trainer_class(job.mode.images).__name__ == trainer
    assert job.mode.images == ("--screenshots" in flags) and job.mode.asynchronous == ("--async" in flags)
    lora = job_module.lora_config(job.run)
    assert (lora.r if lora else 0) == (4 if "--lora-r" in flags else 0)
    if not gpu:
        config = job.mode.config(**job_module.config_values(job))
        assert config.vllm_server_base_url == (url if "--vllm-server-url" in flags else None)
        if "--async" not in flags:  # AsyncGRPOConfig has no use_vllm: it always generates on the server
            assert cast("GRPOConfig", config).use_vllm == ("--vllm-server-url" in flags or "colocate" in flags)


def test_report_to_trackio_is_trl_s_flag_and_a_missing_trackio_names_the_fix(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--report-to trackio`` reaches the trainer config as TRL's own field (GRPOConfig, and AsyncGRPOConfig with
    --async) with its ``--project``; where trackio is not installed it is refused before anything starts, naming
    ``pip install trackio``."""
    from transformers.integrations import integration_utils

    argv = [LETTERS, "--model", str(tiny_model_dir), *ENV_SERVER, "--report-to", "trackio", "--project", "p"]
    if "trackio" not in integration_utils.get_available_reporting_integrations():
        with pytest.raises(SystemExit) as exit_info:
            planned_job(argv)
        assert exit_info.value.code == 2
        assert re.search(
            r"--report-to trackio: trackio is not installed in this Python .*`pip install trackio`, or "
            r"drop --report-to",
            capsys.readouterr().err,
        )
    # as where trackio is installed (what the refusal reads, made to list it): the value reaches the trainer config
    monkeypatch.setattr(integration_utils, "get_available_reporting_integrations", lambda: ["trackio"])
    job = planned_job(argv)
    config = job.mode.config(**job_module.config_values(job))
    assert (config.report_to, config.project) == (["trackio"], "p")
    monkeypatch.setattr(server_checks, "check_server", lambda parser, url, model, vllm: model)
    job = planned_job(argv + ["--async", "--vllm-server-url", "http://127.0.0.1:8011"])
    config = job.mode.config(**job_module.config_values(job))
    assert type(config).__name__ == "AsyncGRPOConfig" and (config.report_to, config.project) == (["trackio"], "p")


# --- chat templates and evals that offer tools (issue 47) --------------------------------------------------------

#: Evals that offer the model tools, one per way of offering them.
TOOL_EVALS = {
    "mcp-gym": (
        "tests.evals.eval_frozen_lake::test_frozen_lake",
        r"its MCPGymRolloutProcessor offers the model the environment's tools",
    ),
    "agent-mcp": (
        "tests.evals.eval_calculator_agent::test_calculator_agent",
        r"its AgentRolloutProcessor offers the model the tools of its MCP servers \(.*calc_mcp\.json\)",
    ),
    "rows-with-tools": ("tests.evals.eval_inputs_rows::test_qa_rows", r"\d+ of its rows offer the model tools"),
}


@pytest.mark.parametrize("kind", sorted(TOOL_EVALS))
def test_an_eval_that_offers_tools_is_refused_at_start_for_a_template_without_a_tool_call_format(
    kind: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny model's own ChatML template has no tool-call format TRL knows (SmolLM2's neither): refused before
    anything starts, naming how the eval offers tools and the flag that fixes it; with the flag, planned."""
    env_path, offered = TOOL_EVALS[kind]
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(SystemExit) as exit_info:
        train.main([env_path, "--model", str(tiny_model_dir), "--output-dir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(offered, err), err
    assert "has no tool-call format TRL knows" in err and "--chat-template qwen2_5" in err, err
    assert re.search(r"this tokenizer's special tokens: .*\bqwen2_5\b", err), err
    assert not (tmp_path / "run").exists()
    assert {p.pid for p in psutil.Process().children(recursive=True)} <= before
    job = planned_job([env_path, "--model", str(tiny_model_dir), "--chat-template", "qwen2_5"])
    assert job.chat_template is not None and job.chat_template.path.name == "qwen2_5.jinja"


def test_an_eval_without_tools_needs_no_tool_call_format(tiny_model_dir: Path) -> None:
    job = planned_job([SENTIMENT, "--model", str(tiny_model_dir)])
    assert job.tools_offered is None and job.chat_template is None


def llama_template_file(tmp_path: Path) -> str:
    from ep_trl.capture.parsing import trl_chat_templates_dir

    path = tmp_path / "my_llama.jinja"
    path.write_text((trl_chat_templates_dir() / "llama3_1.jinja").read_text())
    return str(path)


def chatml_file(tmp_path: Path) -> str:
    from ep_trl.devtools.tiny_model import CHAT_TEMPLATE

    path = tmp_path / "chatml.jinja"
    path.write_text(CHAT_TEMPLATE)
    return str(path)


@pytest.mark.parametrize(
    "template, env_path, message",
    [
        pytest.param(
            lambda t: "qwen9",
            SENTIMENT,
            r"--chat-template qwen9: chat template 'qwen9' is neither a \.jinja file nor a template TRL ships; "
            r"TRL ships: .*\bllama3_1\b.*\bqwen2_5\b",
            id="unknown-name",
        ),
        pytest.param(
            lambda t: str(t / "nowhere.jinja"), SENTIMENT, r"nowhere\.jinja'?: no such file", id="no-such-file"
        ),
        pytest.param(
            lambda t: "llama3_1",
            SENTIMENT,
            r"--chat-template llama3_1: .*writes <\|start_header_id\|>, .*<\|eot_id\|>.* which this tokenizer "
            r"does not have as special tokens \(its own template uses: <\|im_start\|>, <\|im_end\|>\).*Choose "
            r"a template written with this tokenizer's special tokens",
            id="special-tokens-missing",
        ),
        pytest.param(
            llama_template_file,
            SENTIMENT,
            r"my_llama\.jinja' writes <\|start_header_id\|>",
            id="file-special-tokens-missing",
        ),
        pytest.param(
            chatml_file,
            TOOL_EVALS["agent-mcp"][0],
            r"--chat-template .*chatml\.jinja has no tool-call format TRL knows.*--chat-template qwen2_5",
            id="chosen-template-without-tool-calls",
        ),
    ],
)
def test_a_chat_template_that_cannot_serve_the_run_is_refused_at_start(
    template: "Callable[[Path], str]",
    env_path: str,
    message: str,
    tiny_model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train.main(
            [
                env_path,
                "--model",
                str(tiny_model_dir),
                "--chat-template",
                template(tmp_path),
                "--output-dir",
                str(tmp_path / "run"),
            ]
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert re.search(message, err, flags=re.S), err
    assert not (tmp_path / "run").exists()


def test_a_jinja_file_is_a_chat_template_too(tiny_model_dir: Path, tmp_path: Path) -> None:
    from ep_trl.capture.parsing import trl_chat_templates_dir

    path = tmp_path / "tools.jinja"
    path.write_text((trl_chat_templates_dir() / "qwen2_5.jinja").read_text())
    job = planned_job([TOOL_EVALS["rows-with-tools"][0], "--model", str(tiny_model_dir), "--chat-template", str(path)])
    assert job.chat_template is not None
    assert job.chat_template.path == path.resolve() and job.chat_template.text == path.read_text()


@pytest.fixture
def stdio_calculator(tmp_path: Path) -> Path:
    """The calculator agent eval's MCP config: its server started by the processor over stdio (no port taken)."""
    config = tmp_path / "calc_stdio.json"
    config.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "calc": {
                        "command": sys.executable,
                        "args": [str(ROOT / "tests" / "fixtures" / "calc_mcp_server.py"), "stdio"],
                    }
                }
            }
        )
    )
    return config


@pytest.mark.timeout(420)
def test_a_tools_eval_trains_with_chat_template_qwen2_5_and_is_refused_without(
    tiny_model_dir: Path, tmp_path: Path, stdio_calculator: Path
) -> None:
    """`ep-trl train` on the calculator agent (AgentRolloutProcessor over an MCP server) with the tiny ChatML model,
    in-process generation: without --chat-template it exits 2 before anything starts, naming the flag; with
    --chat-template qwen2_5 one step trains (the episodes' tool turns rendered and parsed with that template: with
    the model's own the endpoint would refuse every call) and config.yaml records the template."""
    import os

    import yaml

    env = {**os.environ, "CALC_MCP_CONFIG": str(stdio_calculator)}
    args = [
        "tests.evals.eval_calculator_agent::test_calculator_agent",
        "--model",
        str(tiny_model_dir),
        "--max-steps",
        "1",
        "--per-device-train-batch-size",
        "2",
        "--num-generations",
        "2",
        "--max-completion-length",
        "24",
        "--max-turn-tokens",
        "8",
        "--log-home",
        str(tmp_path),
    ]
    refused = cli([*args, "--output-dir", str(tmp_path / "refused")], ROOT, env=env)
    _, err = refused.communicate(timeout=120)
    assert refused.returncode == 2, err[-3000:]
    assert "has no tool-call format TRL knows" in err and "--chat-template qwen2_5" in err, err[-3000:]
    assert not (tmp_path / "refused").exists()

    proc = cli([*args, "--chat-template", "qwen2_5", "--output-dir", str(tmp_path / "run")], ROOT, env=env)
    out, err = proc.communicate(timeout=360)
    assert proc.returncode == 0, (out[-2000:], err[-4000:])
    assert re.search(r"^step 1/1 \| reward [0-9.]+ .*\| eval_score [0-9.]+", out, flags=re.M), out
    config = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert config["chat_template"] == "qwen2_5" and config["chat_template_file"].endswith("qwen2_5.jinja")
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["ended"] == "finished" and result["steps"] == 1
