"""Everything OpenEnv. ``import openenv`` inside this package still means the OpenEnv distribution (absolute imports);
ep_trl's own modules are imported relatively (docs/architecture.md).

* ``client``: the OpenEnv seam (which distribution is installed, building and calling clients with timeouts);
* ``pool``: the sessions of one call (reuse, waiting for servers at capacity, retries at reset);
* ``loop``: one OpenEnv episode (reset, turn, action, step);
* ``episode``: what an episode is played with (``EpisodeConfig``) and which one to play (task rotation, seeds);
* ``source``: the episode source of an ``OpenEnvRolloutProcessor`` eval;
* ``servers``: environment servers ep_trl starts through OpenEnv's provider interface;
* ``providers``: OpenEnv's providers by name (``--env-provider``), as the installed OpenEnv has them;
* ``local_provider``: ``LocalAppProvider``, serving an environment's app from its installed package.
"""
