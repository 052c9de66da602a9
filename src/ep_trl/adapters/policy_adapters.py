"""Which LoRA adapter a vLLM server with ``--enable-lora`` serves for each policy version that ``AsyncGRPOTrainer``
synced (TRL loads version N as ``trl-policy-vN``), and which adapters an earlier run left there (never used)."""

import logging

from ..errors import ConfigError
from ..generation.probe import lora_enabled, served_models
from . import trl_seam

logger = logging.getLogger(__name__)


class PolicyAdapters:
    """The adapters of this run's policy versions on the server at ``server_url``, whose base model is
    ``base_model``."""

    def __init__(self, server_url: str, base_model: str) -> None:
        self.server_url = server_url
        #: Whether the server runs with --enable-lora: the trainer may then sync a LoRA policy as an adapter alone.
        self.enabled = lora_enabled(server_url)
        self._names: dict[int, str] = {}  # policy version -> the adapter this run's trainer loaded for it
        #: Adapters the server already served before this run's trainer synced anything (an earlier run's): never
        #: used, whatever their names.
        self.foreign = frozenset(set(served_models(server_url)) - {base_model} if self.enabled else ())
        if self.foreign:
            logger.warning(
                "The vLLM server at %s already serves the LoRA adapters %s, loaded before this run: the "
                "worker never generates with them. If this run syncs a LoRA adapter under one of these "
                "names, the server refuses it: restart the server between runs.",
                server_url,
                sorted(self.foreign),
            )

    def synced(self, version: int) -> None:
        """The trainer synced policy ``version``: its adapter, if the trainer loaded one, is looked up (``GET
        /v1/models``, retried if the server is briefly busy), so no turn asks for it before it is known."""
        if not self.enabled:
            return
        name = trl_seam.async_lora_adapter(version)
        if name not in self.foreign and name in served_models(self.server_url):
            self._names[version] = name  # loaded by this run's trainer, just before this call

    def model_for(self, version: int) -> str | None:
        """The model a turn of policy ``version`` is generated with: the adapter this run's trainer synced for it,
        when it syncs adapters; None (the server's own weights, which the trainer overwrites) otherwise."""
        if not self._names:
            return None
        name = self._names.get(version)
        if name is None:  # a ConfigError: it must end the worker, not fail the episode as a generation error
            raise ConfigError(
                f"The vLLM server at {self.server_url} serves the LoRA adapters {sorted(self._names.values())} that "
                f"AsyncGRPOTrainer synced, but none for policy version {version}: episodes cannot be generated with "
                "the policy being trained. One trainer must sync to one server (a second run, or a resumed one that "
                "counts versions anew, loads adapters under the same names): restart the server."
            )
        return name
