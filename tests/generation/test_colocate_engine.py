"""The colocated engine as ep_trl takes it from a GRPOTrainer (``generation.colocate.trainer_engine``), without vLLM:
where TRL 1.16 keeps it, the tensor-parallel refusal, and sleep mode's wake and sleep around each call."""

from types import SimpleNamespace
from typing import TYPE_CHECKING, cast

import pytest
from trl import GRPOConfig

from ep_trl import ConfigError
from ep_trl.generation.colocate import trainer_engine

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from trl import GRPOTrainer


def test_the_engine_is_the_one_grpo_trainer_keeps(tmp_path: "Path") -> None:
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, use_vllm=True, vllm_mode="colocate", report_to=[])
    engine = object()
    found = trainer_engine(cast("GRPOTrainer", SimpleNamespace(args=args, vllm_generation=SimpleNamespace(llm=engine))))
    assert found.llm is engine and found.wake is None and found.sleep is None


def test_a_tensor_parallel_colocated_engine_is_refused_naming_the_setting(tmp_path: "Path") -> None:
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_tensor_parallel_size=2,
        report_to=[],
    )
    with pytest.raises(
        ConfigError, match="vllm_tensor_parallel_size=2.*vllm_tensor_parallel_size=1.*vllm_mode='server'"
    ):
        trainer_engine(cast("GRPOTrainer", SimpleNamespace(args=args, vllm_generation=SimpleNamespace(llm=object()))))


def test_a_sleeping_colocated_engine_is_woken_for_each_call_and_put_back_to_sleep(tmp_path: "Path") -> None:
    """As TRL's own generation does around llm.generate: weights pushed again when level-2 sleep dropped them."""
    calls: list[tuple[object, ...]] = []

    class Engine:  # stands in for vllm.LLM, which this Python does not have; records what ep_trl asks of it
        def wake_up(self, tags: "Sequence[str]") -> None:
            calls.append(("wake_up", tuple(tags)))

        def sleep(self, level: int) -> None:
            calls.append(("sleep", level))

    generation = SimpleNamespace(
        llm=Engine(), _llm_weights_sleeping=True, sync_weights=lambda: calls.append(("sync_weights",))
    )
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_enable_sleep_mode=True,
        report_to=[],
    )
    engine = trainer_engine(cast("GRPOTrainer", SimpleNamespace(args=args, vllm_generation=generation)))
    assert engine.wake is not None and engine.sleep is not None
    engine.wake()
    engine.sleep()
    assert generation._llm_weights_sleeping is True  # what TRL's next sync or generate reads
    generation._llm_weights_sleeping = False  # TRL synced this step (it wakes the weights to do so)
    engine.wake()
    assert calls == [("sync_weights",), ("wake_up", ("kv_cache",)), ("sleep", 2), ("wake_up", ("kv_cache",))]
