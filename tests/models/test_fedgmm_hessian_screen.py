"""FedGMM's learner Hessians ``lH`` are bounded by the other statistics of the same rows
(:mod:`fedlatent.models.fedgmm.screen`): an intercept entry by a quarter of the learner's
weight, each feature's spread by a quarter of its second moment. A diagonal entry shifted
alone stays positive semi-definite; a ring element shifted by 2^62 under secure aggregation
decodes in range there: before, the round passed the screen and the fit stopped at the next
round (its clients' replies beyond the encoding's bound); now that round is discarded, named
by the bound, and the fit goes on."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import fedlatent as fl
from fedlatent.data.dataset import ClientData
from fedlatent.data.fedgmm_data import make_fedgmm_synthetic
from fedlatent.engine.protocol.numerics import add_intercept
from fedlatent.engine.transport.inprocess import InProcessRuntime
from fedlatent.models.fedgmm import FedGMM
from fedlatent.models.fedgmm.screen import hessian_bound_problem
from fedlatent.models.gmm.math import gmm_statistics
from fedlatent.models.logistic import weighted_grad_hess

pytest.importorskip("cryptography")
#: the round the shifted reply arrives in, and the rounds of the fit
AT, ROUNDS = 3, 6


@pytest.fixture(autouse=True)
def _one_blas_thread():
    with threadpool_limits(1):
        yield


def _data(classes: int = 2, missing: bool = False):
    sp = make_fedgmm_synthetic(n_clients=4, n_samples_per_client=100, n_features=3,
                               mean_scale=2.0, fractions=(0.6, 0.2, 0.2), random_state=0)
    rng = np.random.default_rng(5)

    def change(c, cd):
        X = cd.X.copy()
        if missing:
            X[rng.random(len(X)) < 0.2, 1] = np.nan
        y = cd.y + (cd.y == 1) * (X[:, 0] > 0) if classes == 3 else cd.y
        return ClientData(X, y)

    return sp.train.map(change)


def _fit(fd, runtime=None, secure=False, verified=None, **kw):
    est = FedGMM(n_input_components=2, n_learners=2, max_rounds=ROUNDS, tol=0.0,
                 random_state=3, verbose=False, federation=fl.Federation(
                     secure_aggregation=secure, verified=verified), **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(fd, runtime=runtime)


@pytest.mark.parametrize("cov", ["full", "diag", "tied", "spherical"])
@pytest.mark.parametrize("agg", ["exact", "paper"])
def test_every_honest_reply_passes_the_bound(cov, agg):
    """Each client's reply of every round is screened (plain rounds): none is refused."""
    est = _fit(_data(), covariance_type=cov, covariance_aggregation=agg)
    assert len(est.history_) == ROUNDS
    assert all(not r.rejected and not r.errors and r.participants == 4 for r in est.history_)


@pytest.mark.usefixtures("saturation_rule_off")  # (three classes: more numbers a round)
@pytest.mark.parametrize("classes,missing", [(3, False), (2, True)],
                         ids=["three-classes", "missing-values"])
def test_three_classes_and_completed_rows_pass_the_bound(classes, missing):
    est = _fit(_data(classes, missing))
    assert all(not r.rejected and not r.errors and r.participants == 4 for r in est.history_)


def _tight(n=400, d=2, seed=0):
    """Statistics as close to the bounds as data allow: every probability 1/2 (each
    ``s_i = w_i / 4``), rows centred on the statistics' centre, one learner holding them."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d))
    X -= X.mean(0)
    y = rng.integers(2, size=n)
    w = np.ones(n)
    coef = np.zeros((1, d + 1))  # p = 1/2 everywhere
    _, H = weighted_grad_hess(add_intercept(X), y, w, coef)
    G = gmm_statistics(X, np.ones((n, 1)), np.zeros(d), "full")
    return G["sxx"], H[None], np.array([float(n)])


def test_the_bound_holds_where_data_reach_it_and_refuses_just_beyond():
    sxx, lH, lw = _tight()
    assert hessian_bound_problem(sxx, lH, lw, "full") is None
    d = sxx.shape[-1]
    # (at p = 1/2 and the centre at the mean both bounds hold with equality)
    np.testing.assert_allclose(lH[0, d, d], lw[0] / 4, rtol=1e-12)
    np.testing.assert_allclose(lH[0, 0, 0], sxx[0, 0, 0] / 4, rtol=1e-12)
    up = lH.copy()
    up[0, d, d] *= 1 + 1e-6
    assert hessian_bound_problem(sxx, up, lw, "full") == (
        f"the Hessian 'lH' of learner 0 has intercept entry {up[0, d, d]:.6g} (class 1), "
        f"above a quarter of its weight 'lw' ({lw[0]:.6g}): no rows give it")
    up = lH.copy()
    up[0, 1, 1] *= 1 + 1e-6
    why = hessian_bound_problem(sxx, up, lw, "full")
    assert why.startswith("the Hessians 'lH' spread feature 1 by ") and \
        f"above a quarter of its second moment in 'sxx' ({sxx[0, 1, 1]:.6g})" in why


def test_the_slack_of_the_fixed_point_sums_is_allowed():
    sxx, lH, lw = _tight()
    up = lH.copy()
    up[0, 0, 0] += 1e-3
    assert hessian_bound_problem(sxx, up, lw, "full") is not None
    slack = {"sxx": np.zeros_like(sxx), "lH": np.full_like(lH, 2e-3), "lw": np.zeros(1)}
    assert hessian_bound_problem(sxx, up, lw, "full", slack) is None


class Shifting(InProcessRuntime):
    """One site's masked round-``AT`` reply arrives with element ``at`` of its ``delta/lH``
    shifted by 2^62: only the round's reply (a fault in transit), or (``liar``: the site
    lies) as the site encodes it, in the round's reply and its group-test replays (the same
    sums; a verifying site whose reply were altered in transit would find its contribution
    missing from the round's transcript and refuse the group tests)."""

    def __init__(self, fd, at: int, liar: bool, **kw):
        super().__init__(fd, **kw)
        self.at, self.liar = at, liar

    def call(self, client_ids, method, messages):
        site = self.client_ids[2]
        msg = messages.get(site, {})
        now = method == "estep" and int(np.asarray(msg.get("secagg/round", -1)).reshape(-1)[
            0]) == AT
        if self.liar and now:
            return self._lying(site, client_ids, method, messages)
        replies = super().call(client_ids, method, messages)
        rep = replies.get(site)
        if now and rep is not None and "secagg/replay" not in msg:
            a = np.array(rep["delta/lH"], dtype=np.uint64)
            a.flat[self.at] += np.uint64(2**62)
            rep["delta/lH"] = a
        return replies

    def _lying(self, site, client_ids, method, messages):
        """The call with ``site``'s encoding shifted (its masked reply, and the contribution
        it keeps to check the round's transcript by, both hold the lie)."""
        import dataclasses

        secagg = self.nodes[site].secagg
        real, at = secagg.config, self.at

        class Lying:
            def __getattr__(self, name):
                return getattr(real.encoding, name)

            def encode_flat(self, arrays, *, client):
                layout, y = real.encoding.encode_flat(arrays, client=client)
                first = 0
                for name, shape in layout.shapes:
                    if name == "delta/lH":
                        y[first + at] += np.uint64(2**62)
                    first += int(np.prod(shape))
                return layout, y

        secagg.config = dataclasses.replace(real, encoding=Lying())
        try:
            return super().call(client_ids, method, messages)
        finally:
            secagg.config = real


def _example_fit(runtime, verified: bool):
    """The registered example's FedGMM, secure: its encoding decodes the shifted element in
    range (another scale may decode it out of range, which the ring check refuses)."""
    from fedlatent.models.fedgmm.example import EXAMPLE

    est = EXAMPLE.case().make()
    est.set_params(tol=0.0, max_rounds=ROUNDS, federation=fl.Federation(
        secure_aggregation=True, verified=verified))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return est.fit(runtime._fd, runtime=runtime)


#: the example's d = 3 features, two classes: each learner's Hessian is 4 x 4, intercept last
D = 4


@pytest.mark.parametrize(("at", "why"), [
    (0, r"the Hessians 'lH' spread feature 0 by [0-9.e+]+ \(class 1, over the learners\), "
        r"above a quarter of its second moment in 'sxx'"),
    (D * D - 1, r"the Hessian 'lH' of learner 0 has intercept entry [0-9.e+]+ \(class 1\), "
                r"above a quarter of its weight 'lw'"),
], ids=["feature-diagonal", "intercept"])
@pytest.mark.parametrize("liar", [True, False], ids=["liar", "transit"])
@pytest.mark.parametrize("verified", [True, False], ids=["verified", "unverified"])
def test_a_shifted_hessian_entry_is_caught_at_its_round(at, why, liar, verified):
    """The round is discarded at once (before: it passed, and the fit stopped at the next
    round, the clients' replies beyond the encoding's bound). A site that lies again in the
    group tests is named and excluded; a fault in transit names nobody (the lie did not
    reproduce), every site follows the undo. Either way the fit runs on."""
    from fedlatent.models.fedgmm.example import EXAMPLE

    fd = EXAMPLE.case().data()
    est = _example_fit(Shifting(fd, at, liar), verified)
    skipped = [(r.round, r.skipped) for r in est.history_ if r.skipped]
    assert len(skipped) == 1 and skipped[0][0] == AT, skipped
    text = skipped[0][1]
    assert "breaks the model's invariants: " in text and re.search(why, text), text
    assert len(est.history_) == ROUNDS
    liar_id = fd.client_ids[2]
    assert (f"client {liar_id!r} sent it" in text) is liar, text
    assert ("no client named" in text) is not liar, text
    n = len(fd.client_ids) - (1 if liar else 0)
    assert all(r.participants == n and set(r.missing) <= {liar_id}
               for r in est.history_ if r.round > AT)
