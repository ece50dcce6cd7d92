"""The credentials of an encrypted, authenticated deployment (issue 39, item 7), made by
``fedlatent flower credentials`` from ``cryptography``: a CA of the deployment's own, the
SuperLink's certificate for the addresses it is reached at, one SuperNode key pair per site in
the OpenSSH form Flower reads; private keys readable by their owner only, nothing
overwritten. (The loopback deployment of tests/flower/test_deploy.py runs with them.)"""

from __future__ import annotations

import stat

import pytest

pytest.importorskip("cryptography")

from cryptography import x509  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.hazmat.primitives.serialization import (  # noqa: E402
    load_ssh_private_key,
    load_ssh_public_key,
)
from typer.testing import CliRunner  # noqa: E402

from fedlatent.cli import app  # noqa: E402
from fedlatent.runtime.flower_credentials import make_credentials, read_credentials  # noqa: E402


def test_the_superlinks_certificate_is_signed_by_the_deployments_ca_for_its_addresses(tmp_path):
    c = make_credentials(tmp_path, 2, hosts=("link.example.org", "10.1.2.3"))
    ca = x509.load_pem_x509_certificate(c.ca.read_bytes())
    server = x509.load_pem_x509_certificate(c.server_cert.read_bytes())
    server.verify_directly_issued_by(ca)  # raises if not
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert not server.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["link.example.org"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["10.1.2.3"]
    for i, key in enumerate(c.node_keys):
        private = load_ssh_private_key(key.read_bytes(), None)
        public = load_ssh_public_key(c.node_public(i).read_bytes())
        assert isinstance(private, ec.EllipticCurvePrivateKey)
        assert private.public_key().public_numbers() == public.public_numbers()
        assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE(c.server_key.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "certificates" / "ca.key").stat().st_mode) == 0o600


def test_credentials_are_never_overwritten_and_missing_ones_are_named(tmp_path):
    make_credentials(tmp_path, 1)
    with pytest.raises(FileExistsError, match=r"ca.crt exists already; credentials are never "
                                              r"overwritten"):
        make_credentials(tmp_path, 1)
    with pytest.raises(FileNotFoundError, match=r"supernode-1 is missing; write the "
                                                r"deployment's credentials with 'fedlatent "
                                                r"flower credentials .* --supernodes 2'"):
        read_credentials(tmp_path, 2)


def test_the_command_writes_them(tmp_path):
    res = CliRunner().invoke(app, ["flower", "credentials", str(tmp_path / "c"),
                                   "--supernodes", "3", "--host", "127.0.0.1"])
    assert res.exit_code == 0, res.output
    c = read_credentials(tmp_path / "c", 3)
    assert "wrote 3 SuperNode key pairs" in res.output and c.node_public(2).exists()
    again = CliRunner().invoke(app, ["flower", "credentials", str(tmp_path / "c"),
                                     "--supernodes", "3"])
    assert again.exit_code == 2 and "never overwritten" in again.output
