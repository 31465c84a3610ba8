"""The jobs the command line and the scripts run: each a short sequence of calls into the packages below."""

from .collect import CollectOptions, CollectResult, collect, measurement_key

__all__ = ["CollectOptions", "CollectResult", "collect", "measurement_key"]
