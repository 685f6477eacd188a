"""The package's imports form no cycle, at module level or inside functions (config and weights
used to import each other; loader and torch did in a function), and stages never import Prefect
or the flows."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lospmm"


def _module_imports() -> dict[str, set[str]]:
    graph = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):  # every import, in functions too
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lospmm"):
                deps.add(node.module)
                # `from lospmm.flows.storage import schemas` imports the module lospmm.flows.storage.schemas
                deps |= {f"{node.module}.{a.name}" for a in node.names
                         if (PACKAGE.parent / node.module.replace(".", "/") / f"{a.name}.py").exists()}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name.startswith("lospmm")}
        graph[name] = deps
    return graph


def test_no_import_cycles():
    graph = _module_imports()
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in graph.get(m, ()):
            assert state.get(d) != 1, " -> ".join(path + [d])
            if d not in state:
                visit(d, path + [d])
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m, [m])


def test_stages_are_pure():
    for path in (PACKAGE / "stages").glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not {n for n in names if n.startswith(("prefect", "lospmm.flows"))}, path.name


def test_the_kernel_package_stands_on_its_own():
    """lospmm.kernel describes, renders, checks, packages and times every kernel without the flows or
    Prefect; of the stages it names reorder's Tiles in annotations alone (never imported at run time)."""
    graph = _module_imports()
    for module, deps in graph.items():
        if not module.startswith("lospmm.kernel"):
            continue
        assert not {d for d in deps if d.startswith(("lospmm.flows", "prefect"))}, module
        assert {d for d in deps if d.startswith("lospmm.stages")} <= {"lospmm.stages.reorder"}, module


def test_the_stages_folder_holds_the_stages_and_nothing_else():
    from lospmm.stages import STAGE_TABLE

    modules = {p.stem for p in (PACKAGE / "stages").glob("*.py")} - {"__init__"}
    assert modules == {s.module.rsplit(".", 1)[1] for s in STAGE_TABLE}
