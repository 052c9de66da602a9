"""Fault injection for shard processes (``tests/adapters/test_sharded.py``): the factory they build their rollout
function with, named so that it reaches them by name.

``rows_held_until_closed`` makes the rollout function's ``ep logs`` writer hold every row in its queue until it is
flushed or closed (its wait before a batch is an hour), as the rows logged in the last second before a SIGTERM are
held: a shard process that ends without closing its rollout function loses them, which the store then shows.
"""

from typing import Any

from ep_trl import RolloutFunction, create_openenv_vllm_rollout_func

#: The writer's wait before it writes a batch: longer than any test, so only a flush or a close writes.
HELD_S = 3600.0


def rows_held_until_closed(env_path: str, **kwargs: Any) -> Any:
    rollout = create_openenv_vllm_rollout_func(env_path, **kwargs)
    assert isinstance(rollout, RolloutFunction), "a shard builds its process's own rollout function, not shards"
    writer = rollout.engine.log_writer
    assert writer is not None, "rows_held_until_closed needs log_rollouts=True"
    writer._min_interval_s = HELD_S
    return rollout
