"""The package's import graph and privacy rules, read from the source with ``ast``.

For every module of ``hicache`` (imports under ``if TYPE_CHECKING:`` included): the module graph
is acyclic, no module imports a ``_private`` name or module of another, and no code reads
``x._attr`` unless ``x`` is ``self``, ``cls``, ``super()`` or the enclosing class.
"""

from __future__ import annotations

import ast
from pathlib import Path

import hicache

PACKAGE = Path(hicache.__file__).parent


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, tree: ast.Module) -> list[tuple[str, str]]:
    """(module imported, name imported from it or "") for every hicache import of ``name``."""
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


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        targets = set()
        for module, imported in _imports(name, ast.parse(path.read_text())):
            full = f"{module}.{imported}"
            targets.add(full if full in MODULES else module)
        graph[name] = {t for t in targets if t in MODULES and t != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
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


def _private_reads(tree: ast.Module) -> list[str]:
    """``x._attr`` where ``x`` is not ``self``/``cls``/``super()``/the enclosing class."""
    bad = []

    def visit(node: ast.AST, classes: tuple[str, ...]) -> None:
        if isinstance(node, ast.ClassDef):
            classes = (*classes, node.name)
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            owner = node.value
            own = (isinstance(owner, ast.Name) and owner.id in ("self", "cls", *classes)) or (
                isinstance(owner, ast.Call)
                and isinstance(owner.func, ast.Name)
                and owner.func.id == "super"
            )
            stdlib = ast.unparse(node) == "os._exit"  # documented API, underscore and all
            if not own and not stdlib and not node.attr.startswith("__"):
                bad.append(f"line {node.lineno}: {ast.unparse(node)}")
        for child in ast.iter_child_nodes(node):
            visit(child, classes)

    visit(tree, ())
    return bad


def test_the_module_graph_is_acyclic() -> None:
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def test_no_module_imports_a_private_name() -> None:
    bad = []
    for name, path in MODULES.items():
        for module, imported in _imports(name, ast.parse(path.read_text())):
            parts = [*module.split("."), *([imported] if imported else [])]
            if any(p.startswith("_") and not p.startswith("__") for p in parts):
                bad.append(f"{name}: {module} {imported}")
    assert not bad, bad


def test_no_module_reads_another_objects_private_attributes() -> None:
    bad = {
        name: found
        for name, path in MODULES.items()
        if (found := _private_reads(ast.parse(path.read_text())))
    }
    assert not bad, bad


def test_the_checks_see_a_cycle_and_a_private_read() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
    assert _private_reads(ast.parse("cache._evictable\nself._x\nsuper()._y()")) == [
        "line 1: cache._evictable"
    ]
