"""The package's import graph and privacy rules, read from the source with ``ast``.

For every module of ``hicache`` (imports under ``if TYPE_CHECKING:`` included): the module graph
is acyclic, no module imports a ``_private`` name or module of another, and no code reads
``x._attr`` unless ``x`` is ``self``, ``cls``, ``super()`` or the enclosing class.
"""

from __future__ import annotations

import ast

from tests.import_graph import MODULES, find_cycle, imports_of, module_graph


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
    assert find_cycle(module_graph()) is None, " -> ".join(find_cycle(module_graph()) or [])


def test_no_module_imports_a_private_name() -> None:
    bad = []
    for name, path in MODULES.items():
        for module, imported in imports_of(name, ast.parse(path.read_text())):
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
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert _private_reads(ast.parse("cache._evictable\nself._x\nsuper()._y()")) == [
        "line 1: cache._evictable"
    ]
