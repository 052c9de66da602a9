"""CLI: ``python -m ep_trl.envs.browsergym --host 127.0.0.1 --port 8020``.

Checks that Playwright's Chromium and the MiniWoB pages are installed, then runs
uvicorn on the BrowserGym app and logs one "browsergym env ready" line (with the
bound URL) once it accepts connections.
"""

import argparse
import asyncio
import logging
import sys

import uvicorn

logger = logging.getLogger("ep_trl.envs.browsergym")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse command-line options."""
    parser = argparse.ArgumentParser(prog="python -m ep_trl.envs.browsergym", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8020, help="port to bind; 0 picks a free one (default 8020)")
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=None,
        help="concurrent sessions = browsers (default: BROWSERGYM_MAX_SESSIONS or 2)",
    )
    parser.add_argument(
        "--session-timeout-s",
        type=float,
        default=None,
        help="close sessions idle this long (default: BROWSERGYM_SESSION_TIMEOUT_S or never)",
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return parser.parse_args(argv)


async def _serve(server: uvicorn.Server, host: str, max_sessions: int) -> None:
    """Run uvicorn and log the ready line as soon as it has bound its socket."""
    serve_task = asyncio.create_task(server.serve())
    while not server.started and not serve_task.done():
        await asyncio.sleep(0.05)
    if server.started:
        port = server.servers[0].sockets[0].getsockname()[1] if server.servers else None
        logger.info("browsergym env ready on http://%s:%s (max %d sessions)", host, port, max_sessions)
    await serve_task


def main(argv: list[str] | None = None) -> None:
    """Entry point: configure logging, check the install, build the app, serve until interrupted."""
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from ep_trl.envs.browsergym.config import max_sessions_from_env
    from ep_trl.envs.browsergym.runtime import check_browser_installed
    from ep_trl.envs.browsergym.server import build_app
    from ep_trl.envs.browsergym.tasks import miniwob_base_url

    try:
        chromium = check_browser_installed()
        pages = miniwob_base_url()
    except RuntimeError as exc:
        logger.error("%s", exc)
        sys.exit(2)
    logger.info("Chromium: %s; MiniWoB pages: %s", chromium, pages)
    max_sessions = args.max_sessions if args.max_sessions is not None else max_sessions_from_env()
    app = build_app(max_sessions=max_sessions, session_timeout_s=args.session_timeout_s)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level)
    asyncio.run(_serve(uvicorn.Server(config), args.host, max_sessions))


if __name__ == "__main__":
    main()
