"""Saved models and site states signed with a site's Ed25519 key (issue 21, item 5): a sha256
is a checksum anyone can recompute after an edit; a signature is not. With a roster given, an
unsigned or edited file is refused; without one, files load as before."""

import hashlib
import io
import json
import warnings

import numpy as np
import pytest

pytest.importorskip("cryptography")

import fedlatent as fl  # noqa: E402
from fedlatent.engine.node.site_state import read_site_state, write_site_state  # noqa: E402
from fedlatent.engine.site.keys import Roster, SiteIdentity, SiteKeys  # noqa: E402

ALICE, MALLORY = SiteKeys.generate(), SiteKeys.generate()
ROSTER = Roster({"alice": ALICE.public_key, "bob": SiteKeys.generate().public_key})
SIGNER = SiteIdentity(ALICE, site="alice")


@pytest.fixture(scope="module")
def gmm():
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays(
        {f"c{i}": np.vstack([rng.normal(-2, 1, (30, 2)), rng.normal(2, 1, (30, 2))])
         for i in range(3)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return fl.FederatedGaussianMixture(2, max_rounds=5, random_state=0).fit(fd)


def edit_means(path, delta=1.0, resign_sha=True):
    """Shift the saved means and, as anyone can, write the new sha256 into the JSON."""
    npz, js = path.with_name(path.name + ".npz"), path.with_name(path.name + ".json")
    with np.load(npz, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["means_"] = arrays["means_"] + delta
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    npz.write_bytes(buf.getvalue())
    meta = json.loads(js.read_text())
    if resign_sha:
        meta["npz_sha256"] = hashlib.sha256(buf.getvalue()).hexdigest()
    js.write_text(json.dumps(meta))


def test_an_edited_model_with_its_sha256_recomputed_loads_without_a_roster(gmm, tmp_path):
    # what a checksum can do: kept as it is for files loaded without a roster
    path = tmp_path / "m"
    gmm.save(path, signer=SIGNER)
    edit_means(path)
    loaded = fl.FederatedGaussianMixture.load(path)
    np.testing.assert_allclose(loaded.means_, gmm.means_ + 1.0, rtol=0, atol=1e-12)


def test_with_a_roster_an_edited_model_is_refused(gmm, tmp_path):
    path = tmp_path / "m"
    gmm.save(path, signer=SIGNER)
    edit_means(path)
    with pytest.raises(ValueError, match=r"m\.json \(signed\) from site 'alice' does not verify "
                                         r"against its rostered key"):
        fl.FederatedGaussianMixture.load(path, trust=ROSTER)


def test_with_a_roster_an_edited_setting_is_refused(gmm, tmp_path):
    path = tmp_path / "m"
    gmm.save(path, signer=SIGNER)
    js = path.with_name("m.json")
    meta = json.loads(js.read_text())
    meta["fitted"]["n_iter_"] = 99
    js.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"does not verify"):
        fl.FederatedGaussianMixture.load(path, trust=ROSTER)


def test_with_a_roster_an_unsigned_model_is_refused(gmm, tmp_path):
    path = tmp_path / "m"
    gmm.save(path)
    with pytest.raises(ValueError, match=r"m\.json is not signed, and a roster was given"):
        fl.FederatedGaussianMixture.load(path, trust=ROSTER)


def test_a_model_signed_by_a_key_outside_the_roster_is_refused(gmm, tmp_path):
    path = tmp_path / "m"
    gmm.save(path, signer=SiteIdentity(MALLORY, site="alice"))  # claims alice, mallory's key
    with pytest.raises(ValueError, match=r"site 'alice' does not verify"):
        fl.FederatedGaussianMixture.load(path, trust=ROSTER)
    gmm.save(path, signer=SiteIdentity(MALLORY, site="mallory"))
    with pytest.raises(ValueError, match=r"site 'mallory', which is not in the pinned roster"):
        fl.FederatedGaussianMixture.load(path, trust=ROSTER)


def test_a_signed_model_loads_with_the_roster_and_without(gmm, tmp_path):
    path = tmp_path / "m"
    gmm.save(path, signer=SIGNER)
    for trust in (ROSTER, None):
        loaded = fl.FederatedGaussianMixture.load(path, trust=trust)
        np.testing.assert_array_equal(loaded.means_, gmm.means_)
    assert json.loads(path.with_name("m.json").read_text())["signature"]["site"] == "alice"


def test_a_signed_site_state_refuses_an_edit_and_an_unsigned_entry(tmp_path):
    run = {"estimator": "gmm", "params": {"k": 2}}
    state = {"model/pi": np.array([0.25, 0.75])}
    entry = write_site_state(tmp_path, client_id="alice", state=state, round_=3, run=run,
                             signer=SIGNER)
    got = read_site_state(tmp_path, trust=ROSTER)
    np.testing.assert_array_equal(got.state["model/pi"], state["model/pi"])
    meta = json.loads(entry.read_text())
    meta["round"] = 9  # roll the state's round forward, sha256 untouched
    entry.write_text(json.dumps(meta))
    assert read_site_state(tmp_path).round == 9  # the checksum does not see it
    with pytest.raises(ValueError, match=r"state-000001\.json \(signed\) from site 'alice' does "
                                         r"not verify"):
        read_site_state(tmp_path, trust=ROSTER)
    write_site_state(tmp_path, client_id="alice", state=state, round_=4, run=run)
    with pytest.raises(ValueError, match=r"state-000002\.json is not signed"):
        read_site_state(tmp_path, trust=ROSTER)
