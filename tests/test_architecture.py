"""The package layering of docs/architecture.md holds: every import of ``python/opbench`` goes down the
documented order (or across one layer without closing a cycle), and the pairs the document forbids
never import each other. The order is read from the document itself, so the two cannot drift apart."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "python" / "opbench"
DOC = ROOT / "docs" / "architecture.md"


def _layers() -> dict[str, int]:
    """Package -> layer (0 is the bottom) from the ``layers`` block of docs/architecture.md."""
    block = re.search(r"```layers\n(.*?)```", DOC.read_text(), re.S)
    assert block, "docs/architecture.md has no ```layers block"
    rows = [line.split("#")[0].strip() for line in block.group(1).splitlines()]
    rows = [row for row in rows if row]
    return {name.strip(): len(rows) - 1 - i for i, row in enumerate(rows) for name in row.split(",")}


def _forbidden() -> set[tuple[str, str]]:
    """(importer, imported) pairs from the document's ``never`` lines: ``- never: a -> b, c``."""
    pairs = set()
    for a, bs in re.findall(r"^- never: (\w+) -> ([\w, ]+)$", DOC.read_text(), re.M):
        pairs |= {(a, b.strip()) for b in bs.split(",")}
    return pairs


def _unit(path: Path, package: Path = PACKAGE) -> str:
    """The package (or top-level module) a file belongs to."""
    first = path.relative_to(package).parts[0]
    return first[:-3] if first.endswith(".py") else first


def _imports(package: Path = PACKAGE) -> dict[tuple[str, str], list[str]]:
    """(importer, imported) -> where, for every import between two units of opbench."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sorted(package.rglob("*.py")):
        src = _unit(path, package)
        if src in ("__init__", "__main__"):  # the facade re-exports; ``python -m opbench`` runs the CLI
            continue
        parts = path.relative_to(package).with_suffix("").parts
        here = parts[:-1] if path.name != "__init__.py" else parts[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    if node.module and node.module.split(".")[0] == "opbench":
                        rest = node.module.split(".")[1:]
                        targets = [rest[0]] if rest else [a.name for a in node.names]
                else:
                    base = list(here[:len(here) - (node.level - 1)]) if node.level > 1 else list(here)
                    rest = base + (node.module.split(".") if node.module else [])
                    targets = [rest[0]] if rest else [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name.split(".")[1] for a in node.names if a.name.startswith("opbench.")]
            for target in targets:
                if target != src:
                    found[(src, target)].append(f"{path.relative_to(package.parent)}:{node.lineno}")
    return found


def test_the_layers_of_the_document_cover_every_package():
    layers = _layers()
    units = {_unit(p) for p in PACKAGE.rglob("*.py")} - {"__init__", "__main__"}
    assert units <= set(layers), f"not in docs/architecture.md's layers: {sorted(units - set(layers))}"


def test_no_import_goes_up_or_is_forbidden():
    layers, forbidden = _layers(), _forbidden()
    assert forbidden, "docs/architecture.md lists no forbidden imports"
    bad = []
    for (src, dst), where in sorted(_imports().items()):
        if layers.get(dst, -1) > layers[src]:
            bad.append(f"{src} -> {dst} goes up ({where[0]})")
        if (src, dst) in forbidden:
            bad.append(f"{src} -> {dst} is forbidden ({where[0]})")
    assert not bad, "\n".join(bad)


def _cycle(edges: set[tuple[str, str]]) -> list[str] | None:
    """A cycle of the directed graph ``edges`` (its nodes in order), or None."""
    graph: dict[str, set[str]] = defaultdict(set)
    for src, dst in edges:
        graph[src].add(dst)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path + [node, nxt]
            if nxt not in state:
                found = visit(nxt, path + [node])
                if found:
                    return found
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start, [])
            if found:
                return found
    return None


def test_no_cycle_between_packages():
    cycle = _cycle(set(_imports()))
    assert cycle is None, " -> ".join(cycle)


def test_the_checker_sees_a_violation(tmp_path):
    """The checks can fail: an upward import and a cycle planted in a copy of the package are found."""
    import shutil

    copy = tmp_path / "opbench"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "ir" / "planted.py").write_text("from ..pipeline import collect\nfrom opbench.models import base\n")
    (copy / "models" / "planted.py").write_text("from ..ir import graph\n")
    imports = _imports(copy)
    layers = _layers()
    assert ("ir", "pipeline") in imports and layers["pipeline"] > layers["ir"]
    assert _cycle(set(imports)) is not None and _cycle(set(_imports())) is None


def _module_imports(package: Path) -> set[tuple[str, str]]:
    """(module, module) edges between the modules of one package: ``from .x import ...`` anywhere in a module
    (at its top or inside a function)."""
    edges = set()
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                target = node.module.split(".")[0]
                if (package / f"{target}.py").exists() and target != path.stem:
                    edges.add((path.stem, target))
    return edges


def test_no_job_imports_a_job_that_imports_it_back():
    """The jobs (the modules of ``pipeline/``) import one another without a cycle, also inside functions
    (compare and compile did). The plug-in bases elsewhere (``Profiler.create``, ``load_predictor``) import
    their implementations inside their factories, by design."""
    assert _cycle(_module_imports(PACKAGE / "pipeline")) is None


def test_loggers_follow_the_packages():
    """Each module logs under its own name (``opbench.tune.farm``, ...), a child of ``opbench``: a user
    quiets or raises one package (``logging.getLogger("opbench.tune")``) and ``--debug`` names the writer."""
    flat = []
    for path in sorted((ROOT / "python" / "opbench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                    getattr(node.value.func, "attr", "") == "getLogger" and node.value.args and \
                    isinstance(node.value.args[0], ast.Constant) and \
                    str(node.value.args[0].value).startswith("opbench"):  # another library's logger is its own
                flat.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not flat, f"loggers named by a constant, not __name__: {flat}"


def test_the_facade_and_compare_trace_torch_models_the_same_way():
    """``capturer``/``optimize`` and ``compare --backend torch`` build their torch backends with one tracing
    choice (``pipeline/compile.py``'s ``TORCH_TRACE``): no call of ``torch_backend`` names another."""
    calls = []
    for path in sorted((ROOT / "python" / "opbench").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == \
                    "torch_backend":
                trace = [k.value for k in node.keywords if k.arg == "trace"]
                calls.append((path.name, ast.unparse(trace[0]) if trace else "TORCH_TRACE"))
    assert {name for name, _ in calls} >= {"parallel.py", "compile.py"}  # the facade; compare's model_backend
    assert {trace for _, trace in calls} == {"TORCH_TRACE"}, calls


def wide_signatures(source: str, limit: int = 8) -> dict[str, int]:
    """The functions of ``source`` with more than ``limit`` named parameters (``self``/``cls`` not counted)."""
    wide = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
            count = len(names) - (names[:1] in (["self"], ["cls"]))
            if count > limit:
                wide[node.name] = count
    return wide


def test_no_job_signature_is_over_8_parameters():
    wide = {f"{path.name}:{name}": count
            for path in [*sorted((PACKAGE / "pipeline").glob("*.py")), PACKAGE / "parallel.py"]
            for name, count in wide_signatures(path.read_text()).items()}
    assert not wide, f"signatures over 8 parameters (give the job a spec instead): {wide}"


def test_the_signature_check_sees_a_wide_one():
    source = "class C:\n    def m(self, a, b, c, d, e, f, g, h): ...\ndef f(a, b, c, d, e, f, g, h, *, i=0, **kw): ..."
    assert wide_signatures(source) == {"f": 9}
