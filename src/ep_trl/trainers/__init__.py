"""Trainers that stand in for TRL's where TRL's own cannot run or drops what a rollout returns.

Each subclasses a TRL trainer, replaces as little of it as it can, refuses a TRL it is not tested with
(``ep_trl.adapters.trl_seam.TESTED_TRL``), and is imported from its own module, so that using one never imports the TRL
internals another needs:

* ``ep_trl.trainers.disk_sync.DiskSyncGRPOTrainer``: ``GRPOTrainer(use_vllm=True, vllm_mode="server")`` on CPU, its
  weights reaching a local vLLM server through disk;
* ``ep_trl.trainers.cpu_colocate.CPUColocateGRPOTrainer``: TRL's colocated vLLM engine on CPU;
* ``ep_trl.trainers.cpu_async.CPUAsyncGRPOTrainer``: ``AsyncGRPOTrainer`` on CPU;
* ``ep_trl.trainers.disk_weights.DiskWeightTransfer``: ``AsyncGRPOTrainer``'s weight transfer through disk (no NCCL);
* ``ep_trl.trainers.images.RolloutImagesGRPOTrainer``: a ``GRPOTrainer`` whose forward passes see the images a
  rollout returns (a vision-language model on an eval's screenshots);
* ``ep_trl.trainers.async_images.AsyncImagesGRPOTrainer`` (``CPUAsyncImagesGRPOTrainer`` on CPU): an
  ``AsyncGRPOTrainer`` whose forward passes see the images each ``EvalRolloutWorker`` sample carries.
"""
