"""The ways TRL drives a rollout: the GRPO ``rollout_func``, the async worker and the shard processes, with the one
seam where TRL's internals are read (docs/architecture.md)."""
