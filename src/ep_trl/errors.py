"""Exceptions that ep_trl raises on purpose, each with a message that says what to do."""


class EpTrlError(Exception):
    """Base class of every error ep_trl raises deliberately."""


class EnvPathError(EpTrlError, ValueError):
    """``env_path`` does not name exactly one usable ``@evaluation_test``."""


class UnsupportedEvalError(EpTrlError, ValueError):
    """The eval test exists but uses something the bridge cannot train with."""


class VersionError(EpTrlError, RuntimeError):
    """An installed dependency is outside the versions ep_trl supports."""


class ConfigError(EpTrlError, ValueError):
    """An option passed to ep_trl is unknown or inconsistent."""


class GenerationError(EpTrlError, RuntimeError):
    """The generation backend failed in a way retrying will not fix."""


class NoTrainingSignalError(EpTrlError, RuntimeError):
    """Several rollout calls in a row produced no scored episode: training would go on learning nothing."""


class RolloutWorkerError(EpTrlError, RuntimeError):
    """The rollout worker of ``AsyncGRPOTrainer`` stopped (the cause is chained) or produced nothing for too long."""


class ProcessExitingError(EpTrlError, RuntimeError):
    """A rollout call started after ep_trl closed what it opened for the process's exit (a SIGTERM's stop grace
    ran out, or the interpreter is exiting)."""
