"""A test's own certificate authority and the certificates it signs, as PEM files in a folder.

Short-lived (an hour) and made fresh per use with ``cryptography``: a CA, and
leaf certificates naming the addresses a server is reached at (IP and DNS
subject alternative names), usable for both server and client
authentication, since Dask's scheduler, workers and clients are each both.
A second, unrelated CA makes the "signed by someone else" certificate that
must be refused.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CA", "Leaf"]

LIFETIME = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class Leaf:
    """A certificate and its private key, each a PEM file."""

    cert: Path
    key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)  # libpq and PostgreSQL refuse a key others can read


class CA:
    """A certificate authority whose certificate is ``<folder>/<name>-ca.pem``."""

    def __init__(self, folder: Path, name: str = "vcdl-test") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self._key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        # Backdated a minute: a host whose clock is a little behind still accepts it.
        self._not_before = now - datetime.timedelta(minutes=1)
        self._subject = _name(f"{name} CA")
        cert = (
            x509.CertificateBuilder()
            .subject_name(self._subject)
            .issuer_name(self._subject)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(now + LIFETIME)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.cert = folder / f"{name}-ca.pem"
        self.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def issue(
        self, name: str, ips: Sequence[str] = ("127.0.0.1",), dns: Sequence[str] = ("localhost",)
    ) -> Leaf:
        """A certificate for ``name`` naming ``ips`` and ``dns``, signed by this CA."""
        key = ec.generate_private_key(ec.SECP256R1())
        sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
        cert = (
            x509.CertificateBuilder()
            .subject_name(_name(name))
            .issuer_name(self._subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_before + LIFETIME)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
            .sign(self._key, hashes.SHA256())
        )
        leaf = Leaf(self.folder / f"{name}.pem", self.folder / f"{name}-key.pem")
        leaf.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        _write_key(key, leaf.key)
        return leaf
