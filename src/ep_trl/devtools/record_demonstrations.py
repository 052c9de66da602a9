"""Record demonstrations of an eval's tool-call format for ``ep-trl train --warm-start``.

::

    python -m ep_trl.devtools.record_demonstrations ENV_PATH --out DEMOS.jsonl --choices LEFT,DOWN,RIGHT,UP \\
        [--argument action] [--tool lake_move] [--rows N] [--repeat R] [--seed S]
    python -m ep_trl.devtools.record_demonstrations ENV_PATH --out DEMOS.jsonl --player MODULE:FUNCTION

The eval's own processor plays ``--rows`` of its rows (``--repeat`` episodes each), as ``ep-trl train --held-out``
scores rows (its ``evalprotocol.processors``), against a scripted player: an OpenAI-compatible server on 127.0.0.1,
started and stopped here, that answers every chat completion with one call of the tool the request offers (one tool,
or the one ``--tool`` names), whose one argument (``--argument``; default the tool's only parameter) is drawn from
``--choices``, seeded per episode and turn. Each finished episode is written as one JSON line: its row id, its
messages and the tools the processor offered (as the scripted server received them).

The moves are random: the demonstrations teach the format of a turn (a tool call with a valid argument), not how to
win. A warm start on them gives GRPO a policy whose turns are actions, and leaves finding the good ones to GRPO.

With ``--player MODULE:FUNCTION`` the argument is what ``FUNCTION(messages)`` returns for the messages of the request
(the conversation so far, the latest observation last) instead of a random draw: a scripted expert, e.g.
``ep_trl.devtools.frozen_lake_rows:shortest_path_move`` (a shortest safe path on the lake the messages show).
Demonstrations of an expert teach the moves too; "before" is then the warm-started policy, which already reads some.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import random
import sys
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch of LiteLLM's price list

if TYPE_CHECKING:
    from aiohttp import web

    from ..evalprotocol.spec import EvalSpec
    from ..trajectory.types import Row, Settings

#: The model name each episode's calls carry (``scripted-<episode>``): the server tells episodes apart by it.
MODEL_PREFIX = "scripted-"

#: A scripted expert: the request's messages (the latest observation last) to the tool argument's value.
Policy = Callable[[Sequence[Mapping[str, object]]], str]

#: How long one episode may take.
EPISODE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ScriptedPlayer:
    """What the scripted server answers: a call of ``tool`` (None: the one tool a request offers) with
    ``{argument: choice}`` (``argument`` None: the tool's only parameter), ``choice`` drawn from ``choices`` by a
    generator seeded with ``seed``, the episode's model name and the turn; or, with ``policy``, what it returns for
    the request's messages (one of ``choices`` when those are given)."""

    choices: tuple[str, ...]
    tool: str | None = None
    argument: str | None = None
    seed: int = 0
    policy: Policy | None = None

    def __post_init__(self) -> None:
        if self.policy is None and not self.choices or not all(self.choices):
            raise ValueError(
                f"--choices {','.join(self.choices)!r}: give the argument's values, comma-separated, e.g. "
                "--choices LEFT,DOWN,RIGHT,UP (or a scripted expert with --player MODULE:FUNCTION)"
            )

    def answer(
        self,
        tools: Sequence[Mapping[str, object]],
        model: str,
        turn: int,
        messages: Sequence[Mapping[str, object]] = (),
    ) -> tuple[str, dict[str, str]]:
        """The tool to call and its arguments; ValueError naming the fix when the request's tools do not allow one
        call."""
        offered = {str(f.get("name")): f for t in tools if isinstance(f := t.get("function"), Mapping)}
        if not offered:
            raise ValueError(
                "the eval's processor offered the model no tool: the scripted player answers with tool "
                "calls, so it records demonstrations of tool-using evals only"
            )
        if self.tool is None and len(offered) > 1:
            raise ValueError(
                f"the eval offers {len(offered)} tools ({', '.join(sorted(offered))}): name the one the "
                "player calls with --tool"
            )
        name = self.tool if self.tool is not None else next(iter(offered))
        if name not in offered:
            raise ValueError(f"--tool {name}: the eval offers {', '.join(sorted(offered))}")
        parameters = offered[name].get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        names = sorted(properties) if isinstance(properties, Mapping) else []
        argument = self.argument
        if argument is None:
            if len(names) != 1:
                raise ValueError(
                    f"tool {name} takes {len(names)} parameters ({', '.join(names) or 'none declared'}): "
                    "name the one the player sets with --argument"
                )
            argument = names[0]
        elif names and argument not in names:
            raise ValueError(f"--argument {argument}: tool {name} takes {', '.join(names)}")
        if self.policy is None:
            return name, {argument: random.Random(f"{self.seed}:{model}:{turn}").choice(self.choices)}
        choice = self.policy(messages)
        if self.choices and choice not in self.choices:
            raise ValueError(f"the player answered {choice!r}, not one of --choices {','.join(self.choices)}")
        return name, {argument: choice}


@dataclass
class ScriptedServer:
    """An OpenAI-compatible chat-completions server on 127.0.0.1 answering as ``player`` does, in a thread of its
    own; what each episode was offered (by model name) and the first request it had to refuse are kept."""

    player: ScriptedPlayer
    tools: dict[str, list[Mapping[str, object]]] = field(default_factory=dict)
    turns: dict[str, int] = field(default_factory=dict)
    error: str | None = None
    base_url: str = ""
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _runner: web.AppRunner | None = None

    def start(self) -> str:
        """Start serving; the base URL (``http://127.0.0.1:PORT``, no ``/v1``)."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = self._loop = asyncio.new_event_loop()
            try:
                loop.run_until_complete(self._start())
            except BaseException as error:  # handed to start()'s caller
                failure.append(error)
                ready.set()
                return
            ready.set()
            loop.run_forever()
            loop.run_until_complete(self._stop())
            loop.close()

        self._thread = threading.Thread(target=serve, name="scripted-player", daemon=True)
        self._thread.start()
        ready.wait(60)
        if failure:
            raise failure[0]
        return self.base_url

    async def _start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def stop(self) -> None:
        """Stop serving and end the thread."""
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)

    async def _models(self, request: web.Request) -> web.Response:
        from aiohttp import web

        return web.json_response({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def _chat(self, request: web.Request) -> web.Response:
        from aiohttp import web

        body = await request.json()
        model = str(body.get("model"))
        tools = list(body.get("tools") or [])
        turn = self.turns.get(model, 0)
        self.turns[model] = turn + 1
        try:
            name, arguments = self.player.answer(tools, model, turn, list(body.get("messages") or []))
        except ValueError as error:
            self.error = self.error or str(error)
            return web.json_response({"error": {"message": str(error), "type": "invalid_request_error"}}, status=400)
        self.tools[model] = tools
        call = {
            "id": f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
                "object": "chat.completion",
                "created": 0,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "tool_calls",
                        "message": {"role": "assistant", "content": "", "tool_calls": [call]},
                    }
                ],
                "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
            }
        )


@dataclass(frozen=True)
class Recording:
    """What :func:`record` wrote: the lines, and the episodes whose processor run failed (their errors)."""

    path: Path
    lines: int
    failed: tuple[str, ...]


def record(
    env_path: str,
    out: str | Path,
    player: ScriptedPlayer,
    *,
    rows: int | None = None,
    repeat: int = 1,
    concurrency: int | None = None,
    input_dataset: Sequence[str] | None = None,
) -> Recording:
    """Play ``rows`` of ``env_path``'s rows (None: all), ``repeat`` episodes each, with ``player`` through the eval's
    own processor, and write each finished episode to ``out`` as a JSON line (``row_id``, ``messages``, ``tools``).
    ``input_dataset``: JSONL files read in place of the eval's own ``input_dataset`` (as ``ep-trl train
    --input-dataset`` reads them), e.g. rows kept apart from those a run trains on and holds out.
    ValueError naming the fix for an eval the player cannot play."""
    from ..evalprotocol import eval_rows, read_eval_spec, resolve_eval_test

    eval_test = resolve_eval_test(env_path)
    spec = read_eval_spec(eval_test)
    if spec.processor is None:
        raise ValueError(
            f"{spec.qualified_name} plays an OpenEnv environment loop, not a processor that calls a model "
            "with tools; the recorder plays evals with their own processor (MCP-gym, agent, single-turn)"
        )
    available = eval_rows(eval_test, input_dataset)
    chosen = available[:rows] if rows is not None else available
    if not chosen:
        raise ValueError(f"{spec.qualified_name} has no rows to play")
    episodes = [row.model_copy(deep=True) for row in chosen for _ in range(repeat)]
    server = ScriptedServer(player)
    base_url = server.start()
    try:
        finished = asyncio.run(_play(spec, episodes, base_url, concurrency or spec.max_concurrent_rollouts or 4))
    finally:
        server.stop()
    if server.error is not None:
        raise ValueError(f"{spec.qualified_name}: {server.error}")
    lines = []
    failed = []
    for k, episode in enumerate(finished):
        if isinstance(episode, BaseException):
            failed.append(f"{type(episode).__name__}: {episode}")
            continue
        messages = [m.model_dump(exclude_none=True) for m in episode.messages]
        tools = server.tools.get(f"{MODEL_PREFIX}{k}") or episode.tools
        lines.append(json.dumps({"row_id": episode.input_metadata.row_id, "messages": messages, "tools": tools}))
    if not lines:
        raise ValueError(f"{spec.qualified_name}: no episode finished ({failed[0] if failed else 'none played'})")
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return Recording(path, len(lines), tuple(failed))


async def _play(spec: EvalSpec, episodes: list[Row], base_url: str, concurrency: int) -> list[Row | BaseException]:
    from ..evalprotocol import processors

    semaphore = asyncio.Semaphore(concurrency)
    processors.setup(spec)
    try:
        return await asyncio.gather(
            *(_episode(spec, row, k, base_url, semaphore) for k, row in enumerate(episodes)), return_exceptions=True
        )
    finally:
        await processors.cleanup(spec)


async def _episode(spec: EvalSpec, row: Row, k: int, base_url: str, semaphore: asyncio.Semaphore) -> Row:
    from ..evalprotocol import processors
    from ..evalprotocol.body import new_id

    row.execution_metadata.rollout_id = new_id("demo")
    params: Settings = processors.routed_params(spec.completion_params, f"{MODEL_PREFIX}{k}", f"{base_url}/v1", "EMPTY")
    return await asyncio.wait_for(processors.run_row(spec, row, params, semaphore, _NoLog(), None), EPISODE_TIMEOUT_S)


class _NoLog:
    """The processor's dataset logger: demonstrations stay out of ``ep logs``."""

    def log(self, row: Row) -> None:
        return None

    def read(self, *args: object, **kwargs: object) -> list[Row]:
        return []


def load_policy(spec: str) -> Policy:
    """``MODULE:FUNCTION`` imported; ValueError naming the fix when it does not name a function."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise ValueError(
            f"--player {spec!r}: give MODULE:FUNCTION, e.g. ep_trl.devtools.frozen_lake_rows:shortest_path_move"
        )
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"--player {spec}: {error}") from error
    if not callable(function):
        raise ValueError(f"--player {spec}: {function_name} is not a function")
    return function  # type: ignore[no-any-return]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ep_trl.devtools.record_demonstrations",
        description="Play an eval's rows with a scripted player that calls the eval's tool with random arguments (or "
        "a scripted expert's), "
        "and write each episode as a JSON line: demonstrations for `ep-trl train --warm-start`.",
    )
    parser.add_argument(
        "env_path", metavar="ENV_PATH", help="the eval: path/to/eval.py::test_name or module::test_name"
    )
    parser.add_argument("--out", required=True, help="the JSON-lines file to write")
    parser.add_argument(
        "--choices",
        default="",
        help="the argument's values, comma-separated, one drawn per turn, e.g. LEFT,DOWN,RIGHT,UP",
    )
    parser.add_argument(
        "--player",
        default=None,
        metavar="MODULE:FUNCTION",
        help="a scripted expert instead of random draws: FUNCTION(messages) returns the argument's "
        "value for the request's messages, e.g. ep_trl.devtools.frozen_lake_rows:shortest_path_move",
    )
    parser.add_argument("--argument", default=None, help="the tool's argument the player sets (default: its only one)")
    parser.add_argument("--tool", default=None, help="the tool the player calls (needed when the eval offers several)")
    parser.add_argument("--rows", type=int, default=None, help="play the eval's first N rows (default: all)")
    parser.add_argument("--repeat", type=int, default=1, help="episodes per row")
    parser.add_argument(
        "--input-dataset",
        nargs="+",
        default=None,
        metavar="FILE",
        help="JSONL rows read in place of the eval's own input_dataset, by its dataset_adapter",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the player's draws")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="episodes played at once (default: the eval's max_concurrent_rollouts)",
    )
    args = parser.parse_args(argv)
    if args.rows is not None and args.rows < 1:
        parser.error(f"--rows {args.rows}: give 1 or more")
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat}: give 1 or more")
    from ..errors import EpTrlError

    try:
        choices = tuple(c.strip() for c in args.choices.split(",")) if args.choices else ()
        player = ScriptedPlayer(
            choices,
            tool=args.tool,
            argument=args.argument,
            seed=args.seed,
            policy=load_policy(args.player) if args.player else None,
        )
        recording = record(
            args.env_path,
            args.out,
            player,
            rows=args.rows,
            repeat=args.repeat,
            concurrency=args.concurrency,
            input_dataset=args.input_dataset,
        )
    except (ValueError, EpTrlError) as error:
        parser.error(str(error))
    for failure in recording.failed:
        print(f"an episode failed: {failure}", file=sys.stderr)
    print(f"wrote {recording.lines} demonstrations to {recording.path} ({len(recording.failed)} episodes failed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
