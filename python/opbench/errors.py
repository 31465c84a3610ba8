"""Errors shown to the user as one line (the CLI prints them without a traceback)."""


class OpBenchError(Exception):
    """A problem with the user's input or environment, explained in one line.

    The CLI prints ``opbench: error: <message>`` and exits with status 2; ``--debug`` shows the
    traceback.
    """
