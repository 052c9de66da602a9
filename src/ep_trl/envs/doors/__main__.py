"""CLI: ``python -m ep_trl.envs.doors --host 127.0.0.1 --port 8012`` (``ep_trl.envs.serving``: uvicorn on
``ep_trl.envs.doors.server:app``, one "doors env ready" line with the bound URL once it accepts connections)."""

from ep_trl.envs.serving import main

if __name__ == "__main__":
    main("doors", "ep_trl.envs.doors.server:app", default_port=8012)
