"""The TRL seam: signatures, sampling settings and guarded reads of trainer internals."""

from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer
from trl import GRPOConfig

from ep_trl import ConfigError, trl_compat
from ep_trl.trl_compat import TrainerView, view_from_call


def test_sampling_comes_from_the_grpo_config_and_only_the_trainer_signature_is_taken(tiny_model_dir, tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, temperature=0.7, top_p=0.9, top_k=5, report_to=[])
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    sampling = TrainerView(args, tok, None).sampling()
    assert (sampling.temperature, sampling.top_p, sampling.top_k) == (0.7, 0.9, 5)
    # the three-argument (prompts, args, processing_class) signature of TRL < 0.26 is outside the supported range
    with pytest.raises(TypeError, match="prompts, trainer"):
        view_from_call((args, tok))


def test_the_trainers_vllm_mode_picks_its_server_or_its_colocated_engine(tmp_path):
    server = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, use_vllm=True, vllm_mode="server",
                        vllm_server_host="127.0.0.9", vllm_server_port=8123, report_to=[])
    assert TrainerView(server, None, None).vllm_server_url() == "http://127.0.0.9:8123"
    assert TrainerView(server, None, None).colocated_engine() is None
    colocate = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, use_vllm=True, vllm_mode="colocate", report_to=[])
    assert TrainerView(colocate, None, None).vllm_server_url() is None  # before: refused with a VersionError
    engine = object()
    trainer = SimpleNamespace(vllm_generation=SimpleNamespace(llm=engine))  # where GRPOTrainer 1.16 keeps it
    found = TrainerView(colocate, None, trainer).colocated_engine()
    assert found.llm is engine and found.wake is None and found.sleep is None
    plain = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[])
    assert TrainerView(plain, None, None).vllm_server_url() is None
    assert TrainerView(plain, None, None).colocated_engine() is None


def test_a_tensor_parallel_colocated_engine_is_refused_naming_the_setting(tmp_path):
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, use_vllm=True, vllm_mode="colocate",
                      vllm_tensor_parallel_size=2, report_to=[])
    with pytest.raises(ConfigError, match="vllm_tensor_parallel_size=2.*vllm_tensor_parallel_size=1.*vllm_mode='server'"):
        TrainerView(args, None, SimpleNamespace(vllm_generation=SimpleNamespace(llm=object()))).colocated_engine()


def test_a_sleeping_colocated_engine_is_woken_for_each_call_and_put_back_to_sleep(tmp_path):
    """As TRL's own generation does around llm.generate: weights pushed again when level-2 sleep dropped them."""
    calls = []

    class Engine:  # stands in for vllm.LLM, which this Python does not have; records what ep_trl asks of it
        def wake_up(self, tags):
            calls.append(("wake_up", tuple(tags)))

        def sleep(self, level):
            calls.append(("sleep", level))

    generation = SimpleNamespace(llm=Engine(), _llm_weights_sleeping=True,
                                 sync_weights=lambda: calls.append(("sync_weights",)))
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, use_vllm=True, vllm_mode="colocate",
                      vllm_enable_sleep_mode=True, report_to=[])
    engine = TrainerView(args, None, SimpleNamespace(vllm_generation=generation)).colocated_engine()
    engine.wake()
    engine.sleep()
    assert generation._llm_weights_sleeping is True  # what TRL's next sync or generate reads
    generation._llm_weights_sleeping = False  # TRL synced this step (it wakes the weights to do so)
    engine.wake()
    assert calls == [("sync_weights",), ("wake_up", ("kv_cache",)), ("sleep", 2), ("wake_up", ("kv_cache",))]


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


def test_every_path_past_trls_stable_api_accepts_the_trl_it_is_tested_with():
    for path in trl_compat.TESTED_TRL:
        assert str(trl_compat.require_tested(path, "this path")).startswith("1.16.")


def test_a_path_past_trls_stable_api_refuses_an_untested_trl_when_it_is_built(monkeypatch):
    """TRL 1.18 removed the experimental async modules these paths import: a user on it is told at construction which
    TRL the path is tested with and how to install it, not shown an ImportError from deep inside TRL."""
    from packaging.version import Version

    from ep_trl.async_cpu import CPUAsyncGRPOTrainer
    from ep_trl.errors import VersionError
    from ep_trl.rollout_worker import EvalRolloutWorker
    from ep_trl.trl_images import RolloutImagesGRPOTrainer
    from ep_trl.vllm_weight_sync import CPUColocateGRPOTrainer, DiskSyncGRPOTrainer

    monkeypatch.setattr(trl_compat, "installed_version", lambda name: Version("1.18.0"))  # a TRL not installable here
    builds = {
        "EvalRolloutWorker": lambda: EvalRolloutWorker("tests.evals.eval_letters", args=None, processing_class=None),
        "CPUAsyncGRPOTrainer": lambda: CPUAsyncGRPOTrainer("model"),
        "DiskSyncGRPOTrainer": lambda: DiskSyncGRPOTrainer(None, None, None),
        "CPUColocateGRPOTrainer": lambda: CPUColocateGRPOTrainer(None, None, None),
        "RolloutImagesGRPOTrainer": lambda: RolloutImagesGRPOTrainer(),
    }
    for who, build in builds.items():
        with pytest.raises(VersionError, match=rf"{who} is tested with TRL >=1.16,<1.17 only, and TRL 1\.18\.0 is "
                                               r"installed: .*pip install 'trl>=1.16,<1.17'.*"
                                               r"GRPOTrainer\(rollout_func=.*works with TRL >=1.16,<2"):
            build()
    assert str(trl_compat.check_version()).startswith("1.16.")  # the rollout_func path keeps the declared range
