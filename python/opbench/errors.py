"""Errors shown to the user as one line (the CLI prints them without a traceback)."""


class OpBenchError(Exception):
    """A problem with the user's input or environment, explained in one line.

    The CLI prints ``opbench: error: <message>`` and exits with status 2; ``--debug`` shows the
    traceback.
    """


def first_line(err: object) -> str:
    """The first line of an error's message (a compiler's or TVM's can run to pages), or the exception's
    type name when the message is empty."""
    text = str(err).strip()
    if text:
        return text.splitlines()[0]
    return type(err).__name__ if isinstance(err, BaseException) else ""


__all__ = ["OpBenchError", "first_line"]
