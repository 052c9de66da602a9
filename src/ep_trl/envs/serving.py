"""The command line every environment server of ``ep_trl.envs`` shares: ``python -m ep_trl.envs.<name> --host H
--port P`` runs uvicorn on the environment's ASGI app and logs one "<name> env ready on <url>" line once it accepts
connections (the line tests and scripts wait for)."""

import argparse
import asyncio
import importlib
import logging

import uvicorn


def parse_args(name: str, default_port: int, argv: list[str] | None = None) -> argparse.Namespace:
    """The server's options: ``--host``, ``--port`` (0 picks a free one) and ``--log-level``."""
    parser = argparse.ArgumentParser(prog=f"python -m ep_trl.envs.{name}",
                                     description=f"Serve the {name} environment (an OpenEnv server) with uvicorn.")
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=default_port,
                        help=f"port to bind; 0 picks a free one (default {default_port})")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser.parse_args(argv)


async def _serve(server: uvicorn.Server, host: str, logger: logging.Logger, name: str) -> None:
    """Run uvicorn and log the ready line as soon as it has bound its socket."""
    serve_task = asyncio.create_task(server.serve())
    while not server.started and not serve_task.done():
        await asyncio.sleep(0.05)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1] if server.servers else None
        logger.info("%s env ready on http://%s:%s", name, host, port)
    await serve_task


def main(name: str, app: str, default_port: int, argv: list[str] | None = None) -> None:
    """Serve ``app`` (``"module:attribute"``, imported after logging is set up) until interrupted."""
    args = parse_args(name, default_port, argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    module, _, attribute = app.partition(":")
    asgi = getattr(importlib.import_module(module), attribute)
    config = uvicorn.Config(asgi, host=args.host, port=args.port, log_level=args.log_level)
    asyncio.run(_serve(uvicorn.Server(config), args.host, logging.getLogger(f"ep_trl.envs.{name}"), name))
