"""The package's structure, held against the code: layers, cycles, sizes, the shipped subpackage.

Read from the import statements of every module, those inside functions included (a lazy
import is still a dependency). The layers, bottom up, are the folders of ``filesync/``, then
the terminal backends: the folder ``backends/`` installs as ``filesync.backends`` (the build
configuration maps it; tests/test_packaging.py checks the wheel) and is the top layer, so
nothing in ``filesync/`` imports it. ``docs/design.md`` draws the same picture.
"""

from __future__ import annotations

import ast
import sys
import tomllib
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
    "backends": 10,
}  # fmt: skip

#: Installed package name -> repository folder: pyproject.toml's package-dir maps backends/.
_PACKAGE_DIR = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
    "package-dir"]
FOLDERS = {"filesync": PKG, **{name: ROOT / folder for name, folder in _PACKAGE_DIR.items()}}


def _module_name(path: Path) -> str:
    package, root = next((n, f) for n, f in FOLDERS.items() if path.is_relative_to(f))
    parts = [package, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for f in FOLDERS.values() for p in sorted(f.rglob("*.py"))}


def _imported_names(module: str, path: Path) -> list[str]:
    """Every module name ``path`` (the module ``module``) imports, relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            # ``from filesync.tree import server`` imports the module filesync.tree.server
            out += [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                    for a in node.names]
    return out


def _imports(module: str, path: Path) -> set[str]:
    """Every filesync module ``path`` imports, at any depth of its code."""
    names = _imported_names(module, path)
    return {n for n in names if n == "filesync" or n.startswith("filesync.")} - {module}


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


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


#: Layers that skip the ones between: (importer, never imported) -> why.
SKIPS_FORBIDDEN = {
    ("cli", "sync"): "the CLI runs passes through the session's runner (session.runner)",
    ("cli", "endpoint"): "the endpoint of a conduit is the runner's and its owner's business",
    ("cli", "host"): "host state and scans are reached through a pass, never by the CLI",
    ("endpoint", "host"): "the remote side's code knows nothing of the host's state or scans",
}


def test_the_cli_and_the_endpoint_skip_no_layer() -> None:
    bad = sorted(f"{m} -> {dep}" for m, deps in GRAPH.items() for dep in deps
                 if len(m.split(".")) > 1 and len(dep.split(".")) > 1
                 and (m.split(".")[1], dep.split(".")[1]) in SKIPS_FORBIDDEN)
    assert bad == []


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


def test_the_backends_are_the_top_layer_of_the_installed_package() -> None:
    backends = {m for m in MODULES if m.split(".")[:2] == ["filesync", "backends"]}
    assert "filesync.backends" in backends and "filesync.backends.ssh" in backends
    assert {_layer(m) for m in backends} == {max(LAYERS.values())}
    # The package's face loads its names lazily: the table must not reach the backends either.
    assert [m for m in filesync._LAZY.values() if m.startswith("filesync.backends")] == []


def test_backends_import_only_the_public_api() -> None:
    """Their own modules, and from filesync only names of ``filesync.__all__``."""
    bad: list[str] = []
    for module, path in MODULES.items():
        if not module.startswith("filesync.backends"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "filesync" and not node.level:
                bad += [f"{path.name}: {a.name}" for a in node.names
                        if a.name not in filesync.__all__]
        for name in _imported_names(module, path):
            top = name.split(".")[0]
            if name in ("filesync", "filesync.backends") or name.startswith("filesync.backends."):
                continue
            if name.startswith("filesync.") or top == "backends":
                bad.append(f"{path.name}: {name}")
    assert bad == []


def test_every_public_name_resolves_and_import_filesync_stays_light() -> None:
    import subprocess

    code = ("import sys, filesync\n"
            "light = 'asyncssh' not in sys.modules and 'filesync.sync.engine' not in sys.modules\n"
            "missing = [n for n in filesync.__all__ if getattr(filesync, n, None) is None]\n"
            "no_backends = not [m for m in sys.modules if m.startswith('filesync.backends')]\n"
            "print(light, no_backends, missing)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120, check=True)
    assert done.stdout.split(None, 2) == ["True", "True", "[]\n"]
