"""The weight store's seams hold: nothing reaches into WeightStore or a store module's privates.

The streaming reader and writer once used ten private members of
``WeightStore`` through a protocol of them, and imported private helpers of
``layout.py``; both now call the group layer (``vcdl/store/groups.py``).
These checks read the source (``ast``), so they hold for code no test runs.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STORE = REPO / "vcdl" / "store"
WEIGHTS = STORE / "weights.py"
MAX_LINES = 650


def _sources() -> Iterator[tuple[Path, ast.Module]]:
    for top in ("vcdl", "flows"):
        for path in sorted((REPO / top).rglob("*.py")):
            yield path, ast.parse(path.read_text(), filename=str(path))


def _weight_store_privates() -> set[str]:
    """The private methods of WeightStore and the private attributes it sets on itself."""
    tree = ast.parse(WEIGHTS.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "WeightStore")
    names = {
        n.name
        for n in cls.body
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("_")
    }
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
        ):
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_the_privates_are_found() -> None:
    """The check below looks for something: the store's own internals."""
    assert {"_groups", "_write", "_read"} <= _weight_store_privates()


def test_no_private_member_of_weight_store_is_named_outside_its_module() -> None:
    """``x._groups``, ``store._write(...)``: no module but weights.py names a private of
    WeightStore on anything but ``self``, and no protocol declares one (as the streaming
    module's ``GroupStore`` did, to use them)."""
    privates = _weight_store_privates()
    found = []
    for path, tree in _sources():
        if path == WEIGHTS:
            continue
        where = path.relative_to(REPO)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr in privates
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{where}:{node.lineno}: .{node.attr}")
            if isinstance(node, ast.ClassDef) and any(
                (isinstance(b, ast.Name) and b.id == "Protocol")
                or (isinstance(b, ast.Attribute) and b.attr == "Protocol")
                for b in node.bases
            ):
                for item in node.body:
                    name = (
                        item.name
                        if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
                        else item.target.id
                        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                        else None
                    )
                    if name in privates:
                        found.append(f"{where}:{item.lineno}: protocol {node.name}.{name}")
    assert found == []


def test_no_module_imports_a_private_name_of_a_store_module() -> None:
    """What store modules share is public and documented: no ``from vcdl.store.x import _y``."""
    found = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("vcdl.store"):
                for alias in node.names:
                    if alias.name.startswith("_"):
                        found.append(f"{path.relative_to(REPO)}:{node.lineno}: {alias.name}")
    assert found == []


def test_only_the_group_layer_writes_to_the_backend() -> None:
    """The crash-safe start and the commit are written once: no store module but groups.py
    sets or deletes a key of the Zarr store (``<x>.store.set(...)``, ``.delete_dir(...)``)."""
    writes = {"set", "set_if_not_exists", "delete", "delete_dir"}
    found = []
    for path in sorted(STORE.glob("*.py")):
        if path.name == "groups.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in writes
                and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr in ("store", "_store")
            ):
                found.append(f"{path.name}:{node.lineno}: .{node.func.value.attr}.{node.func.attr}")
    assert found == []


def test_no_store_module_is_over_the_limit() -> None:
    """Split along seams, each store module small enough to read whole."""
    sizes = {p.name: len(p.read_text().splitlines()) for p in STORE.glob("*.py")}
    assert {n: s for n, s in sizes.items() if s > MAX_LINES} == {}


def test_each_store_module_says_what_it_owns() -> None:
    """Every store module opens with a docstring; the split ones name what they own."""
    for path in STORE.glob("*.py"):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        assert doc, f"{path.name} has no docstring"
    for name in ("arrays", "backend", "groups", "layout", "streaming", "weights"):
        doc = ast.get_docstring(ast.parse((STORE / f"{name}.py").read_text())) or ""
        assert "This module owns" in doc, f"{name}.py does not say what it owns"
