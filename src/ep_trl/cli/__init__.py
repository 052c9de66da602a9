"""``ep-trl``: the command line of ep_trl (``[project.scripts]`` in ``pyproject.toml``).

* ``ep-trl train ENV_PATH --model MODEL [flags]``: GRPO on an eval-protocol eval (:mod:`ep_trl.cli.train`,
  ``docs/cli.md``);
* ``ep-trl serve MODEL_DIR``: a local model behind the endpoint training uses, to run the same eval under
  ``pytest`` (:mod:`ep_trl.cli.serve`).

``python -m ep_trl.cli ...`` runs the same command.
"""

import sys
from collections.abc import Sequence

COMMANDS = {"train": "GRPO on an eval-protocol eval: ep-trl train ENV_PATH --model MODEL [flags] (--help lists them)",
            "serve": "serve a local model behind the endpoint training uses: ep-trl serve MODEL_DIR [--port P]"}
USAGE = "usage: ep-trl {train,serve} ...\n\n" + "\n".join(f"  {name:6} {what}" for name, what in COMMANDS.items())


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ep-trl COMMAND ...``; the command's exit status (2 and the usage for an unknown command)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "train":
        from .train import main as train

        try:
            return train(rest)
        except KeyboardInterrupt:  # Ctrl-C: the run folder and the message are written; the shell's status for it
            return 130
    if command == "serve":
        from .serve import main as serve

        return serve(rest)
    print(f"ep-trl: unknown command {command!r}\n{USAGE}", file=sys.stderr)
    return 2
