"""The ways TRL drives a rollout, each an adapter on one ``ep_trl.engine`` engine (docs/architecture.md):

* ``rollout_func``: ``create_openenv_vllm_rollout_func`` and ``RolloutFunction``, GRPOTrainer's ``rollout_func``;
* ``async_worker``: ``EvalRolloutWorker``, ``AsyncGRPOTrainer``'s rollout worker;
* ``samples``: the worker's samples of a released group, and the buffer the trainer takes them from;
* ``worker_checks``: what the worker checks before it starts;
* ``worker_records``: what the worker records of each released group, and its metrics per step;
* ``policy_adapters``: the LoRA adapter a server serves for each policy version the async trainer synced;
* ``sharded``: a call's prompt groups played by shard processes (``RolloutOptions(worker_processes=N)``);
* ``output``: the dict returned to TRL;
* ``trl_seam``: the one place that reads TRL's internals and the TRL versions each path is tested with.
"""
