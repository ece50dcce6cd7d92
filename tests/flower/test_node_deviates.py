"""The "Why" cases of issue 21 that concern a node, played against a Flower node's own code path
(``flower_site.serve``: a fresh ClientNode per message, the accepted setup replayed from
Flower's ``context.state``, the site directory on disk), without Ray or a SuperLink: each
``serve`` call is what one ClientApp process does with one message. Every deviation is refused
with the site's rule, on its ledger, and the reply carries nothing computed from the data.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("cryptography")

pytestmark = pytest.mark.flower

import fedlatent as fl  # noqa: E402
from fedlatent.engine.privacy import DifferentialPrivacy  # noqa: E402
from fedlatent.engine.privacy.disclosure import effective  # noqa: E402
from fedlatent.engine.privacy.enforce import policy_to_json  # noqa: E402
from fedlatent.engine.protocol.messages import ERROR_KEY, pack  # noqa: E402
from fedlatent.engine.site import Ledger, SitePolicy  # noqa: E402
from fedlatent.engine.site.keys import SiteKeys  # noqa: E402
from fedlatent.models.gmm.math import compute_precision_cholesky  # noqa: E402
from fedlatent.models.gmm.model import GMMModel  # noqa: E402

DP = DifferentialPrivacy(1.0, 1e-5, clip=5.0)
RUN = json.dumps({"estimator": "FederatedGaussianMixture", "params": {"n_components": 2}})


def _fd(n=40):
    rng = np.random.default_rng(0)
    return fl.FederatedDataset.from_arrays({"c0": rng.normal(size=(n, 2)) * 3})


def _setup(run="r1", dp=DP, releases=3, disclosure=None):
    msg = {"model": "gmm", "model_config": json.dumps(GMMModel(2, "full", 1e-6).get_config()),
           "disclosure": policy_to_json(disclosure or fl.DisclosurePolicy()), "run": run}
    if dp is not None:
        msg.update(privacy=json.dumps(dp.to_config()), privacy_releases=releases)
    return msg


def _estep(k, shift=0.0):
    cov = np.repeat(np.eye(2)[None] * 2.0, 2, 0)
    params = {"weights": np.full(2, 0.5), "means": np.array([[-1.0, 0.0], [2.0, 1.0]]) + shift,
              "precisions_cholesky": compute_precision_cholesky(cov, "full"),
              "center": np.zeros(2)}
    return {"seed": 0, "round": k, "mode": "full", **pack("params", params)}


class Node:
    """One SuperNode of a run: Flower's context.state for the run, its site directory, its
    policy; every message answered as a fresh ClientApp process answers it."""

    def __init__(self, site, policy, fd=None):
        from flwr.app import RecordDict

        self.fd, self.site, self.policy = fd or _fd(), site, policy
        self.state = RecordDict()

    def __call__(self, method, msg):
        from fedlatent.runtime.flower_site import RUN as RUN_KEY
        from fedlatent.runtime.flower_site import serve

        return serve(self.fd, self.state, method, {RUN_KEY: RUN, **msg}, self.site,
                     policy=self.policy, dataset="study", simulation=False)

    def rules(self):
        return [e["rule"] for e in Ledger(self.site, "c0").of("refusal")]


@pytest.mark.parametrize(("policy", "setup", "rule"), [
    (SitePolicy(), _setup(disclosure=fl.DisclosurePolicy.off()), "disclosure"),
    (SitePolicy(max_epsilon=2.0), _setup(dp=DifferentialPrivacy(1e4, 1e-5, clip=5.0)),
     "privacy.max-epsilon"),
    (SitePolicy(privacy_required=True), _setup(dp=None), "privacy.required"),
    (SitePolicy(), _setup(dp=DifferentialPrivacy(1.0, 1e-5, clip=5.0, noise_seed=3)),
     "privacy.noise-seed"),
], ids=["disclosure-off", "epsilon-1e4", "no-dp", "noise-seed"])
def test_a_setup_below_the_floor_is_refused_and_nothing_is_answered_after_it(
        tmp_path, policy, setup, rule):
    node = Node(tmp_path, policy)
    assert node("setup", setup)[ERROR_KEY].startswith(f"site 'c0' refused ({rule})")
    with pytest.raises(RuntimeError, match=r"client 'c0' got 'estep' before the model's setup"):
        node("estep", _estep(1))  # a refused setup is not replayed: nothing to answer from
    assert node.rules() == [rule]


def test_an_aggregate_count_scope_without_masks_gets_no_row_back(tmp_path):
    aggregate = effective(fl.DisclosurePolicy(), True)
    node = Node(tmp_path, SitePolicy(disclosure=aggregate), fd=_fd(n=1))
    assert ERROR_KEY not in node("setup", _setup(dp=None, disclosure=aggregate))
    reply = node("estep", _estep(1))
    assert "fewer than min_records=3" in reply[ERROR_KEY]
    assert not any(k.startswith("delta/") for k in reply)


def test_a_re_plan_a_re_ask_and_a_restore_are_refused_across_processes(tmp_path):
    node = Node(tmp_path, SitePolicy())
    node("setup", _setup(releases=2))
    for k in (1, 2):
        assert ERROR_KEY not in node("estep", _estep(k))
    again = Node(tmp_path, SitePolicy())  # a new run of the server, the same label and site
    assert again("setup", _setup(releases=54))[ERROR_KEY].startswith(
        "site 'c0' refused (plan): run 'r1' was set up with another plan")
    assert node("estep", _estep(2, shift=0.5))[ERROR_KEY].startswith(
        "site 'c0' refused (one-answer): estep of round 2")
    # the server restores the node's state of round 1 and asks a third release
    third = node("estep", {**_estep(3), "fedlatent.restore": 1})
    assert "would be release 3 of run 'r1', whose plan has 2" in third[ERROR_KEY]
    assert node.rules() == ["plan", "one-answer", "privacy.plan"]
    assert len(Ledger(tmp_path, "c0").of("release")) == 2


def test_a_signed_site_state_edited_with_its_hash_recomputed_is_not_restored(tmp_path):
    import hashlib

    SiteKeys.generate().save(tmp_path / "key.pem")
    (tmp_path / "policy.toml").write_text('[site]\nsigning-key = "key.pem"\n')
    policy = SitePolicy.load(tmp_path / "policy.toml")
    site = tmp_path / "site"
    node = Node(site, policy)
    node("setup", _setup(dp=None))
    node("estep", _estep(1))
    (entry,) = sorted(site.glob("state-*.json"))
    meta = json.loads(entry.read_text())
    meta["round"] = 0  # roll the state back a round, its sha256 unchanged (still valid)
    entry.write_text(json.dumps(meta))
    assert hashlib.sha256(entry.with_suffix(".npz").read_bytes()).hexdigest() \
        == meta["npz_sha256"]
    resumed = Node(site, policy)
    resumed("setup", _setup(dp=None))
    with pytest.raises(ValueError, match=r"state-000001\.json \(signed\) from site 'c0' does not "
                                         r"verify against its rostered key"):
        resumed("estep", {**_estep(2), "fedlatent.restore": 1})
