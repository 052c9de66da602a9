"""CLI: ``python -m ep_trl.envs.doors --host 127.0.0.1 --port 8012``.

Runs uvicorn on ``ep_trl.envs.doors.server:app`` and logs one
"doors env ready" line (with the bound URL) once it accepts connections.
"""

import argparse
import asyncio
import logging

import uvicorn

logger = logging.getLogger("ep_trl.envs.doors")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse command-line options."""
    parser = argparse.ArgumentParser(prog="python -m ep_trl.envs.doors", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8012, help="port to bind; 0 picks a free one (default 8012)")
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser.parse_args(argv)


async def _serve(server: uvicorn.Server, host: str) -> None:
    """Run uvicorn and log the ready line as soon as it has bound its socket."""
    serve_task = asyncio.create_task(server.serve())
    while not server.started and not serve_task.done():
        await asyncio.sleep(0.05)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1] if server.servers else None
        logger.info("doors env ready on http://%s:%s", host, port)
    await serve_task


def main(argv: list[str] | None = None) -> None:
    """Entry point: configure logging, import the app, serve until interrupted."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ep_trl.envs.doors.server import app

    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level)
    asyncio.run(_serve(uvicorn.Server(config), args.host))


if __name__ == "__main__":
    main()
