"""What the docs and the packages' docstrings name exists: no map of the code points at nothing.

docs/design.md's tree of the pieces is checked both ways: every entry exists,
and every module and package of ``vcdl/`` is in it.

The restructure moved modules and the docs kept naming the old places
(``vcdl/driver/budget.py``, ``vcdl/prices.toml``) for three stops. A reader
who follows a path and finds nothing stops trusting the rest.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# The docs that describe the code as it is, and the rounds' narratives in
# docs/history/, which describe it as it was at the commits they name.
CURRENT = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
HISTORY = sorted((REPO / "docs" / "history").glob("*.md"))
DOCS = CURRENT + HISTORY

# A path inside the repository: a top-level directory of it, then a file or
# directory name; not the tail of another path (``/etc/vcdl/worker.env``).
_PATH = re.compile(
    r"(?<![\w/.-])((?:vcdl|flows|benchmarks|tests|examples|docs|deploy|\.ci)/[\w./-]*\w)"
)
# Named on purpose though gone, in docs/history/ only: a round reproduces runs
# at the commits it names (docs/history/README.md says so), and gives a moved
# file's new name. A current doc names only what exists.
GONE = {
    "benchmarks/vc_vs_sequential.py",
    "flows/pipeline.py",
    "flows/task_context.py",
    "flows/workarounds/pipeline.py",  # now vcdl/driver/epoch_loop.py
}
# Not repository paths: a secret store's key in docs/spot-fleet.md's example.
NOT_PATHS = {"vcdl/ledger-password"}


def _named_paths(doc: Path) -> set[str]:
    return set(_PATH.findall(doc.read_text(encoding="utf-8")))


def _doc_id(doc: Path) -> str:
    return str(doc.relative_to(REPO))


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_path_a_doc_names_exists(doc: Path) -> None:
    allowed = NOT_PATHS | (GONE if doc in HISTORY else set())
    missing = sorted(p for p in _named_paths(doc) - allowed if not (REPO / p).exists())
    assert missing == [], f"{doc.name} names paths that do not exist: {missing}"


def test_the_gone_paths_are_still_named_and_still_gone() -> None:
    named = set().union(*(_named_paths(d) for d in HISTORY))
    for path in GONE:
        assert path in named, f"{path} is no longer named in docs/history/: drop it from GONE"
        assert not (REPO / path).exists(), f"{path} exists again: drop it from GONE"


def test_results_md_is_sized_for_readers() -> None:
    """Today's figures only (issue 49): the rounds' narratives live in docs/history/."""
    lines = (REPO / "docs" / "results.md").read_text().count("\n")
    assert lines <= 400, f"docs/results.md has {lines} lines; move narrative to docs/history/"


def _design_tree() -> list[tuple[str, str]]:
    """docs/design.md §2's tree as (parent, name) pairs: "" for a top-level entry.

    The tree is an indented block: top-level entries at 4 spaces, their
    children at 6, each followed by its description; the description's
    continuation lines are further in. "api.py, cli" names two entries.
    """
    text = (REPO / "docs" / "design.md").read_text()
    section = text.split("\n## 2. ", 1)[1].split("\n## ", 1)[0]
    entries: list[tuple[str, str]] = []
    parent = ""
    for line in section.splitlines():
        m = re.match(r"^( {4}| {6})([^\s,]+(?:, [^\s,]+)*)(?: +\S.*)?$", line)
        if not m:
            continue
        for name in m.group(2).split(", "):
            if len(m.group(1)) == 4:
                parent = name
                entries.append(("", name))
            else:
                entries.append((parent, name))
    return entries


def _exists(parent: str, name: str) -> bool:
    """A directory ("x/"), a file ("x.py"), or either for a bare name ("cli")."""
    where = REPO / parent
    if name.endswith("/"):
        return (where / name).is_dir()
    return (where / name).exists() or (where / f"{name}.py").is_file()


def test_the_design_tree_names_what_exists() -> None:
    entries = _design_tree()
    assert ("", "vcdl/") in entries and ("", "flows/") in entries, "design.md §2 has no tree"
    missing = [f"{parent}{name}" for parent, name in entries if not _exists(parent, name)]
    assert missing == [], f"docs/design.md §2 names what does not exist: {missing}"


def test_the_design_tree_names_every_module_of_vcdl() -> None:
    tree = _design_tree()
    named = {name.removesuffix("/").removesuffix(".py") for p, name in tree if p == "vcdl/"}
    vcdl = REPO / "vcdl"
    modules = {p.stem for p in vcdl.glob("*.py") if p.stem != "__init__"}
    modules |= {p.name for p in vcdl.iterdir() if (p / "__init__.py").is_file()}
    assert sorted(modules - named) == [], "docs/design.md §2's tree leaves these out"


def _packages() -> list[Path]:
    return sorted(p.parent for p in (REPO / "vcdl").glob("*/__init__.py"))


@pytest.mark.parametrize("package", _packages(), ids=lambda p: p.name)
def test_a_package_docstring_maps_its_modules(package: Path) -> None:
    """A package whose docstring lists modules (``:mod:`.x```) lists existing ones, all of them."""
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    named = set(re.findall(r":mod:`\.(\w+)", doc))
    if not named:
        return  # no module map (metrics, for one, names its two modules in prose)
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    assert sorted(named - modules) == [], f"vcdl.{package.name} names modules it lacks"
    assert sorted(modules - named) == [], f"vcdl.{package.name}'s docstring leaves these out"


def test_the_workarounds_table_names_every_workaround() -> None:
    package = REPO / "flows" / "workarounds"
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
    named = set(re.findall(r"^``(\w+)``", doc, flags=re.M))
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    assert named == modules


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _outside_code(text: str) -> str:
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


@functools.cache
def _anchors(doc: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} (.+)$", _outside_code(doc.read_text()), flags=re.M):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")  # GitHub numbers repeated headings
    return out


def test_slugs_follow_githubs_rule() -> None:
    assert _slug("Why 32 workers miss 90 % here") == "why-32-workers-miss-90--here"
    assert (
        _slug("N = 64 tried, 2026-11-27: out of memory") == "n--64-tried-2026-11-27-out-of-memory"
    )
    assert _slug("`merge.fold` under chaos") == "mergefold-under-chaos"


@pytest.mark.parametrize("doc", DOCS, ids=_doc_id)
def test_every_link_to_a_heading_finds_it(doc: Path) -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", _outside_code(doc.read_text())):
        path, _, fragment = target.partition("#")
        linked = (doc.parent / path).resolve() if path else doc
        if linked.suffix == ".md" and fragment not in _anchors(linked):
            broken.append(target)
    assert broken == [], f"{doc.name} links to headings that do not exist: {broken}"
