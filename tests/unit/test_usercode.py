"""Finding the user's modules is not thrown off by a code archive that is gone.

A LocalCluster's scheduler runs in the driver's process, so Dask's
Client.upload_file (which a driver's own code may call; vcdl ships with a
worker plugin only) puts an archive on the driver's ``sys.path`` that is
deleted with the cluster's scratch directory. The next run in the same process
must still find its modules (CI once failed a later test on exactly this).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import zipfile
from pathlib import Path

import pytest

from vcdl.errors import ModelError
from vcdl.usercode import grant, import_callable, local_modules, revoke_grants


def test_a_deleted_code_archive_on_sys_path_is_skipped(tmp_path: Path) -> None:
    archive = tmp_path / "vcdl-code-0123456789ab.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("shipped_elsewhere.py", "X = 1\n")
    code = tmp_path / "code"
    code.mkdir()
    (code / "mymodel.py").write_text("import torch\n\ndef build():\n    return None\n")
    sys.path.insert(0, str(archive))
    try:
        # Caches a zipimporter for the archive, as importing from it would.
        assert importlib.machinery.PathFinder.find_spec("shipped_elsewhere", [str(archive)])
        archive.unlink()
        found = local_modules(["mymodel:build"], [code])
        assert [m.name for m in found] == ["mymodel"]
    finally:
        while str(archive) in sys.path:
            sys.path.remove(str(archive))
        sys.path_importer_cache.pop(str(archive), None)


@pytest.mark.parametrize(
    ("body", "call"),
    [
        ("import sys\nsys.exit(0)\n", "sys.exit(0)"),
        ("raise SystemExit('bye')\n", "sys.exit('bye')"),
        ("import os\nos._exit(0)\n", "os._exit(0)"),
    ],
)
def test_a_module_that_exits_at_import_is_refused_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str, call: str
) -> None:
    """It ended `vcdl train` with exit 0, nothing trained and nothing said."""
    name = f"exits_{abs(hash(body))}"
    (tmp_path / f"{name}.py").write_text(body + "def model():\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    grant([name])
    try:
        with pytest.raises(ModelError) as err:
            import_callable(f"{name}:model", what="model factory", builtins={}, error=ModelError)
    finally:
        revoke_grants()
        sys.modules.pop(name, None)
    message = str(err.value)
    assert call in message and "__main__" in message and "\n" not in message
    assert os._exit.__module__ in ("posix", "nt")  # the real one is back


def test_only_the_imports_own_exit_is_refused_not_a_forked_childs_or_another_threads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forkserver forked while a user module was being imported inherited the refusal:
    its os._exit raised, with a traceback, instead of ending the child (seen in CI)."""
    name = "forks_at_import"
    (tmp_path / f"{name}.py").write_text(
        "import os, threading\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(7)  # the child's exit, as a forkserver's\n"
        "CHILD = os.waitpid(pid, 0)[1]\n"
        "t = threading.Thread(target=lambda: None)\n"
        "t.start(); t.join()\n"
        "def model():\n    return None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    grant([name])
    try:
        import_callable(f"{name}:model", what="model factory", builtins={}, error=ModelError)
        status = sys.modules[name].CHILD
    finally:
        revoke_grants()
        sys.modules.pop(name, None)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 7
