"""Backend choice (``generation.choice``): a backend is one module named in ``BACKENDS`` whose ``build(offer)`` makes a
full ``Generator``, so a new backend is one module plus one line (issue 41)."""

import inspect
from importlib import import_module
from typing import Any, get_args

from ep_trl.generation import BackendOffer, Generator
from ep_trl.generation.choice import BACKENDS, pick
from ep_trl.options import Backend, VLLMOptions

#: Every member of the protocol, read from it (``generate_as`` included since issue 41).
PROTOCOL = {name for name in vars(Generator) if not name.startswith("_")}


def test_every_backend_module_builds_a_generator_with_the_whole_protocol() -> None:
    assert {"name", "generate", "generate_as", "begin_call", "end_call", "aclose", "failure"} <= PROTOCOL
    for name, module_name in BACKENDS.items():
        module = import_module(f"ep_trl.generation.{module_name}")
        built = inspect.signature(module.build).return_annotation
        cls = getattr(module, built) if isinstance(built, str) else built
        missing = {member for member in PROTOCOL if not hasattr(cls, member)}
        assert missing == set(), f"backend {name!r} ({cls.__name__}) lacks {sorted(missing)}"


def test_every_backend_a_user_names_is_one_choice_knows() -> None:
    assert set(get_args(Backend)) - {"auto"} <= set(BACKENDS)


def offer(**kwargs: object) -> BackendOffer:
    fields: dict[str, Any] = dict(
        vllm_base_url=None,
        options=VLLMOptions(),
        max_concurrent_rollouts=4,
        colocated_trainer=None,
        server=None,
        model_provider=None,
        processing_class=None,
    )
    return BackendOffer(**{**fields, **kwargs})


def test_the_pick_follows_what_the_caller_offers() -> None:
    engine_owner = object()
    assert pick("auto", offer(colocated_trainer=engine_owner)) == "vllm-colocate"
    assert pick("vllm", offer(colocated_trainer=engine_owner)) == "vllm-colocate"
    assert pick("trainer", offer(colocated_trainer=engine_owner)) == "trainer"
    assert pick("auto", offer(vllm_base_url="http://127.0.0.1:1")) == "vllm"
    assert pick("auto", offer()) == "trainer"
    assert pick("vllm", offer()) == "vllm"  # its build then names the missing server
