"""The jobs the command line, the facade and the scripts run, each a short sequence of calls into the
packages below:

* :mod:`.compile`  ``compile_workload`` (extract -> apply a tuning database -> build) and the kernel backends
* :mod:`.collect`  measure every operator of a model into the dataset
* :mod:`.compare`  schedules measured side by side, the fastest kept, the critical path
* :mod:`.tune`     tune a model's tasks; tune and measure (``collect --iftune``)
* :mod:`.train`    train a predictor on a dataset
"""

from .collect import CollectJob, CollectOptions, CollectResult, collect, measurement_key
from .compile import CompiledWorkload, compile_workload

__all__ = ["CollectJob", "CollectOptions", "CollectResult", "CompiledWorkload", "collect", "compile_workload",
           "measurement_key"]
