"""The ``opbench`` console command: signals are recorded from its first moments (:func:`opbench.signals.early`),
then the command line runs (:func:`opbench.cli.main.run`)."""

from __future__ import annotations

from .. import signals

signals.early()


def run() -> None:
    """The ``opbench`` command."""
    from .main import run as run_command

    run_command()
