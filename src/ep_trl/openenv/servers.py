"""Environment servers ep_trl starts itself, for an eval whose processor names a Docker image or a hub repo.

eval-protocol's processor starts such an environment from its image; training here runs where no Docker daemon
may exist, but the environment's package usually is importable (the eval imports its client class from it). In
OpenEnv's layout that package holds the server too (``<env>/server/app.py`` beside ``<env>/client.py``), so
ep_trl serves it as a local process with this Python, the eval's ``env_vars`` in its environment, waits for
``/health`` and stops it when the rollout function is closed or the interpreter exits. When the eval selects its
task through an environment variable (``task_var``), one server is started per task, as eval-protocol's
processor starts one container per task.

Servers are started through OpenEnv's own provider interface, so any provider can stand in (``provider=``):
OpenEnv's ``LocalDockerProvider``, ``KubernetesProvider`` (container providers, given the eval's image) or a
runtime provider such as ``UVProvider``, or one of OpenEnv's by name (``provider="uv"``, ``ep-trl train
--env-provider uv``: ``ep_trl.openenv.providers``). Without one, ``local_provider.LocalAppProvider`` is used. Why not
``UVProvider`` by default: it re-installs the environment's project into an isolated environment with ``uv`` on every
start, which needs ``uv`` and the network; the package is already importable in the training environment.
"""

import logging
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol, TypeAlias, TypeGuard, cast

from ..errors import ConfigError
from ..evalprotocol.spec import EnvSettings
from ..options import EvalOverrides
from ..runtime import shutdown
from ..runtime.processes import ServerStartError
from .providers import container_image, named_provider, server_app

logger = logging.getLogger(__name__)

#: How long a started environment server may take to answer ``/health``.
START_TIMEOUT_S = 120.0


def _provider_types() -> tuple[type, ...]:
    """OpenEnv's ``RuntimeProvider`` and ``ContainerProvider`` (the same interface in openenv-core 0.3 and openenv
    0.10), imported only when a server is launched: ``openenv.core`` imports gradio, seconds that an eval without a
    launched environment never pays. Empty when no OpenEnv is installed (then nothing is a provider instance)."""
    try:
        from openenv.core.containers.runtime import ContainerProvider, RuntimeProvider
    except ImportError:  # pragma: no cover - the eval's client class already needs an OpenEnv distribution
        return ()
    return (RuntimeProvider, ContainerProvider)


class RuntimeProviderLike(Protocol):
    """What ep_trl calls on an OpenEnv ``RuntimeProvider`` (``UVProvider``, ``local_provider.LocalAppProvider``)."""

    def start(self, *, env_vars: dict[str, str]) -> str: ...

    def wait_for_ready(self, timeout_s: float) -> None: ...

    def stop(self) -> None: ...


class ContainerProviderLike(Protocol):
    """What ep_trl calls on an OpenEnv ``ContainerProvider`` (``LocalDockerProvider``, ``KubernetesProvider``)."""

    def start_container(self, image: str, *, env_vars: dict[str, str]) -> str: ...

    def wait_for_ready(self, base_url: str, timeout_s: float) -> None: ...

    def stop_container(self) -> None: ...


#: An OpenEnv provider that starts one server.
ProviderInstance: TypeAlias = RuntimeProviderLike | ContainerProviderLike
#: What ``provider=`` takes: an OpenEnv RuntimeProvider or ContainerProvider, a zero-argument callable making one, or
#: the name of one of OpenEnv's (``"uv"``, ``"docker"``, ...: ``ep_trl.openenv.providers``).
Provider: TypeAlias = ProviderInstance | Callable[[], ProviderInstance] | str


class LaunchedServers:
    """The environment servers started for one rollout function; ``close()`` (also run at exit and on SIGTERM,
    ``ep_trl.runtime.shutdown``) stops them all. They are the starting process's: in a forked child ``close()`` stops
    none (there ``Popen.poll()`` cannot see them and would take them for gone, and their process groups be killed)."""

    def __init__(self) -> None:
        self._owner = os.getpid()
        self._stops: list[Callable[[], None]] = []
        self.urls: dict[str | None, str] = {}
        self.providers: list[ProviderInstance] = []
        shutdown.register(self)

    def add(self, task: str | None, url: str, provider: ProviderInstance, stop: Callable[[], None]) -> None:
        self.urls[task] = url
        self.providers.append(provider)
        self._stops.append(stop)

    @property
    def running(self) -> bool:
        return bool(self._stops)

    def close(self) -> None:
        stops, self._stops = self._stops, []
        if os.getpid() != self._owner:
            logger.debug(
                "not stopping %d environment servers of process %d from its child %d",
                len(stops),
                self._owner,
                os.getpid(),
            )
            return
        for stop in stops:
            stop()
        shutdown.unregister(self)


def launch(
    settings: EnvSettings, provider: Provider | None, overrides: EvalOverrides | None = None
) -> tuple[EnvSettings, LaunchedServers]:
    """Start the eval's environment server(s); the settings pointing at them, and a handle that stops them.

    One server per task when the eval selects tasks through ``task_var`` (each started with ``task_var=task``),
    else one server. A ``provider`` instance starts one server (with several tasks, they are then asked for at
    reset); a zero-argument callable returning providers starts one per task, as does a provider's name.
    """
    if overrides is not None and (overrides.env_base_url is not None or overrides.env_factory is not None):
        raise ConfigError(
            "provider= starts the environment server; it cannot be combined with env_base_url or "
            "env_factory, which name an environment that already exists. Pass one of them."
        )
    assert settings.client_cls is not None
    if isinstance(provider, str):
        provider = cast(Callable[[], ProviderInstance], named_provider(provider, settings, START_TIMEOUT_S))
    per_task = bool(settings.tasks and settings.task_var) and (
        provider is None or _is_factory(provider) or len(settings.tasks) == 1
    )
    targets: tuple[str | None, ...] = settings.tasks if per_task else (None,)
    make = _provider_maker(settings, provider)
    substitute = None if provider is not None else substitution(settings)
    if substitute is not None:
        logger.warning(substitute)
    servers = LaunchedServers()
    try:
        for task in targets:
            env_vars = {
                **settings.env_vars,
                **({settings.task_var: task} if task is not None and settings.task_var else {}),
            }
            provider_for_task = make()
            try:
                url, stop = _start(provider_for_task, settings, env_vars)
            except (RuntimeError, OSError) as exc:  # ServerStartError, and what providers raise
                what = substitute or f"{type(provider_for_task).__name__} could not start {asked_for(settings)}."
                raise ServerStartError(f"{what}\n{type(exc).__name__}: {exc}") from exc
            servers.add(task, url, provider_for_task, stop)
            logger.info(
                "ep_trl started the environment server for %s%s at %s with %s",
                settings.client_cls.__name__,
                f" (task {task!r})" if task is not None else "",
                url,
                type(provider_for_task).__name__,
            )
    except BaseException:
        servers.close()
        raise
    if per_task:
        return replace(settings, task_urls={t: servers.urls[t] for t in targets if t is not None}), servers
    return replace(settings, base_url=servers.urls[None]), servers


def asked_for(settings: EnvSettings) -> str:
    """The environment the eval names: its Docker image or hub repo."""
    return (
        f"the Docker image {settings.docker_image!r}"
        if settings.docker_image
        else f"the hub repo {settings.hub_repo_id!r}"
    )


def substitution(settings: EnvSettings) -> str | None:
    """What ep_trl serves in place of the eval's Docker image or hub repo when no provider is given (said once, at
    WARNING, and put in any start-up error); None when there is nothing to serve (``_provider_maker`` refuses)."""
    assert settings.client_cls is not None
    app = server_app(settings.client_cls)
    if app is None:
        return None
    how = (
        "provider=LocalDockerProvider() (openenv.core.containers.runtime)"
        if settings.docker_image
        else "provider=... (an OpenEnv runtime provider)"
    )
    return (
        f"The eval's {settings.client_cls.__name__} names {asked_for(settings)}, which ep_trl does not run: it "
        f"serves {app} from the installed package with this Python instead, so a custom build or another "
        f"version in that image is not what trains. To train against the image itself pass {how}, or start it "
        "yourself and pass env_base_url=..."
    )


def _is_factory(provider: Provider) -> TypeGuard[Callable[[], ProviderInstance]]:
    return callable(provider) and not isinstance(provider, _provider_types())


def _provider_maker(settings: EnvSettings, provider: Provider | None) -> Callable[[], ProviderInstance]:
    if provider is not None:
        if _is_factory(provider):
            return provider
        instance = cast(ProviderInstance, provider)  # not a factory: a provider itself
        return lambda: instance
    assert settings.client_cls is not None
    app = server_app(settings.client_cls)
    if app is None:
        source = settings.docker_image or settings.hub_repo_id
        raise ConfigError(
            f"The eval starts {settings.client_cls.__name__} from {source!r}, and ep_trl found no server beside "
            f"{settings.client_cls.__module__} to start instead (OpenEnv layout: <env>/server/app.py). Start the "
            "server yourself and pass env_base_url=..., or pass provider=... (an OpenEnv runtime or container "
            "provider)."
        )
    from .local_provider import LocalAppProvider  # OpenEnv's provider interface: imported only to launch

    return lambda: LocalAppProvider(app, start_timeout_s=START_TIMEOUT_S)


def _starts_containers(provider: ProviderInstance) -> TypeGuard[ContainerProviderLike]:
    """Whether ``provider`` is an OpenEnv ``ContainerProvider`` (it starts a docker image)."""
    container = _provider_types()[1:]
    return bool(container) and isinstance(provider, container)


def _start(
    provider: ProviderInstance, settings: EnvSettings, env_vars: dict[str, str]
) -> tuple[str, Callable[[], None]]:
    """Start one server with an OpenEnv provider of either kind; its URL and how to stop it."""
    if _starts_containers(provider):
        image = container_image(settings)
        if image is None:
            raise ConfigError(f"{type(provider).__name__} starts containers, but the eval names no docker_image.")
        url = provider.start_container(image, env_vars=env_vars)
        provider.wait_for_ready(url, START_TIMEOUT_S)
        return url, provider.stop_container
    runtime = cast(RuntimeProviderLike, provider)  # not a container provider: a runtime one
    url = runtime.start(env_vars=env_vars)
    runtime.wait_for_ready(START_TIMEOUT_S)
    return url, runtime.stop
