"""OpenEnv's providers by name (``ep-trl train --env-provider NAME``, ``provider="NAME"``, ep_trl.openenv.providers).

``uv`` runs for real: OpenEnv's ``UVProvider`` runs OpenEnv's own Connect Four package (tests/fixtures/openenv_repo,
unchanged), its locked dependencies installed by ``uv`` from the package registry. Docker, Docker Swarm and Kubernetes
cannot run here: their wiring is tested against :class:`RecordingContainerProvider`, a stand-in put where OpenEnv's
class is, recording what it was asked to start and stop."""

import json
import re
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import psutil
import pytest
from openenv.core.containers import runtime
from openenv.core.containers.runtime import ContainerProvider

from ep_trl import ConfigError, create_openenv_vllm_rollout_func
from ep_trl.cli import train
from ep_trl.openenv.local_provider import LocalAppProvider
from ep_trl.openenv.providers import PROVIDER_CLASSES, installed_providers, uv_project

ROOT = Path(__file__).resolve().parents[2]
CONNECT4 = f"{ROOT / 'tests' / 'evals' / 'eval_connect4.py'}::test_connect4"
CONNECT4_PROJECT = ROOT / "tests" / "fixtures" / "openenv_repo" / "connect4_env"
GUESS_DOCKER = "tests.evals.eval_guess_docker::test_guess_docker"
GUESS_HUB = "tests.evals.eval_guess_hub::test_guess_hub"
SMALL = ["--per-device-train-batch-size", "4", "--num-generations", "2", "--max-completion-length", "24"]
#: What OpenEnv's class for each container name is, in ``openenv.core.containers.runtime``.
CONTAINER_CLASSES = {
    "docker": "LocalDockerProvider",
    "docker-swarm": "DockerSwarmProvider",
    "kubernetes": "KubernetesProvider",
}


class RecordingContainerProvider(ContainerProvider):  # type: ignore[misc]
    """A fake OpenEnv container provider, put in place of OpenEnv's own: it records every ``start_container`` (the
    image and environment variables it was given), ``wait_for_ready`` and ``stop_container``, and serves the guess
    environment from its package (``serve=True``) or answers nothing (a URL no server is at)."""

    calls: ClassVar[list[tuple[str, ...]]] = []
    serve: ClassVar[bool] = False

    def __init__(self) -> None:
        self._image: str | None = None
        self._server: LocalAppProvider | None = None

    def start_container(
        self, image: str, port: int | None = None, env_vars: dict[str, str] | None = None, **kwargs: Any
    ) -> str:
        self._image = image
        self.calls.append(("start", image, json.dumps(env_vars or {}, sort_keys=True)))
        if not self.serve:
            return "http://127.0.0.1:9"
        self._server = LocalAppProvider("tests.fixtures.guess_env.server.app:app", env_vars=env_vars)
        return self._server.start()

    def wait_for_ready(self, base_url: str, timeout_s: float = 30.0) -> None:
        self.calls.append(("ready", base_url))

    def stop_container(self) -> None:
        assert self._image is not None, "stopped before it was started"
        self.calls.append(("stop", self._image))
        if self._server is not None:
            self._server.stop()


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[RecordingContainerProvider]]:
    """The stand-in in place of each of OpenEnv's container providers (Kubernetes' placeholder included)."""
    RecordingContainerProvider.calls = []
    RecordingContainerProvider.serve = False
    for class_name in CONTAINER_CLASSES.values():
        monkeypatch.setattr(runtime, class_name, RecordingContainerProvider)
    yield RecordingContainerProvider


def started(calls: list[tuple[str, ...]]) -> list[tuple[str, dict[str, str]]]:
    return [(call[1], json.loads(call[2])) for call in calls if call[0] == "start"]


def test_the_names_are_the_installed_openenvs_classes() -> None:
    """openenv-core 0.3 and openenv 0.10 both have UVProvider, LocalDockerProvider and DockerSwarmProvider, and a
    KubernetesProvider that is a placeholder (abstract: it cannot be made)."""
    installed = installed_providers()
    assert installed.classes == {
        "uv": runtime.UVProvider,
        "docker": runtime.LocalDockerProvider,
        "docker-swarm": runtime.DockerSwarmProvider,
    }
    assert installed.placeholders == {"kubernetes": runtime.KubernetesProvider}
    assert installed.distribution.startswith(("openenv-core 0.3.", "openenv 0.10."))
    assert dict(PROVIDER_CLASSES) == {"uv": "UVProvider", **CONTAINER_CLASSES}


def test_a_provider_is_offered_only_where_the_installed_openenv_has_it() -> None:
    older = types.ModuleType("runtime")
    older.UVProvider = runtime.UVProvider  # type: ignore[attr-defined]
    installed = installed_providers(older)
    assert list(installed.classes) == ["uv"] and not installed.placeholders
    problem = installed.problem("docker")
    assert problem is not None and problem.endswith(
        "has no provider named 'docker' (it has no LocalDockerProvider). The providers it has: uv"
    )
    assert installed.problem("uv") is None


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("podman", "has no provider named 'podman'. The providers it has: uv, docker, docker-swarm"),
        ("kubernetes", "KubernetesProvider is a placeholder without an implementation (it leaves start_container, "),
    ],
)
def test_a_name_openenv_does_not_have_is_refused_before_anything_starts(
    name: str, said: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        train.main([CONNECT4, "--env-provider", name, "--model", str(tiny_model_dir), "--output-dir", str(tmp_path)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"--env-provider {name}: " in err and said in err, err
    assert "The providers it has: uv, docker, docker-swarm" in err
    assert not any(tmp_path.iterdir())  # no run folder: nothing started


@pytest.mark.parametrize(
    ("env_path", "flags", "said"),
    [
        (CONNECT4, ["--env-provider", "uv", "--env-base-url", "http://127.0.0.1:1"], "drop one of them"),
        ("tests.evals.eval_single_turn", ["--env-provider", "uv"], "so there is nothing to start"),
        (GUESS_DOCKER, ["--env-provider", "uv"], "no pyproject.toml holds GuessEnv's package"),
    ],
)
def test_a_provider_with_nothing_to_start_is_refused(
    env_path: str, flags: list[str], said: str, tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        train.main([env_path, *flags, "--model", str(tiny_model_dir), "--output-dir", str(tmp_path)])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


def test_uv_runs_the_project_that_holds_the_clients_package() -> None:
    from tests.evals.eval_connect4 import Connect4Env  # imported from OpenEnv's package folder

    assert uv_project(Connect4Env) == (CONNECT4_PROJECT, "connect4_env.server.app:app")


@pytest.mark.parametrize("name", list(CONTAINER_CLASSES))
def test_a_container_provider_is_given_the_image_and_env_vars_and_stopped(
    name: str, recording: type[RecordingContainerProvider]
) -> None:
    """One container per task, each given the eval's image and env_vars with the task's GUESS_GAME, as eval-protocol's
    processor starts them; each stopped when the rollout function closes."""
    rollout = create_openenv_vllm_rollout_func(GUESS_DOCKER, provider=name, log_rollouts=False)
    try:
        assert started(recording.calls) == [
            ("guess-env:latest", {"GUESS_GAME": "vowels", "GUESS_MAX_STEPS": "2"}),
            ("guess-env:latest", {"GUESS_GAME": "digits", "GUESS_MAX_STEPS": "2"}),
        ]
        assert [c[0] for c in recording.calls] == ["start", "ready", "start", "ready"]
    finally:
        rollout.close()
    assert [c for c in recording.calls if c[0] == "stop"] == [("stop", "guess-env:latest")] * 2


def test_a_hub_evals_container_is_its_repos_image_in_the_spaces_registry(
    recording: type[RecordingContainerProvider],
) -> None:
    """As OpenEnv's ``from_env`` pulls a hub repo (not the processor's default docker_image, browsergym-env)."""
    rollout = create_openenv_vllm_rollout_func(GUESS_HUB, provider="docker", log_rollouts=False)
    rollout.close()
    assert started(recording.calls) == [("registry.hf.space/openenv-guess-env:latest", {"GUESS_GAME": "digits"})]
    assert recording.calls[-1] == ("stop", "registry.hf.space/openenv-guess-env:latest")


def test_a_provider_name_is_refused_by_the_library_too() -> None:
    with pytest.raises(ConfigError, match=r"provider 'podman': .* The providers it has: uv, docker, docker-swarm"):
        create_openenv_vllm_rollout_func(GUESS_DOCKER, provider="podman", log_rollouts=False)


@pytest.mark.timeout(300)
def test_train_with_env_provider_docker_plays_on_what_the_provider_started(
    recording: type[RecordingContainerProvider], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """``ep-trl train --env-provider docker``: the run's episodes are played on the servers the provider started
    (here the stand-in serves the guess game), which it stops when the run ends."""
    recording.serve = True
    assert train.main([GUESS_DOCKER, "--env-provider", "docker", "--model", str(tiny_model_dir), *SMALL,
                       "--max-steps", "1", "--output-dir", str(tmp_path / "run")]) == 0  # fmt: skip
    assert started(recording.calls) == [
        ("guess-env:latest", {"GUESS_GAME": "vowels", "GUESS_MAX_STEPS": "2"}),
        ("guess-env:latest", {"GUESS_GAME": "digits", "GUESS_MAX_STEPS": "2"}),
    ]
    assert recording.calls[-2:] == [("stop", "guess-env:latest")] * 2
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["ended"] == "finished" and result["steps"] == 1


def uv_servers() -> list[psutil.Process]:
    """The Connect Four servers ``uv run`` started (their command lines name the app)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if "connect4_env.server.app:app" in " ".join(process.info["cmdline"] or ()):
            found.append(process)
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_train_with_env_provider_uv_runs_openenvs_own_package(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``ep-trl train --env-provider uv`` on an eval naming OpenEnv's Connect Four: OpenEnv's UVProvider runs the
    package's own uv project (``uv run --isolated``, its lock's dependencies from the registry), the run trains on its
    episodes, and the server is gone when the run ends."""
    assert not uv_servers()
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "ep_trl.cli", "train", CONNECT4, "--env-provider", "uv", "--model", str(tiny_model_dir),
         *SMALL, "--max-steps", "2", "--output-dir", "run"],
        cwd=tmp_path, capture_output=True, text=True, timeout=560,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(r"started the environment server for Connect4Env at http://127\.0\.0\.1:\d+ with UVProvider",
                     proc.stderr), proc.stderr[-4000:]  # fmt: skip
    steps = re.findall(r"^step (\d)/2 \| reward ([-0-9.]+) .*\| eval_score ([0-9.]+)", proc.stdout, flags=re.M)
    assert [step for step, _, _ in steps] == ["1", "2"], proc.stdout
    result = json.loads((tmp_path / "run" / "result.json").read_text())
    assert result["ended"] == "finished" and result["steps"] == 2
    assert not uv_servers(), "the uv-run server outlived the run"
    print(f"ep-trl train --env-provider uv: {time.monotonic() - began:.0f} s", file=sys.stderr)
