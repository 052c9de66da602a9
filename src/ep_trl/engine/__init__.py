"""What every adapter shares (docs/architecture.md):

* ``engine``: ``RolloutEngine``, what a rollout needs behind the small method set every adapter uses;
* ``caller``: who calls a rollout (``TrainingConfig``, the ``RolloutCaller`` protocol, the synced server);
* ``call_setup``: ``CallReader``, the one place below the adapters that reads a caller, into a ``CallSetup``;
* ``settings``: the precedence of overrides, eval and ``GRPOConfig``; per-call turn limits; task rotation;
* ``stream``: ``stream_groups``, the one stream of played and scored episodes (slots, groups released as they end);
* ``scoring``: finished episodes scored with the body per row, group or batch;
* ``metrics``: the per-call ``ep_trl/*`` metrics, log line and warnings.
"""
