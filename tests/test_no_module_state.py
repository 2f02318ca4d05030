"""No module of ``filesync/`` keeps state of its own: warm state has one owner.

What a process keeps between passes (endpoints, state databases, watched trees, memos)
belongs to an object, ``filesync.sync.warm.WarmState``, that each session, CLI run and the
agent own and close. A module-level container that the module fills at run time would be
state shared by every owner in the process, which nobody closes. This test lists every
module-level binding of ``filesync/`` and fails on one that is a mutable container and is
changed after import (an item set or deleted, a mutating method called, or the name
rebound through ``global``). The few that must stay are listed with the reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "filesync"

#: Calls whose result is a mutable container.
CONTAINERS = {"dict", "list", "set", "bytearray", "Bounded", "WeakKeyDictionary",
              "WeakValueDictionary", "WeakSet", "defaultdict", "OrderedDict", "deque",
              "Counter", "ChainMap"}
#: Methods that change a container in place.
MUTATORS = {"append", "add", "put", "pop", "popitem", "update", "clear", "setdefault",
            "extend", "remove", "discard", "insert", "drain", "appendleft", "popleft",
            "__setitem__", "__delitem__"}

#: (module path, name) -> why it stays module-level. Keep this tiny.
ALLOWED = {
    ("session/blocking.py", "_LIVE"):
        "the live Sessions the atexit hook closes: atexit is per process, so is the set "
        "(weak: it keeps no Session alive, and holds nothing a Session owns)",
    ("session/blocking.py", "_EXITING"):
        "set once by that same atexit hook: the process is exiting, a fact of the process "
        "that every Session's next call must see",
    ("core/faults.py", "_crash_counts"):
        "test-only fault injection: FILESYNC_TEST_CRASH=NAME:N names the Nth time this "
        "process reaches a step, a count per process by definition (inert when unset)",
}


def _is_container(value: ast.expr | None) -> bool:
    if isinstance(value, ast.Dict | ast.List | ast.Set | ast.DictComp | ast.ListComp
                  | ast.SetComp):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in CONTAINERS
    return False


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """Module-level statements, those under a top-level ``if``/``try`` included."""
    out: list[ast.stmt] = []
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        node = todo.pop()
        out.append(node)
        if isinstance(node, ast.If | ast.Try):
            todo += [*node.body, *node.orelse]
            if isinstance(node, ast.Try):
                todo += [*node.finalbody, *(s for h in node.handlers for s in h.body)]
    return out


def module_containers(tree: ast.Module) -> set[str]:
    """Names bound at module level to a mutable container."""
    names: set[str] = set()
    for node in _top_level(tree):
        if isinstance(node, ast.Assign) and _is_container(node.value):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and _is_container(node.value)):
            names.add(node.target.id)
    return names


def mutated(tree: ast.Module) -> set[str]:
    """Names the module changes in place, or rebinds through ``global``."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            out |= set(node.names)
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Store | ast.Del) \
                and isinstance(node.value, ast.Name):
            out.add(node.value.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in MUTATORS and isinstance(node.func.value, ast.Name):
            out.add(node.func.value.id)
    return out


def module_state() -> dict[tuple[str, str], int]:
    """(module path, name) -> line of every module-level container changed at run time."""
    found: dict[tuple[str, str], int] = {}
    for path in sorted(PKG.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        changed = mutated(tree)
        rel = path.relative_to(PKG).as_posix()
        for node in _top_level(tree):
            targets = (node.targets if isinstance(node, ast.Assign)
                       else [node.target] if isinstance(node, ast.AnnAssign) else [])
            for t in targets:
                if isinstance(t, ast.Name) and t.id in module_containers(tree) \
                        and t.id in changed:
                    found[rel, t.id] = node.lineno
        for name in changed & _globals_rebound(tree):
            found.setdefault((rel, name), 0)
    return found


def _globals_rebound(tree: ast.Module) -> set[str]:
    return {n for node in ast.walk(tree) if isinstance(node, ast.Global) for n in node.names}


def test_no_module_keeps_a_mutable_cache() -> None:
    found = module_state()
    unexplained = {f"filesync/{rel}:{line} {name}" for (rel, name), line in found.items()
                   if (rel, name) not in ALLOWED}
    assert not unexplained, (
        "module-level state nobody owns; keep it in an object its owner closes "
        f"(filesync.sync.warm.WarmState): {sorted(unexplained)}")


def test_every_allowed_exception_still_exists_and_says_why() -> None:
    found = module_state()
    for key, why in ALLOWED.items():
        assert key in found, f"{key} is no module state any more: drop it from ALLOWED"
        assert len(why) > 40, key


def test_the_check_sees_a_module_cache() -> None:
    # The rule itself, on code that breaks it and code that does not.
    bad = ast.parse("_SEEN = {}\ndef f(k):\n    _SEEN[k] = 1\n"
                    "_POOL = Bounded(4)\ndef g(k, v):\n    _POOL.put(k, v)\n"
                    "_N = 0\ndef h():\n    global _N\n    _N += 1\n")
    assert module_containers(bad) == {"_SEEN", "_POOL"}
    assert {"_SEEN", "_POOL", "_N"} <= mutated(bad)
    fine = ast.parse("TABLE = {'a': 1}\ndef f(k):\n    return TABLE[k]\n")
    assert module_containers(fine) == {"TABLE"} and not mutated(fine)
