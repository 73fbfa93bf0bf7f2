"""The package's shape: stages import only the stages below them, and no modules import each other in a circle.

Every import counts, including those inside functions: a deferred import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import swapdsl
from swapdsl.common.paths import GRAMMAR_DIR

PACKAGE = Path(swapdsl.__file__).resolve().parent
RUNTIME = GRAMMAR_DIR.parent / "runtime"  # ships as swapdsl.runtime
# bottom to top: a module may import its own stage and those before it
STAGES = ("common", "graph", "lang", "importer", "devices", "plan", "planning", "runtime", "api", "cli", "fuzz")
TOP_LEVEL = {"__init__": "api", "__main__": "cli", "entry": "cli"}


def modules() -> dict[str, Path]:
    found = {}
    for root, prefix in ((PACKAGE, "swapdsl"), (RUNTIME, "swapdsl.runtime")):
        for path in sorted(root.rglob("*.py")):
            if "runtime" in path.relative_to(root).parts[:1] and root == PACKAGE:
                continue
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__" and len(parts) > 1:
                parts.pop()
            name = ".".join([prefix, *parts]) if parts != ["__init__"] else prefix
            found[name] = path
    return found


def stage(module: str) -> str:
    first = module.split(".")[1] if "." in module else "__init__"
    return TOP_LEVEL.get(first, first)


def imports(module: str, path: Path, known: set[str]) -> set[str]:
    """The swapdsl modules ``module`` imports, wherever in the file."""
    out = set()
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in out if m in known and m != module}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {m: imports(m, p, set(found)) for m, p in found.items()}


def test_every_module_belongs_to_a_stage() -> None:
    assert {stage(m) for m in graph()} <= set(STAGES)


def test_no_stage_imports_a_later_stage() -> None:
    upward = [f"{m} ({stage(m)}) imports {d} ({stage(d)})" for m, deps in graph().items() for d in sorted(deps)
              if STAGES.index(stage(d)) > STAGES.index(stage(m))]
    assert not upward, "\n".join(upward)


def test_no_import_cycles() -> None:
    g = graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(g[m]):
            if state.get(d) == 1:
                cycles.append(" -> ".join(path[path.index(d):] + [d]))
            elif d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in sorted(g):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_a_cycle_and_an_upward_import(tmp_path: Path) -> None:
    """The walk above reads function-level and relative imports (else a deferred import would hide a cycle)."""
    a = tmp_path / "a.py"
    a.write_text("def f():\n    from swapdsl.planning import ga\n    from . import b\n")
    found = imports("swapdsl.plan.a", a, {"swapdsl.planning.ga", "swapdsl.plan.b"})
    assert found == {"swapdsl.planning.ga", "swapdsl.plan.b"}


def test_benchmarks_import_only_the_package() -> None:
    """bench/ scripts import swapdsl, the standard library and installed packages: nothing from tests/ or
    from beside themselves (a sys.path edit would be needed for that, so that is refused too)."""
    bench = PACKAGE.parent / "bench"
    if not bench.is_dir():  # an installed wheel has no bench/
        return
    local = {p.stem for d in (bench, PACKAGE.parent / "tests") for p in d.glob("*.py")} | {"tests"}
    outside = []
    for path in sorted(bench.glob("*.py")):
        text = path.read_text()
        outside += [f"{path.name}: edits sys.path"] if "sys.path" in text else []
        for node in ast.walk(ast.parse(text)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or "."] if isinstance(node, ast.ImportFrom) else []
            outside += [f"{path.name}: imports {n}" for n in names
                        if n.split(".")[0] in local or (isinstance(node, ast.ImportFrom) and node.level)]
    assert not outside, outside


def test_the_wheel_ships_every_package() -> None:
    """pyproject.toml lists packages by hand: a new one left off installs from a checkout and fails from
    the wheel (as `swapdsl.importer` once did, caught by `.ci/run`'s wheel install)."""
    import tomllib

    listed = set(tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(("swapdsl", *p.parent.relative_to(PACKAGE).parts)) for p in PACKAGE.rglob("__init__.py")}
    assert found <= listed, f"add to pyproject.toml's packages: {sorted(found - listed)}"
