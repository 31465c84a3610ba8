"""The report tests use the predictors' synthetic dataset."""

from ..predict.conftest import synthetic, write_synthetic  # noqa: F401
