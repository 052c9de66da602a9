"""Everything OpenEnv: the client session, the pool of sessions, the servers ep_trl starts, the episode loop and the
OpenEnv episode source. ``import openenv`` inside this package still means the OpenEnv distribution (absolute imports);
ep_trl's own modules are imported relatively (docs/architecture.md)."""
