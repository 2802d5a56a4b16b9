"""vcdl.dask_tls: the driver's Dask TLS settings judged in one line before a tls:// connection."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import dask
import distributed  # noqa: F401  (its defaults: a config.set restores only keys that existed)
import pytest
from cryptography.hazmat.primitives import serialization

from tests.tlscerts import CA, Leaf
from vcdl.dask_tls import client_tls_problem

ADDRESS = "tls://10.0.0.11:8786"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> tuple[CA, Leaf]:
    ca = CA(tmp_path_factory.mktemp("pki"))
    return ca, ca.issue("client")


def _tls(ca: Path | str | None, cert: Path | str | None, key: Path | str | None) -> object:
    return dask.config.set(
        {
            "distributed.comm.tls.ca-file": None if ca is None else str(ca),
            "distributed.comm.tls.client.cert": None if cert is None else str(cert),
            "distributed.comm.tls.client.key": None if key is None else str(key),
        }
    )


@pytest.fixture(autouse=True)
def _no_tls_config() -> Iterator[None]:
    with _tls(None, None, None), dask.config.set({"distributed.comm.require-encryption": None}):
        yield


def test_usable_files_pass(pki: tuple[CA, Leaf]) -> None:
    ca, leaf = pki
    with _tls(ca.cert, leaf.cert, leaf.key):
        assert client_tls_problem(ADDRESS) is None


def test_a_certificate_file_holding_its_key_passes(pki: tuple[CA, Leaf], tmp_path: Path) -> None:
    """Dask allows the key in the certificate's file: no key setting then."""
    ca, leaf = pki
    both = tmp_path / "both.pem"
    both.write_bytes(leaf.cert.read_bytes() + leaf.key.read_bytes())
    with _tls(ca.cert, both, None):
        assert client_tls_problem(ADDRESS) is None


def test_pem_text_in_the_settings_is_left_to_dask(pki: tuple[CA, Leaf]) -> None:
    ca, leaf = pki
    with _tls(ca.cert.read_text(), leaf.cert.read_text(), leaf.key.read_text()):
        assert client_tls_problem(ADDRESS) is None


def test_tcp_addresses_need_nothing(pki: tuple[CA, Leaf]) -> None:
    assert client_tls_problem("tcp://10.0.0.11:8786") is None
    assert client_tls_problem("10.0.0.11:8786") is None


def test_tcp_while_encryption_is_required_names_the_setting() -> None:
    with dask.config.set({"distributed.comm.require-encryption": True}):
        problem = client_tls_problem("tcp://10.0.0.11:8786")
    assert problem is not None and "require-encryption" in problem and "tls://" in problem


def test_wss_takes_the_same_settings() -> None:
    problem = client_tls_problem("wss://10.0.0.11:8786")
    assert problem is not None and "wss://" in problem and "ca-file" in problem


@pytest.mark.parametrize("unset", ["ca", "cert"])
def test_an_unset_setting_names_it_and_its_variable(pki: tuple[CA, Leaf], unset: str) -> None:
    ca, leaf = pki
    with _tls(None if unset == "ca" else ca.cert, None if unset == "cert" else leaf.cert, None):
        problem = client_tls_problem(ADDRESS)
    assert problem is not None and "\n" not in problem
    wanted = {"ca": "CA_FILE", "cert": "CLIENT__CERT"}[unset]
    assert f"DASK_DISTRIBUTED__COMM__TLS__{wanted}" in problem, problem


@pytest.mark.parametrize("which", ["ca", "cert", "key"])
def test_a_missing_file_is_one_line_naming_it(
    pki: tuple[CA, Leaf], tmp_path: Path, which: str
) -> None:
    ca, leaf = pki
    gone = tmp_path / "gone.pem"
    files = {"ca": ca.cert, "cert": leaf.cert, "key": leaf.key} | {which: gone}
    with _tls(files["ca"], files["cert"], files["key"]):
        problem = client_tls_problem(ADDRESS)
    assert problem is not None and "\n" not in problem
    assert str(gone) in problem and "No such file" in problem, problem


def test_a_directory_is_not_a_file(pki: tuple[CA, Leaf], tmp_path: Path) -> None:
    _, leaf = pki
    with _tls(tmp_path, leaf.cert, leaf.key):
        problem = client_tls_problem(ADDRESS)
    assert problem is not None and "is a directory" in problem


def test_an_unreadable_file_says_so(pki: tuple[CA, Leaf], tmp_path: Path) -> None:
    import os

    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    ca, leaf = pki
    locked = tmp_path / "locked.pem"
    locked.write_bytes(leaf.key.read_bytes())
    locked.chmod(0)
    with _tls(ca.cert, leaf.cert, locked):
        problem = client_tls_problem(ADDRESS)
    assert problem is not None and "Permission denied" in problem


def test_a_key_of_another_certificate_does_not_load(pki: tuple[CA, Leaf], tmp_path: Path) -> None:
    ca, leaf = pki
    other = ca.issue("other")
    with _tls(ca.cert, leaf.cert, other.key):
        problem = client_tls_problem(ADDRESS)
    assert problem is not None and "do not load" in problem and "\n" not in problem, problem


def test_a_file_that_is_no_pem_does_not_load(pki: tuple[CA, Leaf], tmp_path: Path) -> None:
    _, leaf = pki
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with _tls(junk, leaf.cert, leaf.key):
        problem = client_tls_problem(ADDRESS)
    assert problem is not None and "do not load" in problem, problem


def test_an_encrypted_key_is_refused_without_a_prompt(pki: tuple[CA, Leaf], tmp_path: Path) -> None:
    ca, leaf = pki
    key = serialization.load_pem_private_key(leaf.key.read_bytes(), None)
    locked = tmp_path / "encrypted-key.pem"
    locked.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"passphrase-9f2c"),
        )
    )
    with _tls(ca.cert, leaf.cert, locked):
        problem = client_tls_problem(ADDRESS)
    assert problem is not None and "encrypted" in problem and "passphrase-9f2c" not in problem


def test_check_scheduler_refuses_unusable_tls_before_connecting(tmp_path: Path) -> None:
    """The CLI's check: one ConfigError line, no connection attempted (nothing listens)."""
    from vcdl.api import check_scheduler
    from vcdl.errors import ConfigError

    with _tls(tmp_path / "ca.pem", tmp_path / "c.pem", None), pytest.raises(ConfigError) as info:
        check_scheduler("tls://127.0.0.1:1", timeout=1)
    assert "cannot be read" in str(info.value) and "\n" not in str(info.value)


def test_a_refused_handshake_is_named_through_the_causes() -> None:
    import ssl

    from distributed.comm.core import CommClosedError

    from vcdl.dask_tls import handshake_refused

    closed = CommClosedError(
        "in <TLS (closed) local=tls://127.0.0.1:1 remote=tls://127.0.0.1:2>: "
        "SSLError: [SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca"
    )
    timeout = OSError("Timed out trying to connect to tls://127.0.0.1:2 after 10 s")
    timeout.__cause__ = closed
    said = handshake_refused("tls://127.0.0.1:2", timeout)
    assert said is not None and said.startswith("the TLS handshake with the Dask scheduler")
    assert "TLSV1_ALERT_UNKNOWN_CA" in said and "<TLS" not in said
    assert handshake_refused("tls://h:1", ssl.SSLCertVerificationError("verify failed"))
    assert handshake_refused("tcp://h:1", OSError("Timed out")) is None
