"""The tiny model taught one tool-using conversation, so a real model (not a script) makes real tool calls.

``build_tool_model`` copies the tiny model, gives its tokenizer TRL's Qwen 2.5 chat template (tool calls in
``<tool_call>`` blocks, a format TRL's ``parse_response`` reads) and fine-tunes it until it reproduces
:func:`conversation` after the eval's messages: ``add(1, 2)``, ``add(3, 4)``, then the answer. Each turn is learned from
the exact ids it is later generated after (the rendered conversation so far), until every target token has a
loss under :data:`TARGET_LOSS` (probability over 0.99 at temperature 1, over 0.9999 at the tests' 0.5), so the
model samples the script with near certainty; its logprobs are whatever the trained weights give.

Given several ``answers``, the model learns the final turn as an even choice among them (their first tokens differ
and share the probability; every token after the first is learned as above), so the episodes of a group end with
different answers, which an eval scores differently: tests that train need rewards that differ within a group.

Cost: about 150 optimizer steps, 30 s on one core. It trains on one torch thread: with two threads, a second
CPU-bound process on a 2-core machine stalls torch's parallel regions (measured: the same 10 steps took 1.3 s
alone and up to 100 s beside another process; issue 16), one thread degrades only in proportion. The result is
cached on disk under :data:`CACHE` keyed by every input (model files, messages, tools, tool results, the recipe
and the torch/transformers versions), so a machine builds it once.
"""

import hashlib
import json
import math
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

#: (tool-call arguments of each turn, or the final answer); the tool results are what the calculator returns.
CALLS = ({"a": 1, "b": 2}, {"a": 3, "b": 4})
RESULTS = ("3", "7")
ANSWER = "10"
#: Final answers a model taught to vary its answer chooses among evenly: right, right but wordy, wrong (the
#: calculator eval scores them 1.0, 0.5, 0.0).
VARIED_ANSWERS = (ANSWER, "The answer is 10", "7")


def tool_call_text(arguments: Mapping[str, int]) -> str:
    return "<tool_call>\n" + json.dumps({"name": "add", "arguments": dict(arguments)}) + "\n</tool_call>"


def conversation(messages: Sequence[Mapping[str, Any]], tool_result: Any = str) -> list[dict[str, Any]]:
    """The whole scripted conversation after ``messages``: call, result, call, result, answer."""
    out = [dict(m) for m in messages]
    for k, (arguments, result) in enumerate(zip(CALLS, RESULTS)):
        out.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": f"c{k}", "type": "function", "function": {"name": "add", "arguments": dict(arguments)}}
                ],
            }
        )
        out.append({"role": "tool", "content": tool_result(result), "tool_call_id": f"c{k}"})
    out.append({"role": "assistant", "content": ANSWER})
    return out


def mcp_tools(server_url: str) -> list[dict[str, Any]]:
    """The tools of the MCP server at ``server_url`` as AgentRolloutProcessor offers them to the model (the name and
    parameters of each; it drops descriptions), so the model is taught the prompt it will be given."""
    import asyncio

    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    async def listed() -> list[Any]:
        async with streamable_http_client(f"{server_url}/mcp") as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                return (await session.list_tools()).tools

    return [
        {"type": "function", "function": {"name": t.name, "parameters": t.inputSchema}} for t in asyncio.run(listed())
    ]


#: The recipe: Adam at this learning rate until every target token's loss is under TARGET_LOSS (a choice among k
#: answers: within CHOICE_TOLERANCE of log k, each answer's share within 5% of 1/k), at most MAX_STEPS.
LEARNING_RATE = 3e-3
TARGET_LOSS = 0.01
CHOICE_TOLERANCE = 0.05
MAX_STEPS = 400

#: Built tool models, one directory per key (git-ignored).
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "tool-models"


def build_tool_model(
    tiny_model_dir: Path,
    out_dir: Path,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    tool_result: Any = str,
    answers: Sequence[str] = (ANSWER,),
) -> Path:
    """A copy of the tiny model at ``out_dir`` that plays :func:`conversation` after ``messages`` with ``tools``,
    ending with one of ``answers`` chosen evenly (built once per machine: see :data:`CACHE`)."""
    full = conversation(messages, tool_result)
    key = _cache_key(tiny_model_dir, full, tools, answers)
    cached = CACHE / key
    if not (cached / "done").exists():
        building = CACHE / f"{key}.building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        _train(tiny_model_dir, building, full, tools, answers)
        (building / "done").write_text("ok")
        shutil.rmtree(cached, ignore_errors=True)
        building.rename(cached)
    shutil.copytree(cached, out_dir, dirs_exist_ok=True)
    return out_dir


def _cache_key(
    tiny_model_dir: Path, full: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]], answers: Sequence[str]
) -> str:
    import transformers

    digest = hashlib.sha256()
    for path in sorted(p for p in Path(tiny_model_dir).iterdir() if p.is_file()):
        digest.update(path.name.encode() + path.read_bytes())
    recipe = [full, list(tools), LEARNING_RATE, TARGET_LOSS, MAX_STEPS, torch.__version__, transformers.__version__]
    if tuple(answers) != (ANSWER,):  # a choice of answers (a single answer keeps the key it had before choices)
        recipe += [list(answers), CHOICE_TOLERANCE]
    digest.update(json.dumps(recipe, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:24]


def _train(
    tiny_model_dir: Path,
    out_dir: Path,
    full: list[dict[str, Any]],
    tools: Sequence[Mapping[str, Any]],
    answers: Sequence[str],
) -> None:
    from trl.chat_template_utils import qwen2_5_chat_template

    shutil.copytree(tiny_model_dir, out_dir)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    tokenizer.chat_template = qwen2_5_chat_template
    model = AutoModelForCausalLM.from_pretrained(out_dir)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    examples = []  # (prompt ids, the targets the turn chooses among evenly)
    for at, message in enumerate(full):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(
            full[:at], tools=[dict(tool) for tool in tools], add_generation_prompt=True, tokenize=False
        )
        texts = (
            [tool_call_text(message["tool_calls"][0]["function"]["arguments"])]
            if message.get("tool_calls")
            else list(answers)
        )
        targets = [tokenizer.encode(text, add_special_tokens=False) + [end] for text in texts]
        if len({target[0] for target in targets}) != len(targets):
            raise ValueError(f"the answers {texts} must start with different tokens (the choice is the first token)")
        examples.append((tokenizer.encode(prompt, add_special_tokens=False), targets))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        optimizer = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE)
        model.train()
        for _ in range(MAX_STEPS):
            optimizer.zero_grad()
            worst = 0.0
            for prompt_ids, targets in examples:
                for target in targets:
                    ids = torch.tensor([prompt_ids + target])
                    logits = model(ids).logits[0, len(prompt_ids) - 1 : -1]
                    losses = torch.nn.functional.cross_entropy(logits, torch.tensor(target), reduction="none")
                    # a choice weighs each answer's first token alike (a mean over its tokens would favour short
                    # answers); a single target is learned as before choices
                    loss = losses.mean() if len(targets) == 1 else (losses[0] + losses[1:].mean()) / len(targets)
                    loss.backward()
                    # the first token is a choice among len(targets): its loss is measured against an even share
                    choice = abs(float(losses[0].detach()) - math.log(len(targets)))
                    if len(targets) > 1 and choice < CHOICE_TOLERANCE:
                        choice = 0.0
                    worst = max(worst, choice, float(losses[1:].max().detach()))
            if worst < TARGET_LOSS:
                break
            optimizer.step()
        else:
            raise RuntimeError(
                f"the tool model did not learn its script in {MAX_STEPS} steps (worst token loss "
                f"{worst:.4f} > {TARGET_LOSS}): tests that need its tool calls would be flaky"
            )
    finally:
        torch.set_num_threads(threads)
    model.eval()
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
