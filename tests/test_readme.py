"""The README's Python examples compile and import only names the package really has."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_has_its_library_examples() -> None:
    assert len(BLOCKS) >= 2 and any("Session(" in b for b in BLOCKS)


def test_every_python_block_compiles_and_its_imports_resolve() -> None:
    missing: list[str] = []
    for block in BLOCKS:
        tree = compile(block, "README.md", "exec",
                       flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = importlib.import_module(node.module)
                missing += [f"{node.module}.{a.name}" for a in node.names
                            if not hasattr(module, a.name)]
    assert missing == []
