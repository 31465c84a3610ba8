"""The dataset schema (version 1). Documented column by column in ``docs/dataset.md``.

Tables
------
meta        key/value: ``schema_version``, ``created_by``.
runs        one row per invocation: command line, environment tags, start/end, status.
operators   one row per measured operator (and schedule config): features, latency, resources.
models      one row per measured model: whole-model latency from the Relax VM, correctness check.
corun       one row per co-run group (several operators launched together).
"""

SCHEMA_VERSION = 1

# (name, SQL type); every table also has ``id`` and ``run_id``
KEY_COLUMNS = ["source", "model", "batch_size", "target", "config"]

ENV_COLUMNS = [
    ("device", "TEXT"), ("cpu_model", "TEXT"), ("cpu_cores", "INTEGER"),
    ("gpu_name", "TEXT"), ("gpu_sm_count", "INTEGER"), ("gpu_memory_mb", "INTEGER"),
    ("gpu_driver", "TEXT"), ("cuda_runtime", "TEXT"), ("gpu_clock_start_mhz", "INTEGER"),
    ("gpu_clock_end_mhz", "INTEGER"),
    ("tvm_version", "TEXT"), ("opbench_version", "TEXT"), ("measured_at", "TEXT"),
]

OPERATOR_COLUMNS = [
    ("source", "TEXT"), ("model", "TEXT"), ("batch_size", "INTEGER"), ("target", "TEXT"),
    ("config", "TEXT"), ("op_index", "INTEGER"), ("func", "TEXT"), ("task", "TEXT"),
    ("task_uses", "INTEGER"), ("kind", "TEXT"), ("ops", "TEXT"), ("attrs", "TEXT"),
    ("input_shapes", "TEXT"), ("input_dtypes", "TEXT"), ("output_shapes", "TEXT"),
    ("output_dtypes", "TEXT"), ("preds", "TEXT"), ("flops", "REAL"), ("bytes", "INTEGER"),
    ("arithmetic_intensity", "REAL"),
    ("latency_median_s", "REAL"), ("latency_mean_s", "REAL"), ("latency_std_s", "REAL"),
    ("latency_min_s", "REAL"), ("latency_max_s", "REAL"), ("repeats", "INTEGER"),
    ("number", "INTEGER"), ("l2_flush", "INTEGER"), ("gflops", "REAL"), ("gbytes_per_s", "REAL"),
    ("num_kernels", "INTEGER"), ("grid", "TEXT"), ("block", "TEXT"),
    ("registers", "INTEGER"), ("static_smem", "INTEGER"), ("dynamic_smem", "INTEGER"),
    ("threads", "INTEGER"), ("occupancy", "REAL"), ("sms_used", "INTEGER"),
    ("status", "TEXT"), ("error", "TEXT"),
] + ENV_COLUMNS

MODEL_COLUMNS = [
    ("source", "TEXT"), ("model", "TEXT"), ("batch_size", "INTEGER"), ("target", "TEXT"),
    ("config", "TEXT"), ("num_ops", "INTEGER"), ("unique_tasks", "INTEGER"),
    ("sum_op_latency_s", "REAL"), ("vm_latency_median_s", "REAL"), ("vm_latency_std_s", "REAL"),
    ("replay_rel_error", "REAL"), ("compile_s", "REAL"), ("measure_s", "REAL"),
    ("provenance", "TEXT"), ("status", "TEXT"), ("error", "TEXT"),
] + ENV_COLUMNS

CORUN_COLUMNS = [
    ("source", "TEXT"), ("model", "TEXT"), ("batch_size", "INTEGER"), ("target", "TEXT"),
    ("config", "TEXT"), ("group_key", "TEXT"), ("group_size", "INTEGER"), ("op_indices", "TEXT"),
    ("kinds", "TEXT"), ("features", "TEXT"), ("sequential_s", "REAL"), ("concurrent_s", "REAL"),
    ("speedup", "REAL"), ("solo_s", "TEXT"), ("slowdowns", "TEXT"), ("repeats", "INTEGER"),
    ("l2_flush", "INTEGER"), ("status", "TEXT"), ("error", "TEXT"),
] + ENV_COLUMNS

TABLES = {
    "operators": (OPERATOR_COLUMNS, KEY_COLUMNS + ["op_index"]),
    "models": (MODEL_COLUMNS, KEY_COLUMNS),
    "corun": (CORUN_COLUMNS, KEY_COLUMNS + ["group_key"]),
}


def create_statements() -> list[str]:
    """SQL that creates every table (idempotent)."""
    stmts = [
        "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)",
        "CREATE TABLE IF NOT EXISTS runs (run_id INTEGER PRIMARY KEY AUTOINCREMENT, "
        "started_at TEXT, finished_at TEXT, status TEXT, command TEXT, env TEXT)",
    ]
    for table, (columns, unique) in TABLES.items():
        cols = ", ".join(f"{name} {sqltype}" for name, sqltype in columns)
        stmts.append(
            f"CREATE TABLE IF NOT EXISTS {table} (id INTEGER PRIMARY KEY AUTOINCREMENT, "
            f"run_id INTEGER REFERENCES runs(run_id), {cols}, UNIQUE ({', '.join(unique)}))"
        )
    return stmts
