"""The package's layers, read from its source: the core imports no event
loop and nothing above it; no module imports both
asyncio and trio; and no two modules import each other, directly or in a
ring (``TYPE_CHECKING`` imports count; imports inside a function, made
when it runs, do not)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set

import friendsock

PACKAGE = Path(friendsock.__file__).parent


def _modules() -> Dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _top_level_imports(name: str) -> Set[str]:
    """What ``name`` imports as it is imported: its top-level statements,
    and those under an ``if`` (``TYPE_CHECKING``, a version test)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    statements: List[ast.stmt] = []
    for node in ast.parse(path.read_text()).body:
        statements.extend(node.body + node.orelse if isinstance(node, ast.If) else [node])
    imported = set()
    for node in statements:
        if isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                whole = f"{base}.{alias.name}"
                imported.add(whole if whole in MODULES else base)
    return imported


def _ours(names: Set[str]) -> Set[str]:
    found = set()
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def test_no_module_is_in_an_import_ring() -> None:
    graph = {name: _ours(_top_level_imports(name)) - {name} for name in MODULES}
    rings = []
    for start in graph:
        # Depth-first from each module: a path back to it is a ring.
        stack = [(start, [start])]
        seen = set()
        while stack:
            name, path = stack.pop()
            for after in graph[name]:
                if after == start:
                    rings.append(path + [start])
                elif after not in seen:
                    seen.add(after)
                    stack.append((after, path + [after]))
    assert rings == []


def test_the_core_imports_no_loop_no_socket_and_nothing_above_it() -> None:
    for name in MODULES:
        if not name.startswith("friendsock._core"):
            continue
        imported = _top_level_imports(name)
        # (socket's address conversions, inet_pton, are no I/O: _pcap's.)
        assert not imported & {"asyncio", "trio", "uvloop", "select", "selectors", "ssl"}, name
        assert all(not each.startswith("friendsock") or each.startswith("friendsock._core")
                   for each in imported), name


def test_no_module_imports_both_asyncio_and_trio() -> None:
    for name in MODULES:
        imported = {each.partition(".")[0] for each in _top_level_imports(name)}
        assert not {"asyncio", "trio"} <= imported, name
