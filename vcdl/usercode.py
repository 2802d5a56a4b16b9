"""The user's code: callables named by import path, and the module files they live in.

A run may name its model factory, its objective and its metrics by import
path, ``"package.module:function"`` (``attr`` may be dotted). This module
resolves such a path to the callable (:func:`import_callable`), with one-line
errors, and finds the files of the user's own modules — those beside the run's
config file or in the current directory, as opposed to installed packages —
so that the driver can import them and ship them to every Dask worker
(:func:`local_modules`, used by ``flows/cluster.py``).

Which modules an import path may name is the operator's choice
(docs/design.md §7, docs/configuration.md#your-code-and-the-allow-list):
vcdl's built-ins always; otherwise only modules under a prefix of
``$VCDL_ALLOW_IMPORTS`` (comma-separated, ``*`` for any) or granted in this
process by a trusted caller (:func:`grant`: the CLI and the Python API grant
the modules beside the config they were given; a worker, what its driver
allowed). :func:`check_allowed` runs before anything is imported, and
:func:`import_callable` calls it, so no path imports a module it does not
allow.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.machinery
import os
import re
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vcdl.errors import VcdlError

ALLOW_ENV = "VCDL_ALLOW_IMPORTS"
# Module prefixes a trusted caller allowed in this process besides $VCDL_ALLOW_IMPORTS.
_GRANTED: set[str] = set()
_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")

# Directories importable_here() put on this process's sys.path: users' code, never
# "installed" (a driver that runs several configs has several of them).
_MADE_IMPORTABLE: set[Path] = set()


def split_path(path: str) -> tuple[str, str] | None:
    """(module, attribute) of ``"package.module:attr"``, or None if it is not one."""
    module, sep, attr = path.partition(":")
    if not sep or not module or not attr or ":" in attr:
        return None
    return module, attr


def env_allowance() -> tuple[str, ...]:
    """The module prefixes ``$VCDL_ALLOW_IMPORTS`` allows (``"*"``: any)."""
    raw = os.environ.get(ALLOW_ENV, "")
    return tuple(p for p in (x.strip() for x in raw.split(",")) if p)


def grant(prefixes: Iterable[str]) -> None:
    """Allow import paths under ``prefixes`` in this process, besides ``$VCDL_ALLOW_IMPORTS``.

    For trusted callers only: the CLI and the Python API (for the modules
    beside the config they were given), and a worker (for what its driver
    allowed). Never from a Prefect form's input.
    """
    for p in prefixes:
        if p == "*" or _MODULE.fullmatch(p):
            _GRANTED.add(p)


def granted() -> tuple[str, ...]:
    """What :func:`grant` allowed in this process."""
    return tuple(sorted(_GRANTED))


def revoke_grants() -> None:
    """Forget every :func:`grant` of this process (tests)."""
    _GRANTED.clear()


def _under(module: str, prefixes: Iterable[str]) -> bool:
    return any(p == "*" or module == p or module.startswith(p + ".") for p in prefixes)


def check_allowed(
    spec: str,
    *,
    what: str,
    builtins: Mapping[str, str],
    error: type[VcdlError],
    grants: bool = True,
) -> None:
    """Raise ``error`` (one line, naming ``$VCDL_ALLOW_IMPORTS``) unless ``spec`` may be imported.

    Imports nothing. A built-in name, or the import path one stands for, is
    always allowed; any other path only if its module is under a prefix of
    ``$VCDL_ALLOW_IMPORTS`` or (``grants``) of this process's :func:`grant`.
    A spec that is no import path at all is left to :func:`import_callable`.
    """
    if not isinstance(spec, str) or spec in builtins or spec in builtins.values():
        return
    parts = split_path(spec)
    if parts is None:
        return
    module = parts[0]
    allowed = env_allowance() + (granted() if grants else ())
    if _MODULE.fullmatch(module) and _under(module, allowed):
        return
    shown = spec if len(spec) <= 120 else spec[:117] + "..."
    raise error(
        f"{what} {shown!r}: module '{module[:80]}' is not allowed to be imported; the operator "
        f"allows modules with {ALLOW_ENV} (comma-separated module prefixes, '*' for any) in "
        "the driver's environment (`vcdl train CONFIG` also allows the modules beside CONFIG)"
    )


def grant_beside_config(specs: Iterable[str], code_dir: str | None) -> list[str]:
    """Grant the run's own modules found in its config's directory (else the cwd); their names.

    What "the config's author may run their own code" means for ``vcdl
    train CONFIG`` and the Python API: the top-level modules the import paths
    ``specs`` name that are files beside the config (and the local modules
    they import). Installed and standard-library modules are not granted.
    """
    where = Path(code_dir).expanduser().resolve() if code_dir else Path.cwd().resolve()
    names = [m.name for m in local_modules(specs, [where])]
    grant(names)
    return names


def import_callable(
    spec: str,
    *,
    what: str,
    builtins: Mapping[str, str],
    error: type[VcdlError],
) -> Callable[..., Any]:
    """The callable ``spec`` names: a key of ``builtins`` or an import path.

    ``what`` names it in messages ("model factory", "objective"); every
    failure is ``error`` with one line.
    """
    if not isinstance(spec, str):
        raise error(f"{what} must be a string, got {type(spec).__name__}")
    parts = split_path(builtins.get(spec, spec))
    if parts is None:
        raise error(
            f"{what} {spec!r} is neither a built-in ({', '.join(builtins)}) nor an import "
            "path 'package.module:function'"
        )
    module_name, attr = parts
    # Before anything is imported: the operator decides which modules may run.
    check_allowed(spec, what=what, builtins=builtins, error=error)
    try:
        with _no_exit():
            obj: Any = importlib.import_module(module_name)
    except _ExitAtImport as exc:
        raise error(
            f"{what} {spec!r}: module '{module_name}' called {exc} while being imported; a "
            'module must not exit when imported (put that code under `if __name__ == "__main__":`)'
        ) from None
    except ImportError as exc:
        raise error(
            f"{what} {spec!r}: cannot import module '{module_name}': {type(exc).__name__}: {exc}"
        ) from exc
    except Exception as exc:
        # A user's module may fail at import for any reason; say so plainly.
        raise error(
            f"{what} {spec!r}: importing module '{module_name}' raised {type(exc).__name__}: {exc}"
        ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise error(
                f"{what} {spec!r}: module '{module_name}' has no attribute '{attr}'"
            ) from exc
    if not callable(obj):
        raise error(f"{what} {spec!r} is not callable (it is a {type(obj).__name__})")
    return obj


class _ExitAtImport(Exception):
    """A module called ``os._exit`` while it was being imported (see :func:`_no_exit`)."""


@contextlib.contextmanager
def _no_exit() -> Iterator[None]:
    """Turn an exit at import (``sys.exit``, ``exit()``, ``os._exit``) into a refusal.

    A user's module that exits when imported ended ``vcdl train`` with exit 0,
    nothing trained and nothing said. ``SystemExit`` is caught; ``os._exit``
    would end the process at once, past every handler, so it is replaced
    while the import runs, for this thread of this process only.
    """

    real = os._exit
    importer, pid = threading.get_ident(), os.getpid()

    def refuse(code: int) -> None:
        # Only the import's own call is refused: another thread's, or a child's forked
        # meanwhile (a forkserver, a worker), exits as it always does.
        if threading.get_ident() != importer or os.getpid() != pid:
            real(code)
        raise _ExitAtImport(f"os._exit({code})")

    os._exit = refuse  # type: ignore[assignment]
    try:
        yield
    except SystemExit as exc:
        raise _ExitAtImport(f"sys.exit({exc.code!r})") from None
    finally:
        os._exit = real


@dataclass(frozen=True)
class LocalModule:
    """A top-level module of the user's, found in a code directory: a file or a package."""

    name: str
    path: Path
    """The ``.py`` file, or the package's directory."""

    @property
    def is_package(self) -> bool:
        return self.path.is_dir()


def _find(name: str, dirs: Sequence[Path]) -> LocalModule | None:
    for d in dirs:
        file, package = d / f"{name}.py", d / name / "__init__.py"
        if file.is_file():
            return LocalModule(name, file.resolve())
        if package.is_file():
            return LocalModule(name, package.parent.resolve())
    return None


def _installed(name: str, dirs: Sequence[Path]) -> bool:
    """True if ``name`` imports from somewhere other than ``dirs`` (the standard library,
    site-packages): such a module is the worker image's business, not shipped.

    Looked up on ``sys.path`` without ``dirs`` (nor the current directory),
    not in ``sys.modules``: the driver may have imported the user's module
    already, or a module of that name from another run's directory.
    """
    if name in sys.builtin_module_names or name in sys.stdlib_module_names:
        return True
    # Also every directory a run made importable here: those hold users' code too.
    local = {d.resolve() for d in dirs} | _MADE_IMPORTABLE
    # Entries that are gone are skipped: an archive that Dask's Client.upload_file
    # put on this process's sys.path (a LocalCluster's scheduler runs here) goes
    # with the cluster's scratch directory, and its cached zipimporter raises
    # FileNotFoundError when asked. vcdl ships with a worker plugin only (see
    # flows/cluster.py); this guards a driver whose own code used upload_file.
    path = [p for p in sys.path if p and Path(p).exists() and Path(p).resolve() not in local]
    try:
        return importlib.machinery.PathFinder.find_spec(name, path) is not None
    except OSError:
        return False


def _imports(module: LocalModule) -> set[str]:
    """Top-level names the module's files import (relative imports stay inside a package)."""
    files = sorted(module.path.rglob("*.py")) if module.is_package else [module.path]
    names: set[str] = set()
    for f in files:
        try:
            tree = ast.parse(f.read_text(encoding="utf-8"), str(f))
        except (OSError, SyntaxError, UnicodeDecodeError):
            continue  # the import itself will say what is wrong with it
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return names


def local_modules(specs: Iterable[str], dirs: Sequence[Path]) -> list[LocalModule]:
    """The user's modules the import paths ``specs`` need, found in ``dirs``, in import order.

    Starts from each spec's top-level module and follows the imports of the
    modules found, so a factory in ``mymodel.py`` that imports ``layers.py``
    beside it brings both. Modules that import from elsewhere (installed
    packages, the standard library, vcdl itself) are not the user's.
    """
    found: dict[str, LocalModule] = {}
    todo = [p[0].split(".")[0] for s in specs if (p := split_path(s)) is not None]
    while todo:
        name = todo.pop(0)
        if name in found or name == "vcdl":
            continue
        module = _find(name, dirs)
        if module is None or _installed(name, dirs):
            continue
        found[name] = module
        todo.extend(sorted(_imports(module) - set(found)))
    return list(found.values())


def code_dirs(code_dir: str | None) -> list[Path]:
    """Where a run's own modules are looked for: its config file's directory, then the cwd."""
    dirs = [Path(code_dir).expanduser().resolve()] if code_dir else []
    cwd = Path.cwd().resolve()
    return dirs + ([cwd] if cwd not in dirs else [])


def importable_here(dirs: Sequence[Path], specs: Iterable[str] = ()) -> None:
    """Make the user's modules in ``dirs`` importable in this process (the driver).

    A module of the same name imported earlier from elsewhere (another run's
    directory, in a process that drives several) is forgotten, so that this
    run's is imported.
    """
    for d in reversed(dirs):
        _MADE_IMPORTABLE.add(d.resolve())
        if str(d) not in sys.path:
            sys.path.insert(0, str(d))
    for m in local_modules(specs, dirs):
        loaded = sys.modules.get(m.name)
        origin = getattr(getattr(loaded, "__spec__", None), "origin", None)
        if origin and not Path(origin).resolve().is_relative_to(m.path.parent):
            for key in [k for k in sys.modules if k == m.name or k.startswith(m.name + ".")]:
                del sys.modules[key]
    importlib.invalidate_caches()


def bundle(modules: Sequence[LocalModule], into: Path) -> Path:
    """The modules as one zip archive in directory ``into``, named by its content's hash.

    A worker puts the archive on its ``sys.path`` and imports the modules from
    it (Dask's ``UploadFile`` worker plugin), so they import each other as they do
    here. Files only: a module that reads data files beside it must be
    installed in the workers' image instead.
    """
    import hashlib
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as archive:
        for m in modules:
            if m.is_package:
                for f in sorted(m.path.rglob("*.py")):
                    rel = f.relative_to(m.path.parent).as_posix()
                    archive.writestr(zipfile.ZipInfo(rel, (1980, 1, 1, 0, 0, 0)), f.read_bytes())
            else:
                info = zipfile.ZipInfo(m.path.name, (1980, 1, 1, 0, 0, 0))
                archive.writestr(info, m.path.read_bytes())
    data = buf.getvalue()
    into.mkdir(parents=True, exist_ok=True)
    path = into / f"vcdl-code-{hashlib.sha256(data).hexdigest()[:12]}.zip"
    path.write_bytes(data)
    return path


def _is_main_guard(stmt: ast.stmt) -> bool:
    """``if __name__ == "__main__":`` (either way round)."""
    if not isinstance(stmt, ast.If) or not isinstance(stmt.test, ast.Compare):
        return False
    test = stmt.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(mains) == 1


def guarded_at(source: str, line: int) -> bool | None:
    """Whether ``line`` of a script's ``source`` runs only under ``if __name__ == "__main__":``.

    None when that cannot be told (the source does not parse, or no top-level
    statement holds the line).
    """
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    for stmt in tree.body:
        if stmt.lineno <= line <= (stmt.end_lineno or stmt.lineno):
            return _is_main_guard(stmt)
    return None


def unguarded_script_call() -> str | None:
    """Where a script calls vcdl at its top level outside ``if __name__ == "__main__":``.

    A LocalCluster's workers import the driver's script again (as
    ``__mp_main__``): a run started at its top level would start again in
    every worker (another driver of the same run, refused by its lease, and
    workers that fail to start). Returns ``"path:line"`` of the script's
    top-level statement the call comes from (``__main__``, or its re-import
    ``__mp_main__``; through any functions it calls) when that statement is
    not the guard, else None.
    """
    # The script's own top-level frame, however deep the call (a main() it calls).
    frame = sys._getframe(1)
    while frame is not None and not (
        frame.f_code.co_name == "<module>"
        and frame.f_globals.get("__name__") in ("__main__", "__mp_main__")
    ):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return None
    path = frame.f_globals.get("__file__")
    if not isinstance(path, str):
        return None  # python -c, stdin, a notebook: nothing re-imports it
    try:
        source = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    if guarded_at(source, frame.f_lineno) is False:
        return f"{path}:{frame.f_lineno}"
    return None
