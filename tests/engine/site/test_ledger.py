"""The site's privacy ledger: hash-chained, composed across fits, never rolled back (issue 21).

A DP fit killed and resumed spends no more than its plan (on the ledger and in
``privacy_spent_``) and can be resumed; a second fit that would exceed the lifetime budget of
the data set is refused before any release; ``fedlatent site ledger`` and ``site report``
print what left the site.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.privacy import DifferentialPrivacy, composed_epsilon
from fedlatent.engine.rounds.loop import FederatedFitError
from fedlatent.engine.site import Ledger, LedgerError, SitePolicy
from fedlatent.engine.site.guard import parse_refusal
from fedlatent.engine.site.ledger import compose_epsilon, read_ledger
from fedlatent.engine.transport.inprocess import InProcessRuntime

DELTA = 1e-5


def _fd():
    rng = np.random.default_rng(0)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(40, 2)) * 3 + i for i in range(3)})


def _gmm(epsilon=1.0, rounds=4, seed=0):
    return fl.FederatedGaussianMixture(2, random_state=seed, max_rounds=rounds,
                                       federation=fl.Federation(privacy=DifferentialPrivacy(
                                           epsilon, DELTA, clip=5.0)))


class Kill(Exception):
    """The server process dies after a round (before its checkpoint of that round)."""


def _kill_at(k):
    def cb(r, *args):
        if r == k:
            raise Kill
    return cb


def _releases(path):
    return [e for e in read_ledger(path) if e["kind"] == "release"]


# ---- the chain -------------------------------------------------------------------------------
def test_every_line_is_chained_to_the_one_before_and_an_edit_breaks_the_chain(tmp_path):
    ledger = Ledger(tmp_path, "site-a")
    for k in range(3):
        ledger.append("answer", run="r", exchange="estep", round=k)
    lines = (tmp_path / "ledger.jsonl").read_text().splitlines()
    assert json.loads(lines[0])["prev"] == "0" * 64
    assert [e["seq"] for e in Ledger(tmp_path, "site-a").entries] == [1, 2, 3]  # reread
    edited = lines[1].replace('"round":1', '"round":7')
    (tmp_path / "ledger.jsonl").write_text("\n".join([lines[0], edited, lines[2]]) + "\n")
    with pytest.raises(LedgerError, match=r"line 3: the hash chain is broken"):
        read_ledger(tmp_path / "ledger.jsonl")
    (tmp_path / "ledger.jsonl").write_text("\n".join([lines[0], lines[2]]) + "\n")  # removed
    with pytest.raises(LedgerError, match=r"line 2: the hash chain is broken"):
        Ledger(tmp_path, "site-a")


def test_runs_compose_as_one_gaussian_mechanism_with_the_accountants_figure():
    z1, z2 = 3.0, 5.0
    got = compose_epsilon([(z1, 4), (z2, 9)], DELTA)
    want = composed_epsilon((4 / z1**2 + 9 / z2**2) ** -0.5, 1, DELTA)
    assert got == pytest.approx(want, rel=1e-12)
    assert compose_epsilon([(z1, 4)], DELTA) == pytest.approx(composed_epsilon(z1, 4, DELTA),
                                                              rel=1e-6)


# ---- kill and resume -------------------------------------------------------------------------
def test_a_killed_and_resumed_private_fit_spends_its_plan_and_no_more(tmp_path):
    policy = SitePolicy(directory=tmp_path / "sites", lifetime_epsilon=1.0,
                        lifetime_delta=DELTA)
    with pytest.raises(Kill):
        _gmm().fit(_fd(), runtime=InProcessRuntime(_fd(), policies=policy),
                   checkpoint=tmp_path / "ck", checkpoint_every=1, callbacks=[_kill_at(3)])
    est = _gmm().fit(_fd(), runtime=InProcessRuntime(_fd(), policies=policy),
                     checkpoint=tmp_path / "ck", resume=True)
    assert est.n_iter_ == 4
    plan = est.privacy_calibration_.releases
    assert plan == 6  # moments, hard assignments, 4 rounds
    assert est.privacy_spent_[0] == pytest.approx(est.privacy_calibration_.epsilon_after(plan))
    assert est.privacy_spent_[0] <= 1.0
    for c in ("c0", "c1", "c2"):
        path = tmp_path / "sites" / f"site-{c}" / "ledger.jsonl"
        assert [e["release"] for e in _releases(path)] == list(range(1, plan + 1))
        ledger = Ledger(path.parent, c)
        assert ledger.lifetime_epsilon("default", DELTA) == pytest.approx(
            est.privacy_spent_[0], rel=1e-9)
        # round 3 was answered before the kill: asked again, its recorded answer went back
        # (the initialization is not asked again: the resumed fit starts from the checkpoint)
        assert [(e["exchange"], e["round"]) for e in ledger.of("replay")] == [("estep", 3)]


def test_a_second_fit_beyond_the_lifetime_budget_is_refused_before_any_release(tmp_path):
    policy = SitePolicy(directory=tmp_path, lifetime_epsilon=1.2, lifetime_delta=DELTA)
    rt = InProcessRuntime(_fd(), policies=policy)
    _gmm().fit(_fd(), runtime=rt)
    with pytest.raises(FederatedFitError, match=r"site 'c0' refused "
                                                r"\(privacy.lifetime-epsilon\): this plan would "
                                                r"bring data set 'default' to epsilon=1.4") as err:
        _gmm(seed=1).fit(_fd(), runtime=rt)  # two fits of epsilon 1 compose to 1.4
    assert {c: parse_refusal(t) for c, t in err.value.faults.items()} == {
        c: (c, "privacy.lifetime-epsilon") for c in ("c0", "c1", "c2")}
    for c in ("c0", "c1", "c2"):
        ledger = Ledger(tmp_path / f"site-{c}", c)
        runs = {e["run"] for e in ledger.of("release")}
        assert len(runs) == 1 and len(ledger.of("release")) == 6
        assert ledger.lifetime_epsilon("default", DELTA) <= 1.0


# ---- a ledger that cannot be reset quietly (issue 39, item 4) ----------------------------------
def _spend(policy, fits=1):
    rt = InProcessRuntime(_fd(), policies=policy)
    for seed in range(fits):
        _gmm(seed=seed, rounds=2).fit(_fd(), runtime=rt)


@pytest.mark.parametrize("signed", [False, True], ids=["unsigned", "signed"])
def test_a_deleted_ledger_beside_its_anchor_is_refused(tmp_path, signed):
    from fedlatent.engine.site.keys import SiteKeys

    keys = None
    if signed:
        keys = SiteKeys.generate()
        keys.save(tmp_path / "site.key")
    policy = SitePolicy(directory=tmp_path / "sites", lifetime_epsilon=1.0, lifetime_delta=DELTA,
                        signing_key=tmp_path / "site.key" if signed else None)
    _spend(policy)
    site = tmp_path / "sites" / "site-c0"
    (site / "ledger.jsonl").unlink()  # the budget would start again at zero
    with pytest.raises(LedgerError, match=r"ledger .*ledger.jsonl is missing while its anchor "
                                          r"ledger.head.json is there"):
        Ledger(site, "c0", keys=keys)
    with pytest.raises(LedgerError, match=r"is missing while its anchor"):
        _spend(policy)  # no node of that site answers


def test_a_site_directory_restored_from_a_backup_is_refused_by_its_witness(tmp_path):
    import shutil

    from typer.testing import CliRunner

    from fedlatent.cli import app

    policy = SitePolicy(directory=tmp_path / "sites", witness=tmp_path / "elsewhere",
                        lifetime_epsilon=3.0, lifetime_delta=DELTA)
    rt = InProcessRuntime(_fd(), policies=policy)
    _gmm(rounds=2).fit(_fd(), runtime=rt)
    shutil.copytree(tmp_path / "sites", tmp_path / "backup")  # before the second fit
    _gmm(rounds=2, seed=1).fit(_fd(), runtime=rt)
    shutil.rmtree(tmp_path / "sites")
    shutil.copytree(tmp_path / "backup", tmp_path / "sites")  # the operator restores it
    with pytest.raises(LedgerError, match=r"its witness .* \(kept outside the site directory\) "
                                          r"records \d+ ending in .*: the site directory was "
                                          r"restored from a backup or replaced"):
        InProcessRuntime(_fd(), policies=policy)
    res = CliRunner().invoke(app, ["site", "report", str(tmp_path / "sites" / "site-c0")])
    assert res.exit_code == 2 and "restored from a backup" in res.output


def test_without_a_witness_site_report_says_a_restored_backup_resets_the_budget(tmp_path):
    from typer.testing import CliRunner

    from fedlatent.cli import app

    _spend(SitePolicy(directory=tmp_path, lifetime_epsilon=1.2, lifetime_delta=DELTA))
    res = CliRunner().invoke(app, ["site", "report", str(tmp_path / "site-c0")])
    assert res.exit_code == 0, res.output
    assert ("note: this ledger has no witness outside its site directory: restoring a backup "
            "of the site directory resets its budgets and answers, and nothing shows it") \
        in res.output.replace("\n", " ")


def test_the_lifetime_budget_is_kept_under_the_data_sets_identity_not_the_servers_name(
        tmp_path):
    pytest.importorskip("flwr")
    from fedlatent.runtime.flower_site import dataset_identity

    f = tmp_path / "site.csv"
    f.write_text("x0,x1\n1,2\n3,4\n")
    site = tmp_path / "site.site"
    a, b = dataset_identity(None, "a", f, site), dataset_identity(None, "b", f, site)
    assert a == b and a.startswith("sha256:")  # a second name: the same data set
    (tmp_path / "other.csv").write_text("x0,x1\n1,2\n3,5\n")
    assert dataset_identity(None, "a", tmp_path / "other.csv", None) != a
    named = SitePolicy(datasets={"study": f})
    assert dataset_identity(named, "study", f, site) == "study"  # the policy's own name
