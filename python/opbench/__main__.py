"""``python -m opbench``: the opbench command."""

from .cli.main import run

run()
