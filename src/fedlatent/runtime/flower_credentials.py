"""The credentials of an encrypted, authenticated Flower deployment, made with ``cryptography``.

A deployment runs with TLS between the SuperNodes and the SuperLink, and with Flower's SuperNode
authentication: the SuperLink (``--enable-supernode-auth``) admits only SuperNodes whose public
key was registered (``flwr supernode register``), each proving it holds the private key. This
module writes what that needs (``fedlatent flower credentials``):

``certificates/ca.crt``, ``ca.key``
    A certificate authority of the deployment's own (ECDSA P-384): the SuperNodes and ``flwr``
    trust the SuperLink's certificate through it (``--root-certificates``, ``root-certificates``
    of a ``flwr`` connection). ``ca.key`` signs nothing else: keep it offline.
``certificates/server.pem``, ``server.key``
    The SuperLink's certificate (for the host names and addresses it is reached at) and key
    (``--ssl-certfile``, ``--ssl-keyfile``, with ``--ssl-ca-certfile ca.crt``).
``keys/supernode-<i>``, ``keys/supernode-<i>.pub``
    One ECDSA P-384 key pair per SuperNode in OpenSSH format (what Flower reads): the private
    key stays at the site (``--auth-supernode-private-key``); the public key is registered
    with the SuperLink.

Private keys are written readable by their owner only; nothing is overwritten.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Credentials", "make_credentials", "read_credentials"]

#: what the SuperLink's certificate names by default (a loopback deployment)
LOOPBACK = ("localhost", "127.0.0.1", "::1")
_DAYS = 365


@dataclass(frozen=True)
class Credentials:
    """Paths of a deployment's credentials (see the module docstring)."""

    ca: Path
    server_cert: Path
    server_key: Path
    node_keys: tuple[Path, ...]

    def node_public(self, i: int) -> Path:
        """SuperNode ``i``'s public key (registered with the SuperLink)."""
        return self.node_keys[i].with_name(self.node_keys[i].name + ".pub")


def _names(hosts):
    from cryptography import x509

    out = []
    for h in hosts:
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            out.append(x509.DNSName(str(h)))
    return out


def _certificate(subject: str, key, issuer_name, issuer_key, *, ca: bool, hosts=()):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    builder = (x509.CertificateBuilder().subject_name(name)
               .issuer_name(issuer_name or name).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=_DAYS))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if hosts:
        builder = builder.add_extension(x509.SubjectAlternativeName(_names(hosts)),
                                        critical=False)
    return builder.sign(issuer_key, hashes.SHA384())


def _write(path: Path, data: bytes, private: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    fd = os.open(path, flags, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _pem_key(key) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM,
                             serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_credentials(directory: str | os.PathLike, supernodes: int,
                     hosts=LOOPBACK) -> Credentials:
    """Write a deployment's CA, the SuperLink's certificate for ``hosts`` and one key pair per
    SuperNode into ``directory`` (see the module docstring); FileExistsError if any is there.
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    if int(supernodes) < 1:
        raise ValueError(f"a deployment needs at least one SuperNode key, got {supernodes}")
    if not hosts:
        raise ValueError("the SuperLink's certificate needs at least one host name or address")
    d = Path(directory)
    c = read_credentials(d, supernodes, check=False)
    clash = [p for p in (c.ca, c.server_cert, c.server_key, *c.node_keys) if p.exists()]
    if clash:
        raise FileExistsError(f"{clash[0]} exists already; credentials are never overwritten "
                              "(move the old ones away first)")
    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca = _certificate("fedlatent deployment CA", ca_key, None, ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP384R1())
    server = _certificate(str(hosts[0]), server_key, ca.subject, ca_key, ca=False, hosts=hosts)
    _write(d / "certificates" / "ca.key", _pem_key(ca_key), True)
    _write(c.ca, ca.public_bytes(serialization.Encoding.PEM), False)
    _write(c.server_key, _pem_key(server_key), True)
    _write(c.server_cert, server.public_bytes(serialization.Encoding.PEM), False)
    for i, path in enumerate(c.node_keys):
        key = ec.generate_private_key(ec.SECP384R1())
        _write(path, key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.OpenSSH,
                                       serialization.NoEncryption()), True)
        _write(c.node_public(i), key.public_key().public_bytes(
            serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n", False)
    return c


def read_credentials(directory: str | os.PathLike, supernodes: int,
                     check: bool = True) -> Credentials:
    """The credentials in ``directory`` for ``supernodes`` SuperNodes (FileNotFoundError
    naming the first one missing, with the fix, when ``check``)."""
    d = Path(directory).resolve()
    c = Credentials(d / "certificates" / "ca.crt", d / "certificates" / "server.pem",
                    d / "certificates" / "server.key",
                    tuple(d / "keys" / f"supernode-{i}" for i in range(int(supernodes))))
    if check:
        for p in (c.ca, c.server_cert, c.server_key, *c.node_keys,
                  *(c.node_public(i) for i in range(len(c.node_keys)))):
            if not p.exists():
                raise FileNotFoundError(
                    f"{p} is missing; write the deployment's credentials with 'fedlatent "
                    f"flower credentials {d} --supernodes {supernodes}'")
    return c
