"""The dataset schema (version 8). Documented column by column in ``docs/dataset.md``.

Tables
------
meta        key/value: ``schema_version``, ``created_by``, ``migrated_from``.
runs        one row per invocation: command line, environment tags, start/end, status.
operators   one row per measured operator: features, latency, resources.
models      one row per measured model: whole-model latency from the Relax VM, correctness check.
corun       one row per co-run group (several operators launched together; with SM partitions, version 4).

Version 4 also gives every measurement table a ``dtype`` column (the workload's precision: float32,
float16 or bfloat16; rows of earlier versions are float32). Version 5 adds the timing percentiles
(p10, p90, p99; the median is p50) to operators, models and co-runs (NULL in earlier rows).
trials      one row per candidate schedule measured while tuning (version 3) or sampling (version 7).
tasks       one row per tensor-program task sampled by ``opbench sample`` (version 7): its module once,
            which models use it, what sampling it cost. Its ``workload_id`` keys the task's trial rows.

Version 8 adds energy to operators, models and co-runs: the GPU's mean board power over the timed
samples (NVML's total energy counter read before and after them), that power times the median latency,
and the length of the window read (NULL on a CPU, without NVML, and in earlier rows).

Keys
----
Every measurement row is keyed by what was measured, not by how it was named:

``workload_id``
    Digest of the workload fingerprint: source, canonical model name, batch size, every input's
    shape and dtype, every option that changes the graph or its weights (image size, seqlen, seed,
    a synthetic model's parameters) and, for ONNX, the file's SHA-256.
``device_id``
    Digest of the device fingerprint: the full canonical target (kind and every attribute) and
    the CPU model or GPU name.
``config``, ``l2_flush``
    The measurement variant: ``default`` kernels or ``db:<digest>`` of a tuning database; caches
    flushed before every call or not.

The readable columns (``source``, ``model``, ``batch_size``, ``target``, ``workload``,
``device_name``) say the same in words; they are not part of the key.
"""

from __future__ import annotations

from ..utils import PERCENTILES

SCHEMA_VERSION = 8

# logical column types: TEXT, INTEGER, REAL, JSON (JSON text in SQLite), TIME (ISO 8601 text in SQLite)
KEY_COLUMNS = ["workload_id", "device_id", "config", "l2_flush"]

READABLE_COLUMNS = [
    ("workload_id", "TEXT"), ("device_id", "TEXT"), ("config", "TEXT"), ("l2_flush", "INTEGER"),
    ("source", "TEXT"), ("model", "TEXT"), ("batch_size", "INTEGER"), ("workload", "JSON"),
    ("target", "TEXT"), ("device_name", "TEXT"),
]

ENV_COLUMNS = [
    ("device", "TEXT"), ("hostname", "TEXT"), ("cpu_model", "TEXT"), ("cpu_cores", "INTEGER"),
    ("cpu_freq_mhz", "REAL"), ("thread_settings", "TEXT"),
    ("gpu_name", "TEXT"), ("gpu_sm_count", "INTEGER"), ("gpu_memory_mb", "INTEGER"),
    ("gpu_driver", "TEXT"), ("cuda_runtime", "TEXT"), ("gpu_clock_start_mhz", "INTEGER"),
    ("gpu_clock_end_mhz", "INTEGER"), ("gpu_throttle", "TEXT"),
    ("tvm_version", "TEXT"), ("llvm_version", "TEXT"), ("torch_version", "TEXT"), ("python_version", "TEXT"),
    ("opbench_version", "TEXT"), ("opbench_commit", "TEXT"), ("measured_at", "TIME"),
]

OPERATOR_COLUMNS = READABLE_COLUMNS + [
    ("op_index", "INTEGER"), ("func", "TEXT"), ("task", "TEXT"),
    ("task_uses", "INTEGER"), ("kind", "TEXT"), ("ops", "JSON"), ("attrs", "JSON"),
    ("input_shapes", "JSON"), ("input_dtypes", "JSON"), ("output_shapes", "JSON"),
    ("output_dtypes", "JSON"), ("preds", "JSON"), ("flops", "REAL"), ("bytes", "INTEGER"),
    ("arithmetic_intensity", "REAL"),
    ("latency_median_s", "REAL"), ("latency_mean_s", "REAL"), ("latency_std_s", "REAL"),
    ("latency_min_s", "REAL"), ("latency_max_s", "REAL"), ("repeats", "INTEGER"),
    ("number", "INTEGER"), ("gflops", "REAL"), ("gbytes_per_s", "REAL"),
    ("num_kernels", "INTEGER"), ("grid", "JSON"), ("block", "JSON"),
    ("registers", "INTEGER"), ("static_smem", "INTEGER"), ("dynamic_smem", "INTEGER"),
    ("threads", "INTEGER"), ("occupancy", "REAL"), ("sms_used", "INTEGER"),
    ("status", "TEXT"), ("error", "TEXT"),
] + ENV_COLUMNS

MODEL_COLUMNS = READABLE_COLUMNS + [
    ("num_ops", "INTEGER"), ("unique_tasks", "INTEGER"),
    ("sum_op_latency_s", "REAL"), ("vm_latency_median_s", "REAL"), ("vm_latency_std_s", "REAL"),
    ("replay_rel_error", "REAL"), ("compile_s", "REAL"), ("measure_s", "REAL"),
    ("provenance", "JSON"), ("status", "TEXT"), ("error", "TEXT"),
] + ENV_COLUMNS

CORUN_COLUMNS = READABLE_COLUMNS + [
    ("group_key", "TEXT"), ("group_size", "INTEGER"), ("op_indices", "JSON"),
    ("kinds", "JSON"), ("features", "JSON"), ("sequential_s", "REAL"), ("concurrent_s", "REAL"),
    ("speedup", "REAL"), ("solo_s", "JSON"), ("slowdowns", "JSON"), ("repeats", "INTEGER"),
    ("status", "TEXT"), ("error", "TEXT"),
] + ENV_COLUMNS + [("partitioned_s", "REAL"), ("partition_sms", "JSON")]  # version 4: appended by the migration

TRIAL_COLUMNS = READABLE_COLUMNS + [
    ("task", "TEXT"), ("task_weight", "INTEGER"), ("tuner", "TEXT"), ("trial", "INTEGER"),
    ("trace", "JSON"), ("knobs", "JSON"), ("build_status", "TEXT"), ("error", "TEXT"),
    ("run_secs", "JSON"), ("latency_median_s", "REAL"), ("best_so_far_s", "REAL"),
] + ENV_COLUMNS

RUN_COLUMNS = [
    ("run_id", "INTEGER"), ("started_at", "TIME"), ("finished_at", "TIME"), ("status", "TEXT"),
    ("command", "TEXT"), ("env", "JSON"),
]

#: version 4: the workload's precision, last in every measurement table (where the migration adds it)
DTYPE_COLUMN = ("dtype", "TEXT")
OPERATOR_COLUMNS.append(DTYPE_COLUMN)
MODEL_COLUMNS.append(DTYPE_COLUMN)
CORUN_COLUMNS.append(DTYPE_COLUMN)
TRIAL_COLUMNS.append(DTYPE_COLUMN)

# version 5: timing percentiles (utils.PERCENTILES), appended by the migration (``latency_median_s`` etc. are the p50)
PERCENTILE_COLUMNS = {
    "operators": [(f"latency_p{q}_s", "REAL") for q in PERCENTILES],
    "models": [(f"vm_latency_p{q}_s", "REAL") for q in PERCENTILES],
    "corun": [(f"concurrent_p{q}_s", "REAL") for q in PERCENTILES],
}
OPERATOR_COLUMNS.extend(PERCENTILE_COLUMNS["operators"])
MODEL_COLUMNS.extend(PERCENTILE_COLUMNS["models"])
CORUN_COLUMNS.extend(PERCENTILE_COLUMNS["corun"])

# version 6: which GPU measured the row (its UUID, as NVML and ``nvidia-smi -i`` name it; NULL on a CPU and in
# earlier rows), appended by the migration: GPUs of one model share ``device_id``, this tells them apart
GPU_UUID_COLUMN = ("gpu_uuid", "TEXT")
for _columns in (OPERATOR_COLUMNS, MODEL_COLUMNS, CORUN_COLUMNS, TRIAL_COLUMNS):
    _columns.append(GPU_UUID_COLUMN)

# version 7: what ``opbench sample`` keeps of each candidate, appended to trials by the migration
SAMPLE_COLUMNS = [
    ("seed", "INTEGER"), ("origin", "TEXT"), ("sketch", "INTEGER"), ("candidate_hash", "TEXT"),
    ("number", "INTEGER"), ("repeats", "INTEGER"), ("spread", "REAL"), ("build_s", "REAL"),
    ("audit_secs", "JSON"),
]
TRIAL_COLUMNS.extend(SAMPLE_COLUMNS)

# version 8: energy (NVML's total energy counter around the timed samples; NULL on a CPU and in earlier rows):
# mean board power over the window, that power times the median latency, the window's seconds
ENERGY_PREFIX = {"operators": "", "models": "vm_", "corun": "concurrent_"}
ENERGY_COLUMNS = {t: [(f"{p}energy_j", "REAL"), (f"{p}power_w", "REAL"), (f"{p}energy_window_s", "REAL")]
                  for t, p in ENERGY_PREFIX.items()}
OPERATOR_COLUMNS.extend(ENERGY_COLUMNS["operators"])
MODEL_COLUMNS.extend(ENERGY_COLUMNS["models"])
CORUN_COLUMNS.extend(ENERGY_COLUMNS["corun"])

# version 7: one row per sampled task (its workload_id keys the task's trial rows)
TASK_COLUMNS = [
    ("workload_id", "TEXT"), ("task", "TEXT"), ("target", "TEXT"), ("dtype", "TEXT"), ("space", "TEXT"),
    ("mod", "JSON"), ("args_info", "JSON"), ("flops", "REAL"), ("uses", "JSON"), ("sampling", "JSON"),
    ("created_at", "TIME"),
]

# measurement tables: (columns, unique key)
TABLES = {
    "operators": (OPERATOR_COLUMNS, KEY_COLUMNS + ["op_index"]),
    "models": (MODEL_COLUMNS, KEY_COLUMNS),
    "corun": (CORUN_COLUMNS, KEY_COLUMNS + ["group_key"]),
    "trials": (TRIAL_COLUMNS, KEY_COLUMNS + ["task", "tuner", "trial"]),
    "tasks": (TASK_COLUMNS, ["workload_id"]),
}
#: the tables of measurements (every one but ``tasks``, which describes what the trial rows measured)
MEASUREMENT_TABLES = [t for t in TABLES if t != "tasks"]

# every table a dataset may hold, with its columns (``id``/``run_id`` included where present)
ALL_TABLES = ["runs", *TABLES]


def columns_of(table: str) -> list[tuple[str, str]]:
    """Every column of ``table`` with its logical type, in file order."""
    if table == "runs":
        return list(RUN_COLUMNS)
    if table == "meta":
        return [("key", "TEXT"), ("value", "TEXT")]
    return [("id", "INTEGER"), ("run_id", "INTEGER"), *TABLES[table][0]]


_SQL_TYPES = {"TEXT": "TEXT", "INTEGER": "INTEGER", "REAL": "REAL", "JSON": "TEXT", "TIME": "TEXT"}


def create_table(table: str) -> str:
    """SQL that creates one measurement table of the current version."""
    columns, unique = TABLES[table]
    cols = ", ".join(f"{name} {_SQL_TYPES[kind]}" for name, kind in columns)
    return (f"CREATE TABLE {table} (id INTEGER PRIMARY KEY AUTOINCREMENT, "
            f"run_id INTEGER REFERENCES runs(run_id), {cols}, UNIQUE ({', '.join(unique)}))")


def create_statements() -> list[str]:
    """SQL that creates every table of the current version."""
    return [
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
        "CREATE TABLE runs (run_id INTEGER PRIMARY KEY AUTOINCREMENT, "
        "started_at TEXT, finished_at TEXT, status TEXT, command TEXT, env TEXT)",
        *(create_table(t) for t in TABLES),
    ]
