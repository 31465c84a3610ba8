"""``python -m opbench``: the opbench command."""

from . import signals

signals.early()  # before the command's modules import: a Ctrl-C now stops it with its one line, not a traceback

from .cli.main import run  # noqa: E402

run()
