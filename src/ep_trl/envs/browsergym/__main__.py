"""CLI: ``python -m ep_trl.envs.browsergym --host 127.0.0.1 --port 8020``.

Checks that Playwright's Chromium and the MiniWoB pages are installed, then runs
uvicorn on the BrowserGym app and logs one "browsergym env ready" line (with the
bound URL) once it accepts connections.
"""

import argparse
import logging
import sys

from ep_trl.envs.serving import configure_logging, serve, server_parser

logger = logging.getLogger("ep_trl.envs.browsergym")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse command-line options: the shared ones (``ep_trl.envs.serving``) and the browsers'."""
    parser = server_parser("browsergym", 8020, description=__doc__)
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
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Entry point: configure logging, check the install, build the app, serve until interrupted."""
    args = parse_args(argv)
    configure_logging(args.log_level)
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
    serve(app, args, "browsergym", detail=f" (max {max_sessions} sessions)")


if __name__ == "__main__":
    main()
