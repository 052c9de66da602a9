"""CLI: ``python -m ep_trl.envs.letters --host 127.0.0.1 --port 8011`` (``ep_trl.envs.serving``: uvicorn on
``ep_trl.envs.letters.server:app``, one "letters env ready" line with the bound URL once it accepts connections)."""

from ep_trl.envs.serving import main

if __name__ == "__main__":
    main("letters", "ep_trl.envs.letters.server:app", default_port=8011)
