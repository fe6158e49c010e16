"""The imports of every ``hicache`` module, read from the source with ``ast`` (shared by
``tests/radix/test_architecture.py`` and ``tests/test_layering.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

import hicache

PACKAGE = Path(hicache.__file__).parent


def find_modules() -> dict[str, Path]:
    """Dotted name -> source path of every module of ``hicache`` (a package by its name)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = find_modules()


def imports_of(name: str, tree: ast.Module) -> list[tuple[str, str]]:
    """(module imported, name imported from it or "") for every hicache import of ``name``,
    wherever it is (module level, ``if TYPE_CHECKING:``, inside a function)."""
    package = name if MODULES[name].name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(head + ([base] if base else []))
            found += [(base, a.name) for a in node.names]
    return [(m, n) for m, n in found if m == "hicache" or m.startswith("hicache.")]


def module_graph() -> dict[str, set[str]]:
    """Module -> the hicache modules it imports (``from pkg import mod`` names the module)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for module, imported in imports_of(name, ast.parse(path.read_text())):
            full = f"{module}.{imported}"
            targets.add(full if full in MODULES else module)
        graph[name] = {t for t in targets if t in MODULES and t != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None
