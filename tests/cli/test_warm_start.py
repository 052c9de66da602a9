"""``ep-trl train --warm-start``: the loss mask is exactly the assistant turns, a warm start teaches the tiny model the
tool-call format it did not write before, the run starts GRPO from the warm-started weights and records the warm
start, and bad demonstrations are refused before anything starts."""

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from ep_trl.cli import train
from ep_trl.cli.demonstrations import read_demonstrations
from ep_trl.cli.warm_start import (
    WarmStartSettings,
    examples,
    load_processing_class,
    render_example,
    train_on,
)
from tests.support.references import decoded_text

if TYPE_CHECKING:
    from collections.abc import Iterable

    from ep_trl.trajectory.template import ChatTemplate
    from ep_trl.trajectory.types import ProcessingClass

ROOT = Path(__file__).resolve().parents[2]
LAKE = f"{ROOT / 'tests' / 'evals' / 'eval_frozen_lake.py'}::test_frozen_lake"
MOVES = ("LEFT", "DOWN", "RIGHT", "UP")
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "move",
            "description": "Move.",
            "parameters": {"type": "object", "properties": {"action": {"type": "string"}}, "required": ["action"]},
        },
    }
]


def call(action: str, k: int, as_string: bool = True) -> dict:
    arguments = {"action": action}
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": f"c{k}",
                "type": "function",
                "function": {"name": "move", "arguments": json.dumps(arguments) if as_string else arguments},
            }
        ],
    }


def conversation(actions: "Iterable[str]", as_string: bool = True) -> list[dict]:
    messages = [{"role": "system", "content": "Play."}, {"role": "user", "content": "Go."}]
    for k, action in enumerate(actions):
        messages += [call(action, k, as_string), {"role": "tool", "content": f"at {k}", "tool_call_id": f"c{k}"}]
    return messages[:-1]  # ends with the last call, as a recorded episode does


def write_lines(path: Path, lines: "Iterable[Any]") -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def template(model_dir: Path) -> "tuple[ProcessingClass, ChatTemplate, tuple[int, ...]]":
    from ep_trl.trajectory.template import ChatTemplate
    from ep_trl.trajectory.tokens import eos_token_ids

    processing_class = load_processing_class(str(model_dir))
    return processing_class, ChatTemplate(processing_class), eos_token_ids(processing_class, None)


def test_the_loss_mask_covers_exactly_the_assistant_turns(qwen_template_model_dir: Path, tmp_path: Path) -> None:
    """The trained ids are each tool call as the template writes it plus its end-of-turn token, nothing else; the ids
    are the whole conversation as the template renders it; arguments as a JSON string or an object are the same."""
    path = write_lines(
        tmp_path / "demos.jsonl",
        [
            {"messages": conversation(["LEFT", "UP"]), "tools": TOOLS},
            {"messages": conversation(["LEFT", "UP"], as_string=False), "tools": TOOLS},
        ],
    )
    demonstrations = read_demonstrations(path)
    processing_class, chat, stops = template(qwen_template_model_dir)
    tokenizer = chat.tokenizer
    example = render_example(chat, demonstrations.lines[0], stops, max_completion_length=10_000)
    assert example == render_example(chat, demonstrations.lines[1], stops, max_completion_length=10_000)
    runs: list[tuple[bool, list[int]]] = []
    for token, trained in zip(example.ids, example.trained):
        if not runs or runs[-1][0] != trained:
            runs.append((trained, []))
        runs[-1][1].append(token)
    trained_runs = [ids for trained, ids in runs if trained]
    expected = [
        tokenizer.encode(
            "<tool_call>\n" + json.dumps({"name": "move", "arguments": {"action": a}}) + "\n</tool_call><|im_end|>",
            add_special_tokens=False,
        )
        for a in ("LEFT", "UP")
    ]
    assert trained_runs == expected
    assert example.trained_tokens == sum(map(len, expected))
    whole = processing_class.apply_chat_template(
        conversation(["LEFT", "UP"], as_string=False), tools=list(TOOLS), tokenize=False
    )
    assert tokenizer.decode(list(example.ids), skip_special_tokens=False) == whole
    # the untrained runs are the prompts: the first ends with the generation prompt, the second is the tool result
    untrained = [decoded_text(tokenizer, ids) for trained, ids in runs if not trained]
    assert untrained[0].endswith("<|im_start|>assistant\n") and "at 0" in untrained[1]
    assert untrained[-1] == "\n"  # after the last turn's end-of-turn token: template text, not trained
    # the default length limit: the first prompt plus max_completion_length tokens
    cut = render_example(chat, demonstrations.lines[0], stops, max_completion_length=5)
    assert len(cut.ids) == len(runs[0][1]) + 5 and cut.trained_tokens == 5
    assert cut.cut == example.trained_tokens - 5


def test_a_warm_start_teaches_the_tiny_model_the_tool_call_format(
    qwen_template_model_dir: Path, tmp_path: Path
) -> None:
    """Before: the tiny model's greedy first turn is no tool call. After a few epochs on demonstrations of random
    moves: a parsable call of the offered tool with one of the moves, and the loss on the demonstrations fell."""
    import torch
    from transformers import AutoModelForCausalLM

    from ep_trl.capture.parsing import ToolCallParser

    rng = random.Random(0)
    lines = [{"messages": conversation([rng.choice(MOVES)]), "tools": TOOLS} for _ in range(4)]
    demonstrations = read_demonstrations(write_lines(tmp_path / "demos.jsonl", lines))
    processing_class, chat, stops = template(qwen_template_model_dir)
    parser = ToolCallParser(chat.tokenizer)
    prompt = chat.prompt_ids(conversation(["LEFT"])[:2], TOOLS)  # the system and user messages
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(qwen_template_model_dir, dtype=torch.float32)

    def first_turn() -> dict:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]),
                max_new_tokens=100,
                do_sample=False,
                eos_token_id=list(stops),
                pad_token_id=chat.tokenizer.pad_token_id,
            )
        return parser(out[0, len(prompt) :].tolist(), prompt, TOOLS)

    assert not first_turn().get("tool_calls")
    settings = WarmStartSettings(epochs=40, learning_rate=3e-3, batch_size=1, max_completion_length=10_000)
    made = examples(processing_class, demonstrations, settings, None, stops)
    losses = train_on(model, made, settings, int(chat.tokenizer.pad_token_id), "cpu")
    assert losses[-1] < 0.2 * losses[0], losses
    calls = first_turn().get("tool_calls")
    assert calls and calls[0]["function"]["name"] == "move", calls
    assert calls[0]["function"]["arguments"]["action"] in MOVES, calls


#: An eval that offers no tools: the refusals of a template for the demonstrations' own sake (with the FrozenLake eval,
#: a template without a tool-call format is refused earlier, for the eval's tools: tests/cli/test_train.py).
NO_TOOLS = f"{ROOT / 'tests' / 'evals' / 'eval_single_turn.py'}::test_single_turn"


def refusal(tmp_path: Path, capsys: pytest.CaptureFixture[str], *flags: str, env_path: str = LAKE) -> str:
    with pytest.raises(SystemExit) as exited:
        train.main([env_path, "--output-dir", str(tmp_path / "run"), *flags])
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "content, wanted",
    [
        (None, "no such file; record one with `python -m ep_trl.devtools.record_demonstrations"),
        ("", "holds no demonstration"),
        ("{not json\n", "line 1: not JSON"),
        ('{"messages": []}\n', 'line 1: no "messages" list'),
        (
            json.dumps({"messages": [{"role": "system", "content": "Play."}, {"role": "user", "content": "Go."}]})
            + "\n",
            "line 1: no assistant turn, so nothing to train on",
        ),
        (
            json.dumps({"messages": conversation(["LEFT"])})
            + "\n"
            + json.dumps(
                {
                    "messages": [
                        {"role": "user", "content": "Go."},
                        {"role": "assistant", "tool_calls": [{"function": {"name": "move", "arguments": "{LEFT"}}]},
                    ]
                }
            )
            + "\n",
            "line 2, message 1: tool call 'move' has arguments '{LEFT', which are not JSON",
        ),
        (json.dumps({"messages": conversation(["LEFT"]), "tools": {"move": 1}}) + "\n", '"tools" must be a list'),
    ],
)
def test_bad_demonstrations_are_refused_before_anything_starts(
    content: str | None, wanted: str, qwen_template_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "demos.jsonl"
    if content is not None:
        path.write_text(content)
    err = refusal(tmp_path, capsys, "--model", str(qwen_template_model_dir), "--warm-start", str(path))
    assert wanted in err, err
    assert not (tmp_path / "run").exists()  # nothing started


def test_warm_start_settings_without_warm_start_and_with_screenshots_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], qwen_template_model_dir: Path
) -> None:
    err = refusal(tmp_path, capsys, "--model", str(qwen_template_model_dir), "--warm-start-epochs", "3")
    assert "--warm-start-epochs set the warm start: add --warm-start DEMOS.jsonl" in err, err
    path = write_lines(tmp_path / "demos.jsonl", [{"messages": conversation(["LEFT"]), "tools": TOOLS}])
    err = refusal(
        tmp_path, capsys, "--model", str(qwen_template_model_dir), "--warm-start", str(path), "--warm-start-epochs", "0"
    )
    assert "--warm-start-epochs 0: give 1 or more" in err, err
    err = refusal(tmp_path, capsys, "--model", str(qwen_template_model_dir), "--warm-start", str(path), "--screenshots")
    assert "--warm-start trains a text model on text demonstrations" in err, err


def test_a_template_that_rewrites_earlier_turns_is_refused(
    qwen_template_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A template that writes the last assistant turn differently from earlier ones (as templates that drop earlier
    reasoning do) leaves no turn's tokens to find: refused at start, naming the turn."""
    import shutil

    from transformers import AutoTokenizer

    model = tmp_path / "model"
    shutil.copytree(qwen_template_model_dir, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' and not loop.last %}(earlier)"
        "{% else %}{{ m.content }}{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tokenizer.save_pretrained(model)
    lines = [
        {
            "messages": [
                {"role": "user", "content": "Go."},
                {"role": "assistant", "content": "LEFT"},
                {"role": "user", "content": "Again."},
                {"role": "assistant", "content": "UP"},
            ]
        }
    ]
    err = refusal(
        tmp_path,
        capsys,
        "--model",
        str(model),
        "--warm-start",
        str(write_lines(tmp_path / "demos.jsonl", lines)),
        env_path=NO_TOOLS,
    )
    assert (
        "line 1: the chat template renders the conversation up to message 3 (an assistant turn) so that what came "
        "before it reads differently"
    ) in err, err
    assert "renders earlier turns the same whatever follows" in err, err


def test_a_template_without_a_tool_call_format_is_refused(
    tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tiny model's own template renders no tool calls: a demonstration of calls would train an empty turn."""
    path = write_lines(tmp_path / "demos.jsonl", [{"messages": conversation(["LEFT"]), "tools": TOOLS}])
    err = refusal(tmp_path, capsys, "--model", str(tiny_model_dir), "--warm-start", str(path), env_path=NO_TOOLS)
    assert "line 1: message 2 calls move, and the chat template leaves the call out of the turn it renders" in err, err
    assert "Give the model a chat template with a tool-call format" in err, err


def test_a_model_without_a_chat_template_is_refused(
    qwen_template_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import shutil

    model = tmp_path / "model"
    shutil.copytree(qwen_template_model_dir, model)
    for name in ("chat_template.jinja", "chat_template.json"):
        (model / name).unlink(missing_ok=True)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    path = write_lines(tmp_path / "demos.jsonl", [{"messages": conversation(["LEFT"]), "tools": TOOLS}])
    err = refusal(tmp_path, capsys, "--model", str(model), "--warm-start", str(path), env_path=NO_TOOLS)
    assert (
        "--warm-start renders the demonstrations with the model's chat template: The trainer's processing class "
        "has no chat template" in err
    ), err


@pytest.mark.timeout(300)
def test_train_with_a_warm_start_starts_grpo_from_the_warm_started_model(
    qwen_template_model_dir: Path, tmp_path: Path
) -> None:
    """``ep-trl train --warm-start`` on a FrozenLake eval (MCP-gym, eval-protocol's own server), in-process, 1 step:
    the warm start runs first, GRPO starts from its saved model, and result.json records it, its seconds inside the
    training time."""
    rng = random.Random(1)
    lines = [{"messages": conversation([rng.choice(MOVES) for _ in range(2)]), "tools": TOOLS} for _ in range(3)]
    demos = write_lines(tmp_path / "demos.jsonl", lines)
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "ep_trl.cli",
            "train",
            LAKE,
            "--model",
            str(qwen_template_model_dir),
            "--warm-start",
            str(demos),
            "--warm-start-epochs",
            "2",
            "--max-steps",
            "1",
            "--per-device-train-batch-size",
            "2",
            "--num-generations",
            "2",
            "--max-completion-length",
            "24",
            "--output-dir",
            "run",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "warm start: 3 demonstrations from" in out and "GRPO starts from run/warm-start" in out, out
    assert out.index("warm start:") < out.index("step 1/1"), out
    folder = tmp_path / "run"
    assert (folder / "warm-start" / "model.safetensors").is_file()
    assert (folder / "warm-start" / "tokenizer_config.json").is_file()
    assert "model: run/warm-start" in (folder / "config.yaml").read_text()
    result = json.loads((folder / "result.json").read_text())
    warm = result["warm_start"]
    assert warm["file"] == str(demos) and warm["lines"] == 3 and warm["epochs"] == 2
    assert warm["tokens_trained"] > 0 and warm["seconds"] > 0 and warm["model_dir"] == "run/warm-start"
    assert result["steps"] == 1 and result["train_s"] >= warm["seconds"]


def greedy_on_server(url: str, prompt: list[int], tokens: int) -> list[int]:
    import urllib.request

    body = {
        "model": served_model(url),
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    request = urllib.request.Request(
        f"{url}/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - the local test server
        return list(json.loads(response.read())["choices"][0]["token_ids"])


def served_model(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as response:  # noqa: S310 - the local test server
        return json.loads(response.read())["data"][0]["id"]


@pytest.mark.timeout(300)
def test_a_vllm_server_the_run_generates_on_is_given_the_warm_started_weights(
    sharp_model_dir: Path, shared_vllm_url: str, tmp_path: Path
) -> None:
    """With --vllm-server-url the warm start loads its weights into the server before the held-out 'before' score
    and training: the server's greedy reply is then the warm-started model's, not the one it served before."""
    import torch
    from transformers import AutoModelForCausalLM

    from ep_trl.cli.warm_start import push_weights, warm_start

    lines = [
        {"messages": [{"role": "user", "content": f"Say it {k}."}, {"role": "assistant", "content": "zebra zebra"}]}
        for k in range(4)
    ]
    demonstrations = read_demonstrations(write_lines(tmp_path / "demos.jsonl", lines))
    processing_class, chat, _ = template(sharp_model_dir)
    prompt = chat.prompt_ids([{"role": "user", "content": "Say it 9."}])
    base = AutoModelForCausalLM.from_pretrained(sharp_model_dir, dtype=torch.float32)
    push_weights(base, shared_vllm_url)  # the server holds the base model, whatever an earlier test pushed
    try:
        before = greedy_on_server(shared_vllm_url, prompt, 6)
        report = warm_start(
            str(sharp_model_dir),
            demonstrations,
            tmp_path / "warm",
            WarmStartSettings(epochs=20, learning_rate=3e-3, batch_size=1),
            server_url=shared_vllm_url,
        )
        after = greedy_on_server(shared_vllm_url, prompt, 6)
        warm = AutoModelForCausalLM.from_pretrained(report.model_dir, dtype=torch.float32)
        with torch.no_grad():
            local = warm.generate(
                torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=chat.tokenizer.pad_token_id
            )[0, len(prompt) :].tolist()
    finally:
        push_weights(base, shared_vllm_url)  # the session's server back on the base model
    assert decoded_text(chat.tokenizer, after).startswith("zebra"), decoded_text(chat.tokenizer, after)
    assert after == local[: len(after)] and before != after
    assert report.loss_last_epoch < report.loss_first_epoch and report.seconds > 0
