"""Which source plays an eval's episodes: the only place that knows the sources by name."""

from collections.abc import Sequence

from ..evalprotocol import EvalSpec, EvalTest, eval_rows
from ..openenv.servers import LaunchedServers
from ..options import RolloutOptions
from ..trajectory.types import Row
from . import EpisodeSource


def make_source(
    spec: EvalSpec,
    eval_test: EvalTest,
    options: RolloutOptions,
    servers: LaunchedServers | None,
    input_dataset: Sequence[str] | None = None,
) -> EpisodeSource:
    """ep_trl's own loop for an ``OpenEnvRolloutProcessor`` eval (``spec.env`` is set), else the eval's processor
    run on the eval's rows (read from ``input_dataset`` in place of the eval's own, when given)."""
    if spec.env is not None:
        from ..openenv.source import OpenEnvSource

        return OpenEnvSource(spec, options, servers)
    from .processor import ProcessorSource

    rows: list[Row] = eval_rows(eval_test, input_dataset)
    return ProcessorSource(spec, rows)
