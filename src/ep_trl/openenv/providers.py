"""OpenEnv's environment providers by name (``ep-trl train --env-provider NAME``, ``provider="NAME"``).

The names are ep_trl's; the classes are OpenEnv's, read from ``openenv.core.containers.runtime`` of the installed
distribution (openenv-core 0.3 and openenv 0.10 both have the four below). A name whose class the installed OpenEnv
lacks, or declares without implementing it (an abstract class: ``KubernetesProvider`` in both releases is such a
placeholder), is not offered, and asking for it is refused with the names that are.

* ``uv``: ``UVProvider`` runs the environment's own uv project (``uv run --isolated --project DIR``: its
  ``pyproject.toml`` and lock, its dependencies from the package registry) and serves ``<package>.server.app:app``
  from it: the project is the directory holding the eval's client package (OpenEnv's ``envs/<name>/`` layout, whose
  ``pyproject.toml`` maps ``<name>`` to ``.``), found beside the client class's module;
* ``docker``, ``docker-swarm``, ``kubernetes``: OpenEnv's container providers, made without arguments and given
  the eval's image (:func:`container_image`: its ``docker_image``, or its hub repo's image in the Hugging Face
  Spaces registry) and ``env_vars``.

Also here, as ``servers`` and the CLI's checks both read them: the server beside a client in OpenEnv's layout
(:func:`server_app`) and the image a container provider runs for an eval.

A named provider starts one server per task (``task_var``), as eval-protocol's processor starts one container per
task, and each is stopped with the others (``servers.LaunchedServers``).
"""

import importlib
import importlib.util
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from ..errors import ConfigError, EpTrlError
from ..evalprotocol.spec import EnvSettings
from ..runtime.processes import ServerStartError

#: ep_trl's name of each OpenEnv provider, and its class in ``openenv.core.containers.runtime``.
PROVIDER_CLASSES: Mapping[str, str] = {
    "uv": "UVProvider",
    "docker": "LocalDockerProvider",
    "docker-swarm": "DockerSwarmProvider",
    "kubernetes": "KubernetesProvider",
}
#: The names whose provider runs the eval's Docker image (the others run its package).
CONTAINER_NAMES = frozenset({"docker", "docker-swarm", "kubernetes"})


@dataclass(frozen=True)
class InstalledProviders:
    """The providers the installed OpenEnv has: ``classes`` by name (those that can be made), ``placeholders`` (names
    whose class it declares but does not implement) and ``distribution`` (``"openenv-core 0.3.0"``)."""

    distribution: str
    classes: Mapping[str, type]
    placeholders: Mapping[str, type]

    def problem(self, name: str) -> str | None:
        """Why ``name`` cannot start an environment, naming the names that can; None when it can."""
        if name in self.classes:
            return None
        offered = ", ".join(self.classes) or "none"
        if name in self.placeholders:
            cls = self.placeholders[name]
            missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
            return (
                f"{self.distribution}'s {cls.__name__} is a placeholder without an implementation (it leaves "
                f"{missing} abstract), so it cannot start an environment. The providers it has: {offered}"
            )
        known = f" (it has no {PROVIDER_CLASSES[name]})" if name in PROVIDER_CLASSES else ""
        return f"{self.distribution} has no provider named {name!r}{known}. The providers it has: {offered}"


def installed_providers(runtime: ModuleType | None = None) -> InstalledProviders:
    """What the installed OpenEnv's ``openenv.core.containers.runtime`` (or ``runtime``) offers, by ep_trl's names.
    Importing it imports ``openenv.core`` (gradio: seconds), so this is asked only when a provider is named."""
    if runtime is None:
        try:
            runtime = importlib.import_module("openenv.core.containers.runtime")
        except ImportError as error:
            raise ConfigError(
                f"OpenEnv's providers are in openenv.core.containers.runtime, which cannot be imported ({error}): "
                "install one OpenEnv distribution (pip install 'ep-trl[openenv-core]' or 'ep-trl[openenv]')"
            ) from error
    classes: dict[str, type] = {}
    placeholders: dict[str, type] = {}
    for name, class_name in PROVIDER_CLASSES.items():
        cls = getattr(runtime, class_name, None)
        if isinstance(cls, type):
            (placeholders if inspect.isabstract(cls) else classes)[name] = cls
    return InstalledProviders(_distribution(), classes, placeholders)


def server_app(client_cls: type) -> str | None:
    """``"<env>.server.app:app"`` for the package that holds ``client_cls`` in OpenEnv's layout, if importable."""
    parts = client_cls.__module__.split(".")
    for depth in range(len(parts), 0, -1):
        module = ".".join(parts[:depth]) + ".server.app"
        try:
            if importlib.util.find_spec(module) is not None:
                return f"{module}:app"
        except (ImportError, ValueError):
            continue
    return None


def container_image(settings: EnvSettings) -> str | None:
    """The image a container provider runs for the eval: its hub repo's image in the Hugging Face Spaces registry
    (``registry.hf.space/<org>-<space>:latest``, as OpenEnv's ``EnvClient.from_env`` pulls it; eval-protocol's
    processor prefers the hub repo when it names both, and it always has a docker_image: its default), else its
    ``docker_image``."""
    if settings.hub_repo_id:
        return f"registry.hf.space/{settings.hub_repo_id.replace('/', '-')}:latest"
    return settings.docker_image


def _distribution() -> str:
    """The installed OpenEnv distribution and its version, as the refusals name it."""
    from .client import check_openenv

    try:
        return check_openenv()
    except EpTrlError:  # none or both installed, or an unsupported version: still name what was read
        return "the installed OpenEnv"


def uv_project(client_cls: type) -> tuple[Path, str]:
    """The uv project that holds ``client_cls``'s package (the nearest folder with a ``pyproject.toml`` from the
    client's module's up to its top-level package's), and the server app ``UVProvider`` serves from it, named as the
    project installs it (``<project folder>.server.app:app``: OpenEnv's layout maps the package to that folder)."""
    app = server_app(client_cls)
    source = getattr(inspect.getmodule(client_cls), "__file__", None)
    if app is None or source is None:
        raise ConfigError(
            f"--env-provider uv runs the environment's own uv project, and {client_cls.__name__} "
            f"({client_cls.__module__}) has no server beside it in OpenEnv's layout (<env>/server/app.py). Import "
            "the client from the environment's project folder (as OpenEnv's envs/<name>/), or start the server "
            "yourself and pass --env-base-url"
        )
    here = Path(source).resolve().parent
    # the dotted name of the package in ``here``, and the folders from it up to its top-level package's
    parts = client_cls.__module__.split(".")
    package = parts if Path(source).name == "__init__.py" else parts[:-1]
    module, _, attribute = app.partition(":")
    for level, folder in enumerate([here, *here.parents][: len(package)]):
        if (folder / "pyproject.toml").is_file():
            above = ".".join(package[: len(package) - level - 1])  # the prefix the project does not install
            inside = module.removeprefix(f"{above}.") if above else module
            return folder, f"{inside}:{attribute}"
    raise ConfigError(
        f"--env-provider uv runs the environment's own uv project (uv run --project DIR), and no pyproject.toml "
        f"holds {client_cls.__name__}'s package ({here}, installed rather than a project folder). Import the client "
        "from the environment's project folder (OpenEnv's envs/<name>/, with its pyproject.toml), or drop "
        "--env-provider to serve the installed package with this Python"
    )


def named_provider(
    name: str, settings: EnvSettings, start_timeout_s: float, installed: InstalledProviders | None = None
) -> Callable[[], object]:
    """A zero-argument callable making OpenEnv's provider ``name`` (an OpenEnv runtime or container provider) for the
    eval's environment (one per task);
    :class:`ConfigError` naming the names there are when the installed OpenEnv has no such provider, or when the eval
    gives the provider nothing to start."""
    installed = installed or installed_providers()
    problem = installed.problem(name)
    if problem is not None:
        raise ConfigError(f"provider {name!r}: {problem}")
    cls = installed.classes[name]
    assert settings.client_cls is not None
    if name in CONTAINER_NAMES:
        if container_image(settings) is None:
            raise ConfigError(
                f"provider {name!r} runs the eval's Docker image, and {settings.client_cls.__name__}'s processor names "
                "none (docker_image=...): give the eval its image, or use --env-provider uv for its package"
            )
        return lambda: _made(name, cls, {})
    project, app = uv_project(settings.client_cls)
    keywords = {"project_path": str(project), "app": app, "host": "127.0.0.1", "context_timeout_s": start_timeout_s}
    return lambda: _made(name, cls, keywords)


def _made(name: str, cls: type, keywords: Mapping[str, object]) -> object:
    """``cls(**keywords)``; what its constructor raises (no ``uv`` or ``docker`` executable, no daemon) as a start-up
    error naming the provider."""
    try:
        provider: object = cls(**keywords)
    except (RuntimeError, OSError) as error:
        raise ServerStartError(
            f"--env-provider {name}: OpenEnv's {cls.__name__} could not be made: {error}. Install what it runs "
            "(uv: pip install uv; docker: a Docker daemon), or choose another provider"
        ) from error
    return provider
