"""The package's structure, held against the code: layers, cycles, sizes, the shipped subpackage.

Read from the import statements of every module, those inside functions included (a lazy
import is still a dependency). The layers, bottom up, are the folders of ``filesync/``;
``docs/design.md`` draws the same picture.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import filesync

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "filesync"

#: Bottom up. A module may import its own layer and the ones below, never one above.
LAYERS: dict[str, int] = {
    "tree": 0, "errors": 0, "mapping": 0, "profile_d": 0, "version": 0,
    "core": 1,
    "transport": 2,
    "host": 3,
    "endpoint": 4,
    "sync": 5,
    "session": 6,
    "cli": 7,
    "agent": 8,
    "__init__": 9, "__main__": 9,
}  # fmt: skip


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """Every filesync module ``path`` imports, at any depth of its code."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # ``from filesync.tree import server`` imports the module filesync.tree.server
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES
                     else node.module for a in node.names]
        else:
            continue
        out.update(n for n in names if n == "filesync" or n.startswith("filesync."))
    return out - {_module_name(path)}


GRAPH = {name: _imports(path) for name, path in MODULES.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else LAYERS["__init__"]


def test_every_folder_and_root_module_has_a_layer() -> None:
    unknown = sorted({m.split(".")[1] for m in MODULES if "." in m} - set(LAYERS))
    assert unknown == []


def test_dependencies_flow_downward_only() -> None:
    upward = sorted(f"{m} -> {dep}" for m, deps in GRAPH.items() for dep in deps
                    if dep in MODULES and _layer(dep) > _layer(m))
    assert upward == []


def test_the_module_graph_has_no_cycle() -> None:
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(GRAPH.get(node, ())):
            if dep not in MODULES or dep == "filesync":
                continue  # the package's face is imported by nothing below it
            if state.get(dep) == 1:
                cycles.append([*stack[stack.index(dep):], dep])
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert cycles == []


def test_no_module_is_over_600_lines() -> None:
    long = {m: n for m, p in MODULES.items()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}
    assert long == {}


def test_the_package_root_holds_at_most_12_modules() -> None:
    assert len(list(PKG.glob("*.py"))) <= 12


def test_the_shipped_subpackage_imports_only_the_standard_library_and_itself() -> None:
    bad: list[str] = []
    for path in sorted((PKG / "tree").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] if node.level == 0 else []
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if not (name.startswith("filesync.tree") or top in sys.stdlib_module_names
                        or top == "__future__"):
                    bad.append(f"{path.name}: {name}")
    assert bad == []


def test_the_bundle_holds_every_module_of_the_shipped_subpackage() -> None:
    from filesync.tree.bundle import sources

    assert set(sources()) == {m for m in MODULES if m.startswith("filesync.tree")}


def test_backends_import_only_the_public_api() -> None:
    bad: list[str] = []
    for path in sorted((ROOT / "backends").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                bad += [f"{path.name}: import {a.name}" for a in node.names
                        if a.name.startswith("filesync")]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module.startswith("filesync."):
                    bad.append(f"{path.name}: from {node.module}")
                elif node.module == "filesync":
                    bad += [f"{path.name}: {a.name}" for a in node.names
                            if a.name not in filesync.__all__]
    assert bad == []


def test_every_public_name_resolves_and_import_filesync_stays_light() -> None:
    import subprocess

    code = ("import sys, filesync\n"
            "light = 'asyncssh' not in sys.modules and 'filesync.sync.engine' not in sys.modules\n"
            "missing = [n for n in filesync.__all__ if getattr(filesync, n, None) is None]\n"
            "print(light, missing)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=True)
    assert done.stdout.split(None, 1) == ["True", "[]\n"]
