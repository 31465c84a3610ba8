"""``python -m opbench``: the opbench command."""

from . import _startup  # noqa: F401  (first: a Ctrl-C from now on stops the command with its one line)
from .cli.main import run

run()
