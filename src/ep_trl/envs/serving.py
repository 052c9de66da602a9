"""The command line every environment server of ``ep_trl.envs`` shares: ``python -m ep_trl.envs.<name> --host H
--port P`` runs uvicorn on the environment's ASGI app and logs one "<name> env ready on <url>" line once it accepts
connections (the line tests and scripts wait for). A server with options of its own (BrowserGym's) adds them to
:func:`server_parser` and calls :func:`serve`; one without calls :func:`main`."""

import argparse
import asyncio
import importlib
import logging
from typing import Any

import uvicorn


def server_parser(name: str, default_port: int, description: str | None = None) -> argparse.ArgumentParser:
    """The options every server has: ``--host``, ``--port`` (0 picks a free one) and ``--log-level``."""
    parser = argparse.ArgumentParser(
        prog=f"python -m ep_trl.envs.{name}",
        description=description or f"Serve the {name} environment (an OpenEnv server) with uvicorn.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=default_port, help=f"port to bind; 0 picks a free one (default {default_port})"
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def serve(app: Any, args: argparse.Namespace, name: str, detail: str = "") -> None:
    """Serve ``app`` on ``args.host``/``args.port`` until interrupted; log the ready line (with ``detail`` after the
    URL) as soon as uvicorn has bound its socket."""
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))
    asyncio.run(_serve(server, args.host, logging.getLogger(f"ep_trl.envs.{name}"), f"{name} env ready", detail))


async def _serve(server: uvicorn.Server, host: str, logger: logging.Logger, ready: str, detail: str) -> None:
    serve_task = asyncio.create_task(server.serve())
    while not server.started and not serve_task.done():
        await asyncio.sleep(0.05)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1] if server.servers else None
        logger.info("%s on http://%s:%s%s", ready, host, port, detail)
    await serve_task


def main(name: str, app: str, default_port: int, argv: list[str] | None = None) -> None:
    """Serve ``app`` (``"module:attribute"``, imported after logging is set up) until interrupted."""
    args = server_parser(name, default_port).parse_args(argv)
    configure_logging(args.log_level)
    module, _, attribute = app.partition(":")
    serve(getattr(importlib.import_module(module), attribute), args, name)
