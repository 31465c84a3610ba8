"""The version of OpBench (one place: the package, the CLI, the dataset and setup.cfg read it)."""

__version__ = "0.1.0"
