"""An eval trains asynchronously: ep_trl's ``EvalRolloutWorker`` as the rollout worker of TRL's ``AsyncGRPOTrainer``
(``CPUAsyncGRPOTrainer`` on this CPU machine), weights pushed to a real CPU vLLM server through disk
(``DiskWeightTransfer``), real ``train()`` steps on the letters eval and a processor eval; staleness, back-pressure,
health and stop. The fault-injection server (``tests/support/faulty_vllm.py``) stands in only where a failure or a
stall must happen on demand."""

import queue
import time

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from trl.experimental.async_grpo import AsyncGRPOConfig

from ep_trl import ConfigError, EvalRolloutWorker, RolloutWorkerError, VLLMOptions, dataset_from_eval
from ep_trl.async_cpu import CPUAsyncGRPOTrainer
from ep_trl.vllm_weight_sync import DiskWeightTransfer
from tests.support.faulty_vllm import FaultyVLLMServer
from tests.support.references import teacher_forced_logprobs
from tests.support.vllm_server import missing_vllm_message, vllm_installed, vllm_server

LETTERS = "tests.evals.eval_letters::test_letters_pointwise"
ARITHMETIC = "tests/evals/eval_arithmetic.py::test_arithmetic"
TOLERANCE = 1e-3
TEMPERATURE = 0.8


@pytest.fixture(scope="module")
def model_dir(sharp_model_dir):
    return sharp_model_dir


@pytest.fixture(scope="module")
def server_url(model_dir, tmp_path_factory):
    """A real vLLM server (CPU build) for the model, in dev mode (weights reloaded from disk), as trl vllm-serve."""
    if not vllm_installed():
        pytest.fail(missing_vllm_message())
    with vllm_server(model_dir, tmp_path_factory.mktemp("vllm_logs"), max_model_len=1024) as server:
        yield server.base_url


def config(tmp_path, url, **overrides):
    values = dict(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, num_generations=4,
                  per_device_train_batch_size=8, max_completion_length=256, max_steps=3, logging_steps=1,
                  learning_rate=3e-3, temperature=TEMPERATURE, report_to=[], token_budget=0, save_strategy="no",
                  vllm_server_base_url=url)
    return AsyncGRPOConfig(**{**values, **overrides})


class Recorded(queue.Queue):
    """The worker's buffer, keeping a copy of every sample put on it (the trainer drains it as usual)."""

    def __init__(self, maxsize):
        super().__init__(maxsize)
        self.samples = []

    def put(self, item, block=True, timeout=None):
        super().put(item, block, timeout)
        self.samples.append(item)


class VersionSnapshots(TrainerCallback):
    """The policy of each version: version 1 is the initial weights (the first sync), version k+1 the weights after
    step k."""

    def __init__(self, model_dir):
        self.states = {1: AutoModelForCausalLM.from_pretrained(model_dir).state_dict()}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.states[state.global_step + 1] = {k: v.detach().clone() for k, v in model.state_dict().items()}


class TrainedPolicyCall(TrainerCallback):
    """Step 2 begins only once the worker has played a whole call on the policy trained by step 1 (version 2), so
    the test does not depend on how a call and a training step happen to interleave on a loaded machine."""

    def __init__(self, worker):
        self.worker = worker

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 1:
            wait_until(lambda: any(c.started_version == c.ended_version == 2 for c in self.worker.calls), 120)


def worker_and_trainer(env_path, model_dir, args, callbacks=(), **worker_options):
    worker = EvalRolloutWorker(env_path, args=args, processing_class=AutoTokenizer.from_pretrained(model_dir),
                               log_rollouts=False, **worker_options)
    worker.rollout_buffer = Recorded(worker.rollout_buffer.maxsize)
    trainer = CPUAsyncGRPOTrainer(str(model_dir), args=args, train_dataset=dataset_from_eval(env_path, repeat=8),
                                  rollout_worker=worker, weight_transfer=DiskWeightTransfer(args.vllm_server_base_url,
                                                                                            model_dir),
                                  callbacks=list(callbacks))
    return worker, trainer


def sampled_gap(model, sample):
    """The largest difference between a sample's old_log_probs and the model's teacher-forced logprobs, over the
    tokens it trains on (completion_mask 1)."""
    ids, mask = sample.input_ids.tolist(), sample.completion_mask.tolist()
    start = mask.index(1)
    reference = teacher_forced_logprobs(model.eval(), ids[:start], ids[start:], TEMPERATURE)
    return max(abs(float(old) - ref) for old, ref, m in zip(sample.old_log_probs[start:], reference, mask[start:]) if m)


@pytest.mark.timeout(600)
def test_the_letters_eval_trains_asynchronously_token_exact(model_dir, server_url, letters_server, tmp_path):
    """Samples carry the ids the server sampled, masks and logprobs aligned on them: a sample whose call ran on one
    policy version has old_log_probs equal to that version's teacher-forced logprobs, and TRL's own ratio is 1 at
    step 1. The server's weights change with training (version 3's samples are far from version 1's policy)."""
    snapshots = VersionSnapshots(model_dir)
    args = config(tmp_path, server_url)
    worker, trainer = worker_and_trainer(LETTERS, model_dir, args, callbacks=[snapshots], buffer_size=64)
    trainer.add_callback(TrainedPolicyCall(worker))
    trainer.train()
    assert not worker._thread.is_alive()  # stopped by the trainer at the end of train()
    logs = [h for h in trainer.state.log_history if "ratio" in h]
    assert [h["step"] for h in logs] == [1, 2, 3]
    assert abs(logs[0]["ratio"] - 1.0) < 1e-4 and logs[0]["kl"] < 1e-4
    single_version = {g for call in worker.calls if call.started_version == call.ended_version
                      for g in range(call.first_group, call.first_group + worker.groups_per_call)}
    checked = {}
    for sample in worker.rollout_buffer.samples:
        assert len(sample.input_ids) == len(sample.completion_mask) == len(sample.old_log_probs)
        assert np.all(sample.old_log_probs[sample.completion_mask == 0] == 0.0)
        if sample.group_id in single_version and sample.model_version in snapshots.states:
            model = AutoModelForCausalLM.from_pretrained(model_dir)
            model.load_state_dict(snapshots.states[sample.model_version])
            assert sampled_gap(model, sample) < TOLERANCE
            checked[sample.model_version] = sample
    assert 1 in checked and max(checked) >= 2, sorted(checked)  # the first policy and a trained one
    initial = AutoModelForCausalLM.from_pretrained(model_dir)
    assert sampled_gap(initial, checked[max(checked)]) > 10 * TOLERANCE  # the server sampled from new weights
    assert trainer.weight_transfer.syncs == 4  # the first sync, then one per step


@pytest.mark.timeout(600)
def test_a_processor_eval_trains_asynchronously(model_dir, server_url, tmp_path):
    """SingleTurnRolloutProcessor runs unchanged inside the worker; its calls are generated on the synced server."""
    args = config(tmp_path, server_url, max_steps=2)
    worker, trainer = worker_and_trainer(ARITHMETIC, model_dir, args)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "ratio" in h]
    assert [h["step"] for h in logs] == [1, 2] and abs(logs[0]["ratio"] - 1.0) < 1e-4
    assert all(s.completion_mask[-1] == 1 for s in worker.rollout_buffer.samples)  # single turns: all sampled
    assert {h.get("ep_trl/failed_fraction") for h in trainer.state.log_history} <= {0.0, None}


class SlowSteps(TrainerCallback):
    """Artificially slow training: the worker runs ahead and its samples grow stale."""

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(3.0)


@pytest.mark.timeout(600)
def test_slow_training_makes_the_worker_drop_stale_samples_and_count_them(model_dir, server_url, letters_server,
                                                                           tmp_path):
    args = config(tmp_path, server_url, max_steps=3, max_staleness=0)
    worker, trainer = worker_and_trainer(LETTERS, model_dir, args, callbacks=[SlowSteps()], buffer_size=8)
    trainer.train()
    dropped = sum(h.get("ep_trl/worker/dropped_stale_total", 0.0) for h in trainer.state.log_history)
    dropped_by_trl = sum(h.get("sample/dropped_stale_total", 0.0) for h in trainer.state.log_history)
    assert dropped + dropped_by_trl > 0 and sum(c.dropped_stale for c in worker.calls) == dropped
    assert all(call.ended_version >= call.started_version for call in worker.calls)


class PushedTensors(DiskWeightTransfer):
    """DiskWeightTransfer that keeps a copy of every set of tensors it sends."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sent = []

    def send_weights(self, iterator):
        tensors = dict(iterator)
        self.sent.append({name: tensor.detach().clone() for name, tensor in tensors.items()})
        super().send_weights(iter(tensors.items()))


@pytest.mark.timeout(600)
def test_a_lora_policy_trains_asynchronously_with_its_adapter_merged_into_the_pushed_weights(model_dir, server_url,
                                                                                             letters_server, tmp_path):
    """AsyncGRPOTrainer merges a peft adapter into the weights it streams and unmerges it afterwards, so
    DiskWeightTransfer pushes base + B·A·scaling under the checkpoint's names (what train_browsergym_trl.py --async
    --lora-r relies on)."""
    from peft import LoraConfig
    from safetensors.torch import load_file

    args = config(tmp_path, server_url, max_steps=2, learning_rate=3e-2)
    worker = EvalRolloutWorker(LETTERS, args=args, processing_class=AutoTokenizer.from_pretrained(model_dir),
                               log_rollouts=False)
    transfer = PushedTensors(server_url, model_dir)
    trainer = CPUAsyncGRPOTrainer(str(model_dir), args=args, train_dataset=dataset_from_eval(LETTERS, repeat=8),
                                  rollout_worker=worker, weight_transfer=transfer,
                                  peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                         task_type="CAUSAL_LM"))
    trainer.train()
    assert [h["step"] for h in trainer.state.log_history if "ratio" in h] == [1, 2]
    base = load_file(str(model_dir / "model.safetensors"))
    assert len(transfer.sent) == 3 and set(transfer.sent[-1]) == set(base)  # the checkpoint's names, no lora_*
    name = "model.layers.0.self_attn.q_proj.weight"
    layer = trainer.model.base_model.model.model.layers[0].self_attn.q_proj
    delta = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight) * layer.scaling["default"]
    assert torch.equal(transfer.sent[0][name], base[name])  # the first sync: the initial policy
    assert (transfer.sent[-1][name] - (base[name] + delta)).abs().max() < 1e-6
    assert delta.abs().max() > 1e-3 and not layer.merged  # trained, and training went on on the adapter


def idle_worker(url, tmp_path, **options):
    tokenizer = AutoTokenizer.from_pretrained(options.pop("model_dir"))
    args = config(tmp_path, url)
    return EvalRolloutWorker(LETTERS, args=args, processing_class=tokenizer, log_rollouts=False, **options)


def wait_until(condition, timeout_s):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.mark.timeout(120)
def test_the_buffer_bounds_the_worker(tiny_model_dir, letters_server, tmp_path):
    """No trainer drains the buffer: the worker fills it and waits (no unbounded growth), and stays healthy."""
    with FaultyVLLMServer() as server:
        worker = idle_worker(server.url, tmp_path, model_dir=tiny_model_dir, buffer_size=4)
        worker.start()
        try:
            wait_until(lambda: worker.rollout_buffer.full(), 60)
            calls = len(worker.calls)
            time.sleep(2.0)
            assert worker.rollout_buffer.qsize() == 4 and len(worker.calls) <= calls + 1
            worker.check_health(1.0)  # waiting for room counts as alive
        finally:
            worker.stop()
    assert not worker._thread.is_alive()


@pytest.mark.timeout(120)
def test_check_health_raises_what_ended_the_worker(tiny_model_dir, letters_server, tmp_path):
    """A vLLM server gone for good ends the worker; the trainer's next check raises it, naming the request."""
    with FaultyVLLMServer(default=("status", 500)) as server:
        worker = idle_worker(server.url, tmp_path, model_dir=tiny_model_dir,
                             vllm=VLLMOptions(max_retries=0, request_timeout_s=5))
        worker.start()
        try:
            wait_until(lambda: worker._error is not None, 60)
            with pytest.raises(RolloutWorkerError, match=f"stopped: GenerationError: .*{server.url}/v1/completions"):
                worker.check_health(300.0)
        finally:
            worker.stop()


@pytest.mark.timeout(120)
def test_check_health_raises_when_the_worker_produces_nothing(tiny_model_dir, letters_server, tmp_path):
    with FaultyVLLMServer(default="hang") as server:
        worker = idle_worker(server.url, tmp_path, model_dir=tiny_model_dir, vllm=VLLMOptions(request_timeout_s=60))
        worker.start()
        try:
            time.sleep(1.5)
            with pytest.raises(RolloutWorkerError, match=r"produced nothing for \d+ s \(more than 1 s\).*heartbeat_stale_after_s"):
                worker.check_health(1.0)
        finally:
            started = time.monotonic()
            worker.stop()
            assert time.monotonic() - started < 30  # the hanging call is cancelled, not waited for


def test_sampling_that_the_trainer_does_not_assume_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match=r"top_p=0.9.*leave top_p at 1.0"):
        EvalRolloutWorker(LETTERS, args=config(tmp_path, "http://127.0.0.1:1", top_p=0.9),
                          processing_class=AutoTokenizer.from_pretrained(tiny_model_dir))
    with pytest.raises(ConfigError, match="bf16=False"):
        CPUAsyncGRPOTrainer(str(tiny_model_dir), args=config(tmp_path, "http://127.0.0.1:1", bf16=True))
