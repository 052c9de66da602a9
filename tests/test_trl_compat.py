"""The TRL seam: signatures, sampling settings and guarded reads of trainer internals."""

import pytest
from transformers import AutoTokenizer
from trl import GRPOConfig

from ep_trl import VersionError
from ep_trl.trl_compat import TrainerView, view_from_call


def test_sampling_comes_from_the_grpo_config_and_only_the_trainer_signature_is_taken(tiny_model_dir, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, temperature=0.7, top_p=0.9, top_k=5, report_to=[])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    sampling = TrainerView(args, tok, None).sampling()
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.7, 0.9, 5)
    # the three-argument (prompts, args, processing_class) signature of TRL < 0.26 is outside the supported range
    with pytest.raises(TypeError, match="prompts, trainer"):
        view_from_call((args, tok))


def test_vllm_server_url_from_config_and_colocate_refused(tmp_path):
    server = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, use_vllm=True, vllm_mode="server",
                        vllm_server_host="127.0.0.9", vllm_server_port=8123, report_to=[])
    assert TrainerView(server, None, None).vllm_server_url() == "http://127.0.0.9:8123"
    colocate = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, use_vllm=True, vllm_mode="colocate", report_to=[])
    with pytest.raises(VersionError, match="vllm_mode='server'"):
        TrainerView(colocate, None, None).vllm_server_url()
    plain = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert TrainerView(plain, None, None).vllm_server_url() is None


def test_metrics_reach_the_trainers_metric_store(tiny_model_dir, tmp_path):
    """GRPOTrainer keeps logged metrics in the private ``_metrics``; fail loudly if TRL renames it."""
    from ep_trl import create_openenv_vllm_rollout_func
    from tests.support.trainers import make_trainer

    rollout = create_openenv_vllm_rollout_func("tests.evals.eval_letters")
    trainer = make_trainer(tiny_model_dir, tmp_path, rollout)
    rollout.close()
    assert isinstance(trainer._metrics, dict) and "train" in trainer._metrics, "TRL renamed GRPOTrainer._metrics"
    view = view_from_call((trainer,))
    view.record_metrics({"ep_trl/x": 1.5})
    assert trainer._metrics["train"]["ep_trl/x"] == [1.5]
    TrainerView(trainer.args, None, None).record_metrics({"ep_trl/x": 2.0})  # no trainer: nothing to record into
