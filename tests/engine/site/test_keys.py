"""Site keys and the roster (issue 21, item 5): Ed25519 from ``cryptography``, statements bound
to their purpose and context, roster files, and the ``fedlatent site keygen``/``roster``
commands."""

import base64
import json
import os

import pytest
import typer
from typer.testing import CliRunner

pytest.importorskip("cryptography")

from fedlatent.cli.site_keys import register  # noqa: E402
from fedlatent.engine.site.keys import (  # noqa: E402
    KEY_FILE,
    PUBLIC_FILE,
    AuthenticationError,
    Roster,
    SiteIdentity,
    SiteKeys,
    sign,
    statement,
    verify,
)

A, B = SiteKeys.generate(), SiteKeys.generate()
ROSTER = Roster({"a": A.public_key, "b": B.public_b64})


def test_a_signature_verifies_only_for_its_purpose_context_and_payload():
    sig = sign(A, "sec-model", {"site": "a", "run": "r1"}, b"blob")
    assert len(sig) == 64
    verify(ROSTER, "a", sig, "sec-model", {"run": "r1", "site": "a"}, b"blob")  # key order free
    for purpose, ctx, payload in (("saved-file", {"site": "a", "run": "r1"}, b"blob"),
                                  ("sec-model", {"site": "a", "run": "r2"}, b"blob"),
                                  ("sec-model", {"site": "a", "run": "r1"}, b"blob!")):
        with pytest.raises(AuthenticationError, match=r"from site 'a' does not verify"):
            verify(ROSTER, "a", sig, purpose, ctx, payload)
    with pytest.raises(AuthenticationError, match=r"from site 'b' does not verify"):
        verify(ROSTER, "b", sig, "sec-model", {"site": "a", "run": "r1"}, b"blob")


def test_unknown_sites_and_missing_signatures_are_named():
    with pytest.raises(AuthenticationError, match=r"site 'z', which is not in the pinned roster "
                                                  r"\(2 sites\)"):
        ROSTER.verify("z", bytes(64), "p", {})
    with pytest.raises(AuthenticationError, match=r"from site 'a' carries no signature"):
        ROSTER.verify("a", b"", "p", {})


def test_statements_separate_purpose_context_and_payload():
    assert statement("p", {"x": 1}, b"y") != statement("p", {"x": 1, "y": ""}, b"")
    assert statement("p", {"b": 1, "a": 2}) == statement("p", {"a": 2, "b": 1})


def test_keys_round_trip_through_pem_owner_only_and_never_overwritten(tmp_path):
    path = A.save(tmp_path / "k.pem")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert SiteKeys.load(path).public_key == A.public_key
    with pytest.raises(FileExistsError):
        B.save(path)
    enc = B.save(tmp_path / "enc.pem", password=b"pw")
    assert SiteKeys.load(enc, password=b"pw").public_key == B.public_key
    (tmp_path / "bad.pem").write_text("not a key")
    with pytest.raises(ValueError, match=r"bad\.pem is not a readable PEM private key"):
        SiteKeys.load(tmp_path / "bad.pem")
    with pytest.raises(FileNotFoundError, match=r"fedlatent site keygen"):
        SiteKeys.load(tmp_path / "none.pem")


def test_roster_files_load_in_base64_or_pem_and_refuse_bad_ones(tmp_path):
    path = tmp_path / "roster.json"
    path.write_text(json.dumps({"format": "fedlatent-roster/1",
                                "sites": {"a": A.public_b64, "b": B.public_pem()}}))
    r = Roster.load(path)
    assert r.sites == ("a", "b") and r.fingerprint() == ROSTER.fingerprint()
    assert Roster.load(_write(tmp_path / "again.json", r.to_json())).fingerprint() \
        == r.fingerprint()
    bad = {"format": "fedlatent-roster/1", "sites": {"a": base64.b64encode(b"x" * 31).decode()}}
    with pytest.raises(ValueError, match=r"the key of site 'a' is not an Ed25519 public key"):
        Roster.load(_write(tmp_path / "bad.json", json.dumps(bad)))
    same = {"format": "fedlatent-roster/1", "sites": {"a": A.public_b64, "b": A.public_b64}}
    with pytest.raises(ValueError, match=r"one public key for two sites"):
        Roster.load(_write(tmp_path / "same.json", json.dumps(same)))
    with pytest.raises(ValueError, match=r'must be a JSON object with "format"'):
        Roster.load(_write(tmp_path / "old.json", json.dumps({"a": A.public_b64})))


def _write(path, text):
    path.write_text(text)
    return path


def test_identity_quota_and_site_binding():
    assert SiteIdentity(A, ROSTER).quota == 2
    assert SiteIdentity(A, ROSTER, sec_quota=7).quota == 7
    assert SiteIdentity(A).quota is None
    bound = SiteIdentity(A, ROSTER, site="a")
    assert bound.for_site("a").site == "a"
    with pytest.raises(ValueError, match=r"identity of 'a' is given to client 'b'"):
        bound.for_site("b")


def test_keygen_and_roster_commands(tmp_path):
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    for s in ("a", "b"):
        res = runner.invoke(app, ["keygen", str(tmp_path / s), "--site", s])
        assert res.exit_code == 0, res.output
        entry = json.loads(res.output.strip().splitlines()[-1])
        assert entry[s] == SiteKeys.load(tmp_path / s / KEY_FILE).public_b64
    again = runner.invoke(app, ["keygen", str(tmp_path / "a"), "--site", "a"])
    assert again.exit_code == 2 and "exists already" in again.output
    out = tmp_path / "roster.json"
    res = runner.invoke(app, ["roster", str(out), f"a={tmp_path / 'a' / PUBLIC_FILE}",
                              f"b={tmp_path / 'b' / PUBLIC_FILE}"])
    assert res.exit_code == 0, res.output
    r = Roster.load(out)
    assert r.sites == ("a", "b") and r.fingerprint() in res.output
    bad = runner.invoke(app, ["roster", str(tmp_path / "r2.json"), "a"])
    assert bad.exit_code == 2 and "expected ID=PUBFILE" in bad.output
