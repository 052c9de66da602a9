"""ASGI app serving the doors game with openenv's stock server: ``uvicorn ep_trl.envs.doors.server:app`` or
``python -m ep_trl.envs.doors``."""

from openenv.core.env_server.http_server import create_app

from ep_trl.envs.doors.environment import DoorsEnvironment
from ep_trl.envs.doors.models import DoorsAction, DoorsObservation

#: Concurrent sessions (one environment each): above openenv's default of 1 so batched rollouts never hit capacity.
MAX_CONCURRENT_ENVS = 64

app = create_app(
    DoorsEnvironment, DoorsAction, DoorsObservation, env_name="doors", max_concurrent_envs=MAX_CONCURRENT_ENVS
)
