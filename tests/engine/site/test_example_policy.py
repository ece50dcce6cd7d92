"""The shipped example policy works with a fit written as an analyst would for it (issue 39):
``Federation(privacy=DifferentialPrivacy(epsilon=1, ...))`` and the default disclosure policy.
The sites' floors (5 records) are announced at setup and adopted, not discovered by refusal;
the fit's privacy is within the example's ceilings and lifetime budget, on every site's
ledger."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.privacy import DifferentialPrivacy
from fedlatent.engine.rounds.loop import FederatedFitError
from fedlatent.engine.site import Ledger, SitePolicy
from fedlatent.engine.transport.inprocess import InProcessRuntime
from site_example import example_sites

pytest.importorskip("cryptography")  # the example signs its ledger


def _fd():
    rng = np.random.default_rng(0)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(80, 2)) * 2 + 3 * (i % 2) for i in range(3)})


def _fit(runtime, fd, epsilon=1.0):
    est = fl.FederatedGaussianMixture(2, max_rounds=4, random_state=0, federation=fl.Federation(
        privacy=DifferentialPrivacy(epsilon, 1e-5, clip=8.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, runtime=runtime)


def test_the_example_policy_runs_a_fit_written_as_an_analyst_would(tmp_path):
    fd = _fd()
    files = example_sites(tmp_path, fd.client_ids)
    policies = {c: SitePolicy.load(f) for c, f in files.items()}
    rt = InProcessRuntime(fd, policies=policies)
    est = _fit(rt, fd)
    assert est.n_iter_ == 4 and np.all(np.isfinite(est.means_))
    assert est.history_.adopted["raised"]["min_records"] == ["c0", "c1", "c2"]
    assert est.history_.adopted["disclosure"]["min_records"] == 5
    assert est.privacy_spent_[0] <= 1.0
    for c, p in policies.items():
        ledger = Ledger(p.directory, c)  # its chain and anchor verified
        assert [e["kind"] for e in ledger.entries].count("refusal") == 0
        assert len(ledger.of("release")) == est.privacy_calibration_.releases
    # the example's ceilings still hold: a larger epsilon is refused, naming every site
    with pytest.raises(FederatedFitError, match=r"site 'c0' refused \(privacy.max-epsilon\)"):
        _fit(InProcessRuntime(fd, policies=policies), fd, epsilon=2.0)
