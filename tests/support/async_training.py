"""What the asynchronous training tests record: every sample the worker put on its buffer, and the policy of each
version the trainer synced."""

import queue

from transformers import TrainerCallback


class Recorded(queue.Queue):
    """The worker's buffer, keeping every sample put on it (the trainer drains it as usual)."""

    def __init__(self, maxsize):
        super().__init__(maxsize)
        self.samples = []

    def put(self, item, block=True, timeout=None):
        super().put(item, block, timeout)
        self.samples.append(item)


class VersionSnapshots(TrainerCallback):
    """The policy of each version: version 1 is the initial weights (the first sync), version k+1 the weights after
    step k. ``model_class`` loads the checkpoint (``AutoModelForCausalLM``, ``AutoModelForImageTextToText``)."""

    def __init__(self, model_dir, model_class):
        self.states = {1: model_class.from_pretrained(model_dir).state_dict()}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.states[state.global_step + 1] = {k: v.detach().clone() for k, v in model.state_dict().items()}
