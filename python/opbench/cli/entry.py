"""The ``opbench`` console command: signals are recorded from its first moments (:mod:`opbench._startup`),
then the command line runs (:func:`opbench.cli.main.run`)."""

from __future__ import annotations

from .. import _startup  # noqa: F401  (first: a Ctrl-C from now on stops the command with its one line)


def run() -> None:
    """The ``opbench`` command."""
    from .main import run as run_command

    run_command()
