"""A synthetic dataset with known relationships, written through the dataset API."""

from __future__ import annotations

import json

import numpy as np
import pytest

from opbench.dataset import Dataset

DEVICE = "Test GPU"
TARGET = json.dumps({"kind": "cuda", "arch": "sm_90"})


def latency_law(flops: float, nbytes: float) -> float:
    """The synthetic device: a roofline with 5 TFLOP/s, 1 TB/s and 4 us of launch."""
    return max(flops / 5e12, nbytes / 1e12) + 4e-6


def corun_law(solo: list[float]) -> float:
    """Together, a group takes its longest member plus half of the others."""
    return max(solo) + 0.5 * (sum(solo) - max(solo))


def write_synthetic(path, models: int = 6, per_model: int = 40, coruns: int = 12, seed: int = 0,
                    device: str = DEVICE, launch: bool = True) -> None:
    rng = np.random.default_rng(seed)
    with Dataset(path) as ds:
        for m in range(models):
            key = {"workload_id": f"w{m}", "device_id": device.replace(" ", "_"), "config": "default", "l2_flush": 0,
                   "source": "simple", "model": f"model{m}", "batch_size": 1, "workload": {"model": f"model{m}"},
                   "target": TARGET, "device_name": device}
            ops = []
            for i in range(per_model):
                c, k = int(rng.choice([16, 32, 64, 128, 256])), int(rng.choice([16, 32, 64, 128, 256]))
                size, kh = int(rng.choice([7, 14, 28, 56])), int(rng.choice([1, 3]))
                flops = 2.0 * c * k * kh * kh * size * size
                nbytes = 4 * (c * size * size + k * c * kh * kh + k * size * size)
                lat = latency_law(flops, nbytes) * float(rng.normal(1.0, 0.01))
                row = {**key, "op_index": i, "func": f"conv{i}", "task": f"t{m}_{i}", "task_uses": 1,
                       "kind": "conv2d", "ops": ["nn.conv2d"], "attrs": {"strides": [1, 1], "groups": 1},
                       "input_shapes": [[1, c, size, size], [k, c, kh, kh]], "input_dtypes": ["float32"] * 2,
                       "output_shapes": [[1, k, size, size]], "output_dtypes": ["float32"], "preds": [],
                       "flops": flops, "bytes": nbytes, "arithmetic_intensity": flops / nbytes,
                       "latency_median_s": lat, "status": "ok", "gpu_sm_count": 100, "threads": 256,
                       "grid": [[max(1, k * size * size // 256), 1, 1]] if launch else None, "sms_used": 100}
                ds.put("operators", row)
                ops.append(row)
            for _ in range(coruns):
                members = sorted(rng.choice(per_model, size=int(rng.integers(2, 4)), replace=False).tolist())
                solo = [ops[i]["latency_median_s"] for i in members]
                together = corun_law(solo) * float(rng.normal(1.0, 0.01))
                ds.put("corun", {**key, "group_key": "-".join(map(str, members)), "group_size": len(members),
                                 "op_indices": members, "kinds": ["conv2d"] * len(members), "solo_s": solo,
                                 "sequential_s": sum(solo), "concurrent_s": together, "speedup": sum(solo) / together,
                                 "slowdowns": [together / s for s in solo], "status": "ok", "gpu_sm_count": 100})


@pytest.fixture
def synthetic(tmp_path):
    path = tmp_path / "synthetic.sqlite"
    write_synthetic(path)
    return path
