"""Asking a vLLM server what it serves (``generation.probe``), against a server with injected faults
(FaultyVLLMServer); the backend's own construction probe is in tests/generation/test_vllm.py."""

import time

import pytest

from ep_trl import GenerationError
from ep_trl.generation import probe
from tests.support.faulty_vllm import FaultyVLLMServer


@pytest.mark.timeout(30)
def test_the_list_of_served_models_is_retried_on_a_transient_error_and_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """EvalRolloutWorker.update_model_version asks GET /v1/models inside TRL's weight sync: a server briefly busy
    (a 503, a dropped connection, no answer within the timeout) must not end training; one gone for good still
    does, within the retries' bound, and a 404 is not retried."""
    monkeypatch.setattr(probe.RetryPolicy, "delay", lambda self, attempt: 0.05)
    with FaultyVLLMServer(models_plan=[("status", 503), "drop", "hang"], adapters=["trl-policy-v1"]) as server:
        started = time.monotonic()
        assert probe.served_models(server.url, timeout_s=1.0) == ["faulty-model", "trl-policy-v1"]
        assert server.models_requests == 4 and time.monotonic() - started < 5
    with FaultyVLLMServer(models_plan=[("status", 503)] * 4) as server:
        with pytest.raises(GenerationError, match=r"/v1/models failed 4 times .*HTTP 503"):
            probe.served_models(server.url, timeout_s=1.0)
    with FaultyVLLMServer(models_plan=[("status", 404)]) as server:
        with pytest.raises(GenerationError, match="gave no list of models"):
            probe.served_models(server.url, timeout_s=1.0)
        assert server.models_requests == 1
