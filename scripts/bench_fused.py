"""Fusion and parallelism together: ``capturer(kernels="fused")`` against ``torch.compile`` and the rest.

For each model and batch size, in ONE process and on the same inputs (PyTorch's default precision, or
the model and its inputs cast to ``--dtype``):

* the model captured as it is in one CUDA Graph ("model graph");
* ``torch.compile(model, mode="reduce-overhead")``, with its compile seconds;
* ``capturer`` on PyTorch's own kernels (``kernels="aten"``, today's default), with its build seconds;
* ``capturer(kernels="fused")``: the model cut into regions, each compiled by Inductor, scheduled on
  streams and captured in one CUDA Graph; its build seconds (the regions' compile seconds among
  them), every schedule's row and what it kept (it also measures torch.compile and the model graph,
  and never keeps something slower than them);
* the critical path of the fused regions (their longest dependency chain, each region timed alone).

At the end of each model the four callables are timed again side by side, alternating, and the
medians of those rounds are the table's figures; the same callables are then timed once more by the
capturer's own timer and rounds (``ms_capturer_timer``), to tell a timer's difference from the moment's,
with each callable's host ms a call (``host_ms``) and its GPU ms a call with the host's time left out
(``device_ms``, behind a spin kernel), as the capturer's own rows have them: a call whose host time nears
its GPU time is as fast as a busy host lets it be.
Each (model, batch, dtype) is measured in a process of its own, one after the other (``--dtypes`` takes
several precisions), or with ``--gpus 0,1,...`` one process per GPU at a time, each seeing only its GPU;
results go to ``OUT/bench_fused.json`` after every one (a re-run with the same OUT skips what is there); a
table is printed. Its "own" column is the capturer's own table row of the kept
candidate against the independent timing of the same callable.

Build seconds come twice. With ``--prebuild-jobs 1`` (the default) each model is first compiled alone in a
process of its own, right before its measured run, nothing timed but the compiles ("cold": ``torch.compile``
and the regions, into Inductor's caches, with an empty store of compiled regions: ``$OPBENCH_CACHE`` of its
own; with ``--cold-caches`` also from empty Inductor and Triton caches of its own, which that model's measured
run and rebuild then use); with N > 1 every model's cold build comes first, N at a time (sooner, but the builds
then share the cores, so each takes longer than alone); 0 builds nothing cold. The measured run then builds again in
its process ("warm": what a user's second build in a new process costs). The fused build keeps its choice
(``capturer(cache=True)``, in ``OUT/cache``); after the timing a new process builds the same model again with
that cache ("rebuild": only the kept candidate is built, nothing measured), and its build seconds, its choice
and its outputs' error are the row's ``rebuild``. ``--deadline-s`` starts no model after that many seconds.

``--table FILE,...`` measures nothing: it prints the table of record, the newest row of each (model, batch, dtype)
of the nine models in those result files, as Markdown, with the rows that miss each of its goals (:data:`GOALS`).

    PYTHONUNBUFFERED=1 PYTHONPATH=python python3 scripts/bench_fused.py --out out --models googlenet:1
    python3 scripts/bench_fused.py --table data/benchmarks/bench_fused_session34_h200x2.json
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import queue
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

DEFAULT = ("googlenet:1,inception_v3:1,nasnet:1,randwire:1,squeezenet_v1.0:1,resnet-18:1,mobilenet_v3_large:1,"
           "efficientnet_b0:1,convnext_tiny:1,vit_b_16:1,bert:1")
BRANCHY = ("googlenet", "inception_v3", "nasnet", "randwire")


DTYPE = "float32"  # --dtype
COLD_CACHES = False  # --cold-caches
LAYOUT = "inductor"  # --layout
DEPTHWISE = "auto"  # --depthwise
PIECE_OPS: int | None = None  # --piece-ops
#: the row of --channels-last-compile
CHANNELS_LAST_ROW = "torch.compile, channels-last weights"


def load(name: str, batch: int):
    """(model on the GPU, inputs) in ``--dtype``: a zoo model (no TVM import), or BERT from its config."""
    from opbench.models import get_source, load_workload

    if name in ("bert", "bert-small", "roberta", "gpt2"):
        w = load_workload("transformers", name, batch, dtype=DTYPE)
        return w.torch_module.cuda().eval(), w.torch_inputs(0, "cuda")
    model, x = get_source("local").torch_model(name, batch, dtype=DTYPE)
    return model.cuda().eval(), [x.cuda()]


def prebuild(name: str, batch: int) -> dict:
    """Cold compile seconds of ``torch.compile(model, mode="reduce-overhead")`` and of the fused regions
    (what ``capturer(kernels="fused")`` compiles), filling Inductor's caches; nothing is timed."""
    import torch

    from opbench.runtime.fused import FusedBackend

    torch.manual_seed(0)
    model, inputs = load(name, batch)
    t = time.perf_counter()
    compiled = torch.compile(model, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            compiled(*inputs)
    torch.cuda.synchronize()
    res = {"torch_compile_cold_s": time.perf_counter() - t}
    t = time.perf_counter()
    # as the capturer compiles: combo code for long regions too
    fused = FusedBackend(model, inputs, combo=True, layout=LAYOUT, depthwise=DEPTHWISE, piece_ops=PIECE_OPS)
    res.update(fused_cold_s=time.perf_counter() - t, regions_compile_cold_s=fused.compile_s,
               regions=len(fused.regions), region_fallbacks=len(fused.fallbacks), regions_built=fused.built,
               regions_seconds=fused.compile_seconds)
    return res


def stem(name: str, batch: int, dtype: str) -> str:
    """How the files and folders of one (model, batch, dtype) are named, with ``--layout``, ``--depthwise`` and
    ``--piece-ops`` where they are not the default (so that runs of both in one ``--out`` keep apart, their cold
    builds too)."""
    return f"{name}_{batch}_{dtype}" + (f"_{LAYOUT}" if LAYOUT != "inductor" else "") \
        + (f"_{DEPTHWISE}" if DEPTHWISE != "auto" else "") + (f"_pieces{PIECE_OPS}" if PIECE_OPS is not None else "")


def caches_folder(out: Path, item: tuple[str, int, str]) -> Path:
    """Where ``--cold-caches`` keeps the Inductor and Triton caches of one (model, batch, dtype)."""
    return out / "prebuild" / f"caches_{stem(*item)}"


def inductor_caches(out: Path, item: tuple[str, int, str]) -> dict[str, str]:
    """With ``--cold-caches``: the environment that points Inductor and Triton at :func:`caches_folder`, which
    the item's cold build starts empty and its measured run and rebuild then use (``{}`` without the flag: the
    user's own caches)."""
    if not COLD_CACHES:
        return {}
    folder = caches_folder(out, item)
    return {"TORCHINDUCTOR_CACHE_DIR": str(folder / "inductor"), "TRITON_CACHE_DIR": str(folder / "triton")}


def prebuild_all(items: list[tuple[str, int, str]], out: Path, jobs: int, deadline: float,
                 env: dict[str, str] | None = None) -> None:
    """``prebuild`` of every item without a file in ``out/prebuild``, ``jobs`` processes at a time; none starts
    after ``deadline``, and those started by then finish (a measured run after a cut-short cold build would have
    no cold row)."""
    folder = out / "prebuild"
    folder.mkdir(exist_ok=True)
    todo = [(n, b, d) for n, b, d in items if not (folder / f"{stem(n, b, d)}.json").exists()]
    running: list[subprocess.Popen] = []
    env = dict(env or os.environ, TORCHINDUCTOR_COMPILE_THREADS=str(max(1, (os.cpu_count() or 4) // max(1, jobs))))
    while todo or running:
        if todo and time.perf_counter() > deadline:
            print(f"prebuild: deadline reached, {len(todo)} cold builds not started", flush=True)
            todo = []
        while todo and len(running) < jobs:
            n, b, d = todo.pop(0)
            cmd = [sys.executable, __file__, "--out", str(out), "--prebuild", f"{n}:{b}", "--dtypes", d, "--layout",
                   LAYOUT, "--depthwise", DEPTHWISE]
            cmd += ["--piece-ops", str(PIECE_OPS)] if PIECE_OPS is not None else []
            store = folder / f"cache_{stem(n, b, d)}"  # an empty store of compiled regions: a cold build
            shutil.rmtree(store, ignore_errors=True)
            if COLD_CACHES:  # empty Inductor and Triton caches too
                shutil.rmtree(caches_folder(out, (n, b, d)), ignore_errors=True)
            running.append(subprocess.Popen(cmd, env=dict(env, OPBENCH_CACHE=str(store),
                                                          **inductor_caches(out, (n, b, d)))))
        time.sleep(1)
        running = [p for p in running if p.poll() is None]


def cache_dir(out: Path, name: str, batch: int) -> Path:
    """The capturer's cache of one model and batch (``$OPBENCH_CACHE`` of its builds)."""
    return out / "cache" / stem(name, batch, DTYPE)


def rebuild(name: str, batch: int, args) -> dict:
    """A second build of ``capturer(kernels="fused", cache=True)`` in this (new) process, the cache written by the
    measured build: its seconds, what it kept, whether the choice came from the cache, its outputs' error."""
    import torch

    from opbench.parallel import capturer
    from opbench.runtime.fused import torch_bytecode_found

    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch.manual_seed(0)
    model, inputs = load(name, batch)
    with torch.no_grad():
        ref = model(*inputs)
    # without bytecode for torch's modules, the rebuild includes compiling their sources in this new process
    bytecode = {"bytecode_cached": torch_bytecode_found(), "dont_write_bytecode": sys.dont_write_bytecode}
    profile = cProfile.Profile() if args.profile_rebuild else None
    t = time.perf_counter()
    if profile is not None:
        profile.enable()
    fused = capturer(inputs, model, kernels="fused", repeat=args.repeat, number=args.number, cache=True,
                     mode=args.mode, layout=args.layout, depthwise=args.depthwise, piece_ops=args.piece_ops)
    if profile is not None:
        profile.disable()
    res = {"build_s": time.perf_counter() - t, "phases": fused.phases,
           "kept": next(r["schedule"] for r in fused.table if r["kept"]),
           "cached_choice": bool(fused.phases.get("cache_choice")), **bytecode}
    with torch.no_grad():
        res["err"] = relative_err(fused(*inputs), ref)
    if profile is not None:  # where the rebuild's seconds went: the whole profile beside the row's JSON (for
        # pstats); in the row, the 40 functions of most cumulative time and the 25 of most own time
        profile.dump_stats(Path(args.out) / "rebuild" / f"{stem(name, batch, DTYPE)}.prof")
        for key, order, count in (("profile", "cumulative", 40), ("profile_self", "tottime", 25)):
            text = io.StringIO()
            pstats.Stats(profile, stream=text).sort_stats(order).print_stats(count)
            res[key] = text.getvalue().splitlines()
    return res


def relative_err(out, ref) -> float:
    """max |out - ref| / max |ref| of the first output (a transformer's last hidden state), in float64 on the CPU
    (so the two may be on different devices)."""
    out = out[0] if isinstance(out, list | tuple) else out
    ref = ref[0] if isinstance(ref, list | tuple) else ref
    out, ref = getattr(out, "last_hidden_state", out), getattr(ref, "last_hidden_state", ref)
    out, ref = out.detach().double().cpu(), ref.detach().double().cpu()
    return float((out - ref).abs().max() / ref.abs().max())


def passed_on(args) -> list[str]:
    """The options a measuring or rebuilding process takes from its parent: what the fused capturer is asked
    for and how the rebuild runs."""
    return (["--repeat", str(args.repeat), "--number", str(args.number), "--mode", args.mode, "--layout", args.layout,
             "--depthwise", args.depthwise]
            + (["--piece-ops", str(args.piece_ops)] if args.piece_ops is not None else [])
            + (["--profile-rebuild"] if args.profile_rebuild else [])
            + (["--cudnn-benchmark"] if args.cudnn_benchmark else [])
            + (["--channels-last-compile"] if args.channels_last_compile else [])
            + (["--cold-caches"] if args.cold_caches else []))


def rebuild_in_new_process(name: str, batch: int, out: Path, args) -> dict:
    """:func:`rebuild` in a process of its own (Inductor's caches as the measured build left them)."""
    path = out / "rebuild" / f"{stem(name, batch, DTYPE)}.json"
    path.parent.mkdir(exist_ok=True)
    path.unlink(missing_ok=True)
    env = dict(os.environ, OPBENCH_CACHE=str(cache_dir(out, name, batch)))
    cmd = [sys.executable, __file__, "--out", str(out), "--rebuild", f"{name}:{batch}", "--dtypes", DTYPE,
           *passed_on(args)]
    try:
        subprocess.run(cmd, env=env, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        return {"error": "rebuild took over 300 s"}
    return json.loads(path.read_text()) if path.exists() else {"error": "the rebuild wrote no result"}


def side_by_side(runs: dict, rounds: int, number: int) -> dict:
    """Medians (ms) of ``rounds`` alternating CUDA-event samples of ``number`` calls of each callable; the
    order turns by one place each round, so that no callable always follows the same one."""
    from opbench.profile.timer import cuda_event_samples

    labels = list(runs)
    samples: dict[str, list[float]] = {k: [] for k in labels}
    for i in range(rounds):
        for label in labels[i % len(labels):] + labels[:i % len(labels)]:
            samples[label] += cuda_event_samples(runs[label], 1, number, warmup=1)
    return {k: statistics.median(v) * 1e3 for k, v in samples.items()}


def capturer_timer(runs: dict, repeat: int, number: int) -> tuple[dict, dict, dict]:
    """Medians (ms) of the same callables timed again by the capturer's own code (its timer and interleaved
    rounds, :func:`opbench.pipeline.compare.time_rounds`), after the build: where a row of the capturer's
    table differs from :func:`side_by_side`, this tells the timer from the moment it was taken. Also each
    callable's host ms a call and its device ms (the host left out), as the capturer's rows have them."""
    from opbench.pipeline.compare import call_clocks, rounds_timer, time_rounds

    rows = [({"schedule": label}, run) for label, run in runs.items()]
    host, device = call_clocks(True, number)
    time_rounds(rows, rounds_timer(True, repeat, number), host=host, device=device)
    return tuple({row["schedule"]: row.get(key) for row, _ in rows} for key in ("latency_ms", "host_ms", "device_ms"))


def bench(name: str, batch: int, args) -> dict:
    import torch

    from opbench.parallel import capturer
    from opbench.pipeline.compare import critical_path
    from opbench.runtime.graphs import CapturedModel

    torch.backends.cudnn.benchmark = args.cudnn_benchmark  # for every candidate alike
    torch.manual_seed(0)
    model, inputs = load(name, batch)
    res: dict = {"model": name, "batch": batch, "dtype": DTYPE, "layout": args.layout, "depthwise": args.depthwise,
                 "piece_ops": args.piece_ops}
    with torch.no_grad():
        ref = model(*inputs)
    own = CapturedModel(model, inputs)
    t = time.perf_counter()
    aten = capturer(inputs, model)
    res["aten_build_s"] = time.perf_counter() - t
    res["aten_kept"] = next(r["schedule"] for r in aten.table if r["kept"])
    print(f"  {name}:{batch} aten: {res['aten_build_s']:.1f} s, kept {res['aten_kept']}", flush=True)
    cache = cache_dir(Path(args.out), name, batch)
    shutil.rmtree(cache, ignore_errors=True)  # this build searches and measures; it keeps its choice for the rebuild
    os.environ["OPBENCH_CACHE"] = str(cache)
    t = time.perf_counter()
    fused = capturer(inputs, model, kernels="fused", repeat=args.repeat, number=args.number, cache=True,
                     mode=args.mode, layout=args.layout, depthwise=args.depthwise, piece_ops=args.piece_ops)
    res["fused_build_s"] = time.perf_counter() - t
    res["fused_phases"] = fused.phases
    res["fused_table"] = fused.table
    res["fused_kept"] = next(r["schedule"] for r in fused.table if r["kept"])
    # what the capturer's rule keeps when it compares each row's latency on a quiet host (steady_ms)
    res["fused_steady_kept"] = next((r["schedule"] for r in fused.table if r.get("steady_kept")), None)
    res["torch_compile_s"] = fused.phases.get("torch_compile_s")
    res["regions_compile_s"] = fused.phases.get("regions_compile_s")
    best = min((r for r in fused.table if r.get("streams") and r["measured"] and r["schedule"] not in
                ("model, CUDA Graph", "model, eager", "torch.compile", "torch.compile + combo kernels")),
               key=lambda r: r["latency_ms"])
    res["fused_best_schedule"], res["fused_best_table_ms"] = best["schedule"], best["latency_ms"]
    print(f"  {name}:{batch} fused: {res['fused_build_s']:.1f} s (torch.compile {res['torch_compile_s']:.1f} s, "
          f"regions {res['regions_compile_s']:.1f} s), kept {res['fused_kept']} (on a quiet host: "
          f"{res['fused_steady_kept']})", flush=True)
    regions = fused.backend
    res["regions"], res["region_fallbacks"] = len(regions.regions), regions.fallbacks
    res["depthwise_ran"] = regions.depthwise  # what --depthwise auto chose
    bound = critical_path(regions, args.repeat, args.number)
    res["fused_critical_path_ms"] = bound["chain_ms"]
    # regions handed other strides than the eager run's by their compiled producers: compiled again for them;
    # those that still copied their inputs into their code's strides (one kernel each, in every capture)
    res["regions_recompiled"], res["regions_restrided"] = regions.recompiled, regions.restrided
    # combo kernels inside long regions: region -> (default, combo) ms as timed to choose, and the regions kept so
    res["regions_combo_ms"] = {k: [v[0] * 1e3, v[1] * 1e3] for k, v in regions.combo_times.items()}
    res["regions_combo_kept"] = regions.combo_regions
    res["torch_compile_table_ms"] = next(r["latency_ms"] for r in fused.table if r["schedule"] == "torch.compile")
    res["combo_table_ms"] = next((r["latency_ms"] for r in fused.table
                                  if r["schedule"] == "torch.compile + combo kernels"), None)
    compiled = next(b for b in fused.baselines if b.label == "torch.compile")
    combo = next((b for b in fused.baselines if b.label == "torch.compile + combo kernels"), None)
    # where the capturer kept a baseline, its result IS that object: the two rows then time one callable twice
    res["fused_is_row"] = next((b.label for b in (compiled, combo) if b is not None and b is fused), None)

    def call(f):
        def run():
            with torch.no_grad():
                return f(*inputs)
        return run

    timed = {"model graph": call(own), "torch.compile": call(compiled), "capturer aten": call(aten),
             "capturer fused": call(fused)}  # each through the call its user makes
    if res["fused_is_row"] is not None:  # one callable is timed once: two timings of it differ by noise alone
        del timed["capturer fused"]
    if args.merge != "none":  # IOS's merge written into the traced graph before the cut
        t = time.perf_counter()
        merged = capturer(inputs, model, kernels="fused", merge=args.merge, repeat=args.repeat, number=args.number)
        res["fused_merge_build_s"] = time.perf_counter() - t
        res["fused_merge_groups"] = merged.backend.merged_groups
        res["fused_merge_kept"] = next(r["schedule"] for r in merged.table if r["kept"])
        res["fused_merge_critical_path_ms"] = critical_path(merged.backend, args.repeat, args.number)["chain_ms"]
        timed["capturer fused + merge"] = call(merged)
    if combo is not None:
        timed["torch.compile + combo kernels"] = call(combo)
    if args.channels_last_compile:  # what a user who stores the weights channels-last gets from torch.compile
        import copy

        from opbench.runtime.graphs import CompiledModel

        compiled_cl = CompiledModel(copy.deepcopy(model).to(memory_format=torch.channels_last), inputs)
        res["torch_compile_channels_last_s"] = compiled_cl.compile_s
        timed[CHANNELS_LAST_ROW] = call(compiled_cl)
    res["ms"] = side_by_side(timed, args.rounds, args.number)
    res["ms_capturer_timer"], res["host_ms"], res["device_ms"] = capturer_timer(timed, args.repeat, args.number)
    if res["fused_is_row"] is not None:
        for times in (res["ms"], res["ms_capturer_timer"], res["host_ms"], res["device_ms"]):
            times["capturer fused"] = times[res["fused_is_row"]]
    res["fused_err"] = relative_err(fused(*inputs), ref)
    res["rebuild"] = rebuild_in_new_process(name, batch, Path(args.out), args)
    ms = res["ms"]
    res["fused_vs_compile"] = ms["torch.compile"] / ms["capturer fused"]
    res["fused_vs_graph"] = ms["model graph"] / ms["capturer fused"]
    if CHANNELS_LAST_ROW in ms:
        res["fused_vs_compile_channels_last"] = ms[CHANNELS_LAST_ROW] / ms["capturer fused"]
    res["gap_to_critical_path"] = ms["capturer fused"] / bound["chain_ms"] - 1
    if "capturer fused + merge" in ms:
        res["merge_vs_fused"] = ms["capturer fused"] / ms["capturer fused + merge"]
    own = {r["schedule"]: r["latency_ms"] for r in fused.table if r.get("measured")}
    kept = {"model graph": "model, CUDA Graph", "torch.compile": "torch.compile",
            "torch.compile + combo kernels": "torch.compile + combo kernels", "capturer fused": res["fused_kept"]}
    res["own_vs_timer"] = {k: own[v] / ms[k] - 1 for k, v in kept.items() if k in ms and v in own}
    cold = Path(args.out) / "prebuild" / f"{stem(name, batch, DTYPE)}.json"
    if cold.exists():
        res["cold"] = json.loads(cold.read_text())
    return res


def table(results: list[dict]) -> str:
    """The rows as text: ms of each callable, the kept result against the best of model graph / torch.compile /
    + combo ("vs best", + is slower), against the fused critical path, the capturer's own row of what it kept
    against the independent timing ("own"), and build seconds."""
    head = (f"{'model':<20}{'batch':>6}{'dtype':>9}{'graph':>9}{'compile':>9}{'combo':>9}{'aten':>9}{'fused':>9}"
            f"{'CP fused':>10}{'vs compile':>11}{'vs best':>9}{'own':>8}{'build s':>9}{'compile s':>10}{'rebuild':>8}"
            f"{'cold':>7}{'cold c':>7}  kept (fused)")
    lines = [head, "-" * len(head)]
    for r in results:
        dtype = r.get("dtype", "float32")
        if "error" in r:
            lines.append(f"{r['model']:<20}{r['batch']:>6}{dtype:>9}  FAILED {r['error'][:90]}")
            continue
        ms, cold, nan = r["ms"], r.get("cold", {}), float("nan")
        combo = ms.get("torch.compile + combo kernels", nan)
        own = r.get("own_vs_timer", {}).get("capturer fused", nan)
        lines.append(f"{r['model']:<20}{r['batch']:>6}{dtype:>9}{ms['model graph']:>9.3f}{ms['torch.compile']:>9.3f}"
                     f"{combo:>9.3f}{ms['capturer aten']:>9.3f}{ms['capturer fused']:>9.3f}"
                     f"{r['fused_critical_path_ms']:>10.3f}{r['fused_vs_compile']:>10.2f}x"
                     f"{vs_best(r):>+9.1%}{own:>+8.1%}{r['fused_build_s']:>9.1f}"
                     f"{r['torch_compile_s']:>10.1f}{r.get('rebuild', {}).get('build_s', nan):>8.1f}"
                     f"{cold.get('fused_cold_s', nan):>7.0f}{cold.get('torch_compile_cold_s', nan):>7.0f}"
                     f"  {r['fused_kept']}")
    return "\n".join(lines)


#: the models of the capturer's table of record, in its order
TABLE_MODELS = ("googlenet", "inception_v3", "nasnet", "randwire", "shufflenet_v2_x1_0", "densenet121", "resnet-50",
                "mobilenet_v3_large", "bert")
#: what that table must show: at most ``vs_best`` slower than the best baseline, the capturer's own row of what it
#: kept within ``own`` of the independent timer, ``googlenet_x`` times torch.compile on googlenet at batch 1, at
#: most ``gap`` above the fused critical path at batch 1 (the models of GAP_MODELS), later builds within
#: ``rebuild_s`` seconds and cold builds within ``cold_ratio`` times a cold torch.compile
GOALS = {"vs_best": 0.01, "own": 0.02, "googlenet_x": 1.6, "gap": 0.15, "rebuild_s": 5.0, "cold_ratio": 1.2}
GAP_MODELS = ("googlenet", "inception_v3", "nasnet")


def newest_rows(files: list[Path]) -> list[dict]:
    """The newest row of each (model, batch, dtype) of :data:`TABLE_MODELS` in ``files`` (a later file's row
    replaces an earlier one's; a file holds ``results``, or ``calls`` that each hold ``results``), each with the
    file it came from (``source``), in the table's order. A file may name rows whose first builds found Inductor's
    caches filled by an earlier run on the same machine (``warm_first_builds``: ``model:batch:dtype``); such a row
    keeps the cold builds of the newest earlier row that has them (``cold_source``: its file), or none."""
    rows: dict[tuple[str, int, str], dict] = {}
    for path in files:
        doc = json.loads(path.read_text())
        warm = set(doc.get("warm_first_builds", []))
        for row in doc.get("results", []) + [r for call in doc.get("calls", []) for r in call.get("results", [])]:
            if "error" not in row and "ms" in row and row["model"] in TABLE_MODELS:
                k = key(row)
                row = dict(row, source=path.name, cold_source=path.name)
                if ":".join(map(str, k)) in warm:
                    earlier = rows.get(k, {})
                    row.update(cold=earlier.get("cold", {}), cold_source=earlier.get("cold_source"))
                rows[k] = row
    return [rows[k] for k in sorted(rows, key=lambda k: (TABLE_MODELS.index(k[0]), k[1], k[2]))]


def vs_best(row: dict) -> float:
    """The kept result against the fastest of model graph, torch.compile and torch.compile + combo (+: slower)."""
    ms = row["ms"]
    best = min(v for k, v in ms.items() if k in ("model graph", "torch.compile", "torch.compile + combo kernels"))
    return ms["capturer fused"] / best - 1


def markdown_table(rows: list[dict]) -> str:
    """``rows`` (:func:`newest_rows`) as a Markdown table, then one line per goal of :data:`GOALS` saying which
    rows miss it."""
    nan = float("nan")
    lines = ["| model | batch | dtype | model graph | torch.compile | + combo | capturer fused | fused critical path | "
             "gap | vs compile | vs best | own, kept | own, torch.compile | rebuild s | cold s (fused / compile) | "
             "kept | file |", "|" + " --- |" * 17]

    def cold_from(r: dict) -> str:  # where a row's cold builds came from, when not from its own file
        source = r.get("cold_source", r["source"])
        return "" if source == r["source"] else f" (cold: {source or 'none'})"

    for r in rows:
        ms, own, cold = r["ms"], r.get("own_vs_timer", {}), r.get("cold", {})
        lines.append(
            f"| {r['model']} | {r['batch']} | {r.get('dtype', 'float32')} | {ms['model graph']:.3f} | "
            f"{ms['torch.compile']:.3f} | {ms.get('torch.compile + combo kernels', nan):.3f} | "
            f"**{ms['capturer fused']:.3f}** | {r['fused_critical_path_ms']:.3f} | {r['gap_to_critical_path']:.0%} | "
            f"{r['fused_vs_compile']:.2f}x | {vs_best(r):+.1%} | {own.get('capturer fused', nan):+.1%} | "
            f"{own.get('torch.compile', nan):+.1%} | {r.get('rebuild', {}).get('build_s', nan):.1f} | "
            f"{cold.get('fused_cold_s', nan):.0f} / {cold.get('torch_compile_cold_s', nan):.0f} | {r['fused_kept']} | "
            f"{r['source']}{cold_from(r)} |")

    def missed(test) -> str:
        names = [f"{r['model']}:{r['batch']} {r.get('dtype', 'float32')}" for r in rows if test(r)]
        return f"{len(names)} of {len(rows)}" + (f" ({', '.join(names)})" if names else "")

    def off(r: dict) -> float:  # the capturer's own torch.compile row against the independent timer
        return abs(r.get("own_vs_timer", {}).get("torch.compile", 0.0))

    def host_bound(r: dict) -> bool:  # a torch.compile call whose host time is half its latency or more
        return r.get("host_ms", {}).get("torch.compile", 0.0) >= 0.5 * r["ms"]["torch.compile"]

    def at_batch_1(r: dict, models: tuple[str, ...]) -> bool:
        return r["model"] in models and r["batch"] == 1

    def cold_ratio(r: dict) -> float:
        cold = r.get("cold", {})
        return cold.get("fused_cold_s", nan) / cold.get("torch_compile_cold_s", nan) if cold else nan

    g = GOALS
    lines += [
        "",
        f"- slower than the best baseline by more than {g['vs_best']:.0%}: "
        f"{missed(lambda r: vs_best(r) > g['vs_best'])}",
        f"- the capturer's own row of what it kept off by more than {g['own']:.0%}: "
        f"{missed(lambda r: abs(r.get('own_vs_timer', {}).get('capturer fused', 0.0)) > g['own'])}",
        f"- its own torch.compile row off by more than {g['own']:.0%}, where a call's host time is half its latency "
        f"or more: {missed(lambda r: host_bound(r) and off(r) > g['own'])}; where less: "
        f"{missed(lambda r: not host_bound(r) and off(r) > g['own'])}, at most "
        f"{max((off(r) for r in rows if not host_bound(r)), default=nan):.1%}",
        f"- under {g['googlenet_x']}x torch.compile on googlenet at batch 1: "
        f"{missed(lambda r: at_batch_1(r, ('googlenet',)) and r['fused_vs_compile'] < g['googlenet_x'])}",
        f"- over {g['gap']:.0%} above the fused critical path at batch 1 ({', '.join(GAP_MODELS)}): "
        f"{missed(lambda r: at_batch_1(r, GAP_MODELS) and r['gap_to_critical_path'] > g['gap'])}",
        f"- later builds over {g['rebuild_s']:g} s: "
        f"{missed(lambda r: r.get('rebuild', {}).get('build_s', 0.0) > g['rebuild_s'])}",
        f"- cold builds over {g['cold_ratio']}x a cold torch.compile (or not measured): "
        f"{missed(lambda r: not cold_ratio(r) <= g['cold_ratio'])}"]
    return "\n".join(lines)


def key(row: dict) -> tuple[str, int, str]:
    """A result's (model, batch, dtype); rows written before the dtype was recorded are float32."""
    return row["model"], row["batch"], row.get("dtype", "float32")


def measure_one(name: str, batch: int, args) -> None:
    """Measure one (model, batch, ``DTYPE``) in this process and file its row into ``OUT/NAME``."""
    start = time.perf_counter()
    try:
        res = bench(name, batch, args)
    except Exception as err:  # one model's failure is a result too
        traceback.print_exc()
        res = {"model": name, "batch": batch, "dtype": DTYPE, "error": f"{type(err).__name__}: {err}"}
    res["wall_s"] = time.perf_counter() - start
    import torch
    from filelock import FileLock

    from opbench.utils import written_whole

    path = Path(args.out) / args.name
    with FileLock(f"{path}.lock"):  # processes on other GPUs file their rows into the same file
        doc = json.loads(path.read_text()) if path.exists() else {"results": []}
        doc.update(device=torch.cuda.get_device_name() if torch.cuda.is_available() else None, torch=torch.__version__,
                   settings={"repeat": args.repeat, "number": args.number, "rounds": args.rounds,
                             "cudnn_benchmark": args.cudnn_benchmark, "mode": args.mode,
                             "cold_caches": args.cold_caches, "layout": args.layout, "depthwise": args.depthwise,
                             "piece_ops": args.piece_ops})
        doc["results"] = [r for r in doc["results"] if key(r) != key(res)] + [res]
        with written_whole(path) as part:  # a reader never sees half a file
            part.write_text(json.dumps(doc, indent=1, default=str) + "\n")


def measure_in_new_process(item: tuple[str, int, str], out: Path, args, flags: list[str], deadline: float,
                           gpu: int | None = None) -> None:
    """One (model, batch, dtype): its cold build alone first (``--prebuild-jobs 1``), then :func:`measure_one`
    in a process of its own; on ``gpu`` (the only GPU its processes see) where given."""
    name, batch, dtype = item
    if time.perf_counter() > deadline:
        print(f"deadline reached: {name}:{batch} {dtype} not measured", flush=True)
        return
    env = dict(os.environ) if gpu is None else dict(os.environ, CUDA_VISIBLE_DEVICES=str(gpu))
    print(f"{name}:{batch} {dtype}" + ("" if gpu is None else f" (GPU {gpu})"), flush=True)
    if args.prebuild_jobs == 1:
        prebuild_all([item], out, 1, float("inf"), env)  # the item has started: its cold build goes with it
    cmd = [sys.executable, __file__, "--out", str(out), "--one", f"{name}:{batch}", "--dtypes", dtype, *flags]
    # one process per model, batch and dtype (its rebuild inherits its caches)
    subprocess.run(cmd, env=dict(env, **inductor_caches(out, item)), check=False)
    path = out / args.name
    rows = json.loads(path.read_text())["results"] if path.exists() else []
    print(table([r for r in rows if key(r) == item]), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="out", help="output folder")
    parser.add_argument("--models", default=DEFAULT, help="model:batch, comma-separated")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=15, help="alternating samples of each callable at the end")
    parser.add_argument("--merge", default="none", choices=("none", "all", "ios"),
                        help="also build and time capturer(kernels='fused', merge=...) side by side")
    parser.add_argument("--name", default="bench_fused.json")
    parser.add_argument("--prebuild-jobs", type=int, default=1,
                        help="1: each model's cold build alone, right before its measured run; N > 1: every "
                             "model's cold build first, N at a time; 0: none")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="start no further (model, batch, dtype) after this many seconds")
    parser.add_argument("--profile-rebuild", action="store_true",
                        help="profile the rebuild (cProfile): its top functions go into the row's rebuild, the whole "
                        "profile into OUT/rebuild/MODEL_BATCH_DTYPE.prof")
    parser.add_argument("--mode", default="fast", choices=("fast", "exhaustive"),
                        help="the fused capturer's search: fast (the best predicted schedules measured) or "
                             "exhaustive (every scheduler, IOS's dynamic programme among them, measured)")
    parser.add_argument("--layout", default="inductor", choices=("inductor", "pytorch"),
                        help="the fused capturer's region layout (capturer(layout=...)): inductor (channels-last "
                             "convolutions, the default) or pytorch (the model's own)")
    parser.add_argument("--depthwise", default="auto", choices=("aten", "taps", "auto"),
                        help="how the fused capturer's regions run depthwise convolutions (capturer(depthwise=...)): "
                             "aten (PyTorch's convolution), taps (unfolded into the regions' kernels) or auto (on a "
                             "GPU, taps where every depthwise convolution is at most 3x3, else aten; the default)")
    parser.add_argument("--piece-ops", type=int, default=None, metavar="N",
                        help="the most a fused region of a new cut weighs before it is cut into pieces that worker "
                             "processes compile at once (capturer(piece_ops=...); 0: no limit; default: the "
                             "capturer's, a limit only where depthwise convolutions are unfolded)")
    parser.add_argument("--channels-last-compile", action="store_true",
                        help=f"also time '{CHANNELS_LAST_ROW}': torch.compile of the model with its 4-D weights "
                             "stored channels-last (as the fused regions take them), the input as given")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="cuDNN's benchmark mode (torch.backends.cudnn.benchmark) in the measuring and rebuilding "
                             "processes: every candidate's convolutions use the algorithm cuDNN times fastest")
    parser.add_argument("--cold-caches", action="store_true",
                        help="each model's cold build starts from empty Inductor and Triton caches of its own (which "
                             "its measured run and rebuild then use), not only an empty store of compiled regions")
    parser.add_argument("--table", default=None, metavar="FILE,...",
                        help="measure nothing: print the newest row of each (model, batch, dtype) of the table's "
                             "models in these result files (later files win) as Markdown, with the goals each misses")
    parser.add_argument("--prebuild", help=argparse.SUPPRESS)
    parser.add_argument("--rebuild", help=argparse.SUPPRESS)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--gpus", default=None, metavar="I,J,...",
                        help="measure on these GPUs at once, one (model, batch, dtype) process per GPU (default: "
                             "one process at a time on the GPU the environment gives)")
    parser.add_argument("--dtypes", "--dtype", default="float32",
                        help="comma-separated: float32 (PyTorch's default precision), float16, bfloat16; "
                             "each model and batch is measured in each")
    args = parser.parse_args()
    if args.table is not None:
        files = [Path(f.strip()) for f in args.table.split(",") if f.strip()]
        unreadable = next((f for f in files if not f.is_file()), None)
        if not files or unreadable is not None:
            parser.error(f"--table: {unreadable or 'no file'} is not a file (accepted: result files of this script, "
                         "comma-separated)")
        try:
            print(markdown_table(newest_rows(files)))
        except (ValueError, KeyError, AttributeError) as err:
            parser.error(f"--table: not a result file of this script ({type(err).__name__}: {err})")
        return 0
    from opbench.errors import OpBenchError
    from opbench.models import check_dtype

    global DTYPE, COLD_CACHES, LAYOUT, DEPTHWISE, PIECE_OPS
    try:
        dtypes = [check_dtype(d.strip()) for d in args.dtypes.split(",") if d.strip()]
        items = []
        for item in [m.strip() for m in args.models.split(",") if m.strip()]:
            name, _, batch = item.partition(":")
            items.append((name, int(batch or 1)))
        gpus = [int(g) for g in args.gpus.split(",") if g.strip()] if args.gpus else []
    except (OpBenchError, ValueError) as err:
        parser.error(f"{err} (--models takes model:batch,..., --dtypes float32, float16 or bfloat16, "
                     "--gpus GPU indices such as 0,1)")
    DTYPE, COLD_CACHES, LAYOUT, DEPTHWISE = dtypes[0], args.cold_caches, args.layout, args.depthwise
    if args.piece_ops is not None and args.piece_ops < 0:
        parser.error(f"--piece-ops {args.piece_ops}: a whole number from 0 (0: no limit)")
    PIECE_OPS = args.piece_ops
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.prebuild or args.rebuild or args.one:
        name, _, batch = (args.prebuild or args.rebuild or args.one).partition(":")
        if args.one:
            measure_one(name, int(batch), args)
            return 0
        kind = "prebuild" if args.prebuild else "rebuild"
        try:
            res = prebuild(name, int(batch)) if args.prebuild else rebuild(name, int(batch), args)
        except Exception as err:
            res = {"error": f"{type(err).__name__}: {err}"}
        (out / kind / f"{stem(name, batch, DTYPE)}.json").write_text(json.dumps(res, default=str) + "\n")
        return 0
    start = time.perf_counter()
    deadline = start + (args.deadline_s if args.deadline_s else float("inf"))
    todo = [(n, b, d) for n, b in items for d in dtypes]  # batch 1 of every model first when listed so
    if args.prebuild_jobs > 1:
        prebuild_all(todo, out, args.prebuild_jobs, deadline)
    path = out / args.name
    done = {key(r) for r in json.loads(path.read_text())["results"] if "error" not in r} if path.exists() else set()
    todo = [item for item in todo if item not in done]
    flags = ["--name", args.name, "--rounds", str(args.rounds), "--merge", args.merge, *passed_on(args)]
    if gpus:  # one item per GPU at a time, each in processes that see that GPU only
        free: queue.Queue = queue.Queue()
        for g in gpus:
            free.put(g)

        def on_a_free_gpu(item: tuple[str, int, str]) -> None:
            gpu = free.get()
            try:
                measure_in_new_process(item, out, args, flags, deadline, gpu)
            finally:
                free.put(gpu)

        with ThreadPoolExecutor(len(gpus)) as pool:
            list(pool.map(on_a_free_gpu, todo))
    else:
        for item in todo:
            measure_in_new_process(item, out, args, flags, deadline)
    if path.exists():
        print(table(json.loads(path.read_text())["results"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
