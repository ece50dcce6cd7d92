"""Issue 19, item 11: honest data is never a liar.

- a constant (or nearly constant) feature is not standardized by HLCR (centring it through
  sums left only rounding noise, and every honest agent's moment matrix was refused as not
  positive semi-definite), with one warning naming it; no model refuses an honest client for it;
- a reply whose magnitude would overflow the server's checks (1e200 per unit) is refused as
  such, naming the client, and the fit keeps the last good state (or stops naming it);
- an exception escaping a client's handler in-process is a missing client (in the rounds) or
  a FederatedFitError naming it (where every client must answer), as on Flower.
"""

import re
import warnings

import numpy as np
import pytest
from test_reply_invariants import FD, VICTIM, Tamper, fit, gmm

import fedlatent as fl
from federations import make_blobs_federation
from fedlatent.engine import FederatedFitError, InProcessRuntime
from fedlatent.models.hlcr.scaling import moments_scaling
from test_estimators import _lcr_data
from tolerance import assert_close, assert_same

N_AGENTS = 8


def _hlcr_with(extra_column):
    """SynthHLCR data with one more feature ``extra_column(rng, n)`` named 'extra'."""
    fd = fl.datasets.make_synthhlcr(n_agents=N_AGENTS, n_entities=24, n_clusters=2,
                                    n_features=2, events_per_entity=8, random_state=0)
    rng = np.random.default_rng(1)
    data = {c: (np.column_stack([fd[c].X, extra_column(rng, fd[c].n_samples)]), fd[c].y)
            for c in fd.client_ids}
    return fl.FederatedDataset.from_arrays(
        data, feature_names=["x0", "x1", "extra"],
        entities={c: fd[c].entity for c in fd.client_ids})


def _fit_recording(est, fd):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        est.fit(fd)
    return [str(w.message) for w in caught if not issubclass(w.category,
                                                              fl.ConvergenceWarning)]


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("extra, constant", [
    (lambda rng, n: np.full(n, 5.0), True),
    (lambda rng, n: 300.0 + 1e-3 * rng.normal(size=n), True),  # sd 3e-6 of the mean
    (lambda rng, n: np.zeros(n), True),
    (lambda rng, n: 300.0 + rng.normal(size=n), False),  # varies: standardized as before
])
def test_hlcr_defaults_refuse_no_agent_for_a_constant_feature(extra, constant):
    fd = _hlcr_with(extra)
    est = fl.HLCR(2, max_rounds=4, random_state=0)
    messages = _fit_recording(est, fd)
    assert all(r.rejected == {} and r.missing == [] for r in est.history_)
    assert all(r.participants == N_AGENTS for r in est.history_)
    named = [m for m in messages if "constant across the federation" in m]
    if constant:
        assert named == [named[0]] and re.search(r"feature\(s\) 'extra' are constant", named[0])
    else:
        assert named == []
    assert np.all(np.isfinite(est.coef_))


def test_moments_scaling_leaves_constant_columns_uncentred():
    n = 100.0
    x = np.array([5.0, 0.0, 300.0, 2.0])  # means; the last column varies (variance 4)
    sx = n * x
    sxx = n * (x**2 + np.array([0.0, 0.0, 1e-12 * 300.0**2, 4.0]))
    mx, sx_, my, sy_ = moments_scaling(n, sx, sxx, n * 7.0, n * 49.0, True)
    assert_same(mx, [0.0, 0.0, 0.0, 2.0])  # exact: constant columns are not centred, 200/100
    np.testing.assert_allclose(sx_, [5.0, 1.0, 300.0 * np.sqrt(1 + 1e-12), 2.0], rtol=1e-12)
    assert (my, sy_) == (0.0, 7.0)  # a constant target: not centred either


@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("name", ["gmm", "lcr", "fedgmm"])
def test_other_models_refuse_no_client_for_a_constant_feature(name):
    if name == "gmm":
        base = make_blobs_federation(n_clients=10)
        est = fl.FederatedGaussianMixture(3, max_rounds=5, random_state=0)
    elif name == "lcr":
        base = _lcr_data(n_clients=8)
        est = fl.LatentClassRegression(2, max_rounds=5, random_state=0)
    else:
        base = fl.datasets.make_fedgmm_synthetic(n_clients=8, n_samples_per_client=30,
                                                 n_components=2, n_features=3,
                                                 random_state=0).train
        est = fl.FedGMM(2, 2, max_rounds=4, random_state=0, verbose=False)
    data = {c: (np.column_stack([base[c].X, np.full(base[c].n_samples, 5.0)]), base[c].y)
            if base[c].y is not None else np.column_stack([base[c].X,
                                                           np.full(base[c].n_samples, 5.0)])
            for c in base.client_ids}
    fd = fl.FederatedDataset.from_arrays(data)
    _fit_recording(est, fd)
    assert all(r.rejected == {} and r.missing == [] for r in est.history_)


# ---- one client's statistic beyond everyone else's ---------------------------------------------
def sxx_1e200(r):
    r["delta/sxx"] = np.full_like(r["delta/sxx"], 1e200)
    return r


def _named(k):
    return (rf"round {k}: the M-step failed on the aggregated statistics \(ValueError: .*\); "
            rf"client '{VICTIM}' dominates them \(its statistic reaches 1e\+200 per unit, more "
            rf"than 1e\+06 times any other client's weighted statistic\): check its data, or "
            rf"leave it out; kept the parameters of round {k - 1}")


@pytest.mark.parametrize("cv, on_invalid", [(True, "exclude"), (False, "exclude"),
                                            (True, "raise")])
def test_a_reply_of_1e200_that_breaks_the_m_step_is_named(cv, on_invalid):
    """1e200 in the second moments only: consistent as moments (x = +-1e100 gives them, and
    data up to 1e150 are accepted, so the screen passes it), but the M-step then failed
    without naming anyone. Now the error names the client whose statistic is the aggregate,
    and keeps the last good state."""
    fed = fl.Federation(control_variates=cv, on_invalid=on_invalid)
    with pytest.raises(FederatedFitError, match=_named(3)) as err:
        fit(gmm(fed), runtime=Tamper(FD, VICTIM, sxx_1e200, from_round=3))
    assert err.value.round_ == 3
    good = fit(gmm(fed, rounds=2))
    assert_close(err.value.last_good["means"], good.means_)  # per-client vs batched rounds


def test_a_reply_of_1e200_in_the_initialization_round_is_named():
    with pytest.raises(FederatedFitError, match=_named(1)):
        fit(gmm(), runtime=Tamper(FD, VICTIM, sxx_1e200, from_round=1))


def test_an_m_step_failure_with_comparable_clients_names_nobody():
    from fedlatent.engine.fedem.update import dominant_client

    Q = np.array([[1.0, 2.0], [3.0, -1.0], [2.0, 0.5]])
    assert dominant_client(["a", "b", "c"], Q, np.full(3, 1 / 3)) is None
    Q[1] = 1e200
    assert dominant_client(["a", "b", "c"], Q, np.full(3, 1 / 3)).startswith(
        "client 'b' dominates them (its statistic reaches 1e+200 per unit")


# ---- a client whose handler raises ------------------------------------------------------------
class RaisingHandler(InProcessRuntime):
    """In-process clients; the victim's ``handle`` itself raises for ``method`` (from round
    ``from_round`` for E-steps). Clients one by one: the batched step calls no handler."""

    def __init__(self, fd, victim, method="estep", from_round=3):
        super().__init__(fd, batched=False)
        self.victim, self.method, self.from_round = victim, method, from_round
        node = self.nodes[victim]
        inner = node.handle

        def handle(method, msg):
            if method == self.method and int(msg.get("round", 0)) >= self.from_round:
                raise RuntimeError("handler crashed")
            return inner(method, msg)

        node.handle = handle


def test_a_handler_that_raises_mid_fit_is_a_missing_client():
    est = fit(gmm(), runtime=RaisingHandler(FD, VICTIM))
    for rec in est.history_[2:]:
        assert rec.missing == [VICTIM] and rec.participants == 7
        assert rec.errors == {VICTIM: "RuntimeError: handler crashed"}
    assert all(r.missing == [] for r in est.history_[:2])
    assert np.all(np.isfinite(est.means_))


def test_a_handler_that_raises_in_the_initialization_round_is_named():
    with pytest.raises(FederatedFitError, match=rf"clients \['{VICTIM}'\] did not answer the "
                       r"initialization round validly \(every client must\): client "
                       rf"'{VICTIM}': RuntimeError: handler crashed"):
        fit(gmm(), runtime=RaisingHandler(FD, VICTIM, from_round=1))


def test_a_handler_that_raises_on_an_initialization_query_is_named():
    with pytest.raises(FederatedFitError, match=rf"initialization \(moments\): client "
                       rf"'{VICTIM}': RuntimeError: handler crashed; nothing of this exchange "
                       r"was used") as err:
        fit(gmm(), runtime=RaisingHandler(FD, VICTIM, method="query", from_round=0))
    assert err.value.faults == {VICTIM: "RuntimeError: handler crashed"}


@pytest.mark.parametrize("scale", [1e-100, 1e-8, 1.0, 1e8, 1e100])
def test_the_psd_screen_passes_honest_singular_moments_at_any_scale(scale):
    """Rank-deficient moment matrices of honest data (a constant column, a column that is
    3 times another) pass at every scale: the tolerance is relative to each diagonal entry;
    a matrix breaking Cauchy-Schwarz by 1e-6 is refused at every scale."""
    from fedlatent.engine.protocol.messages import psd_failures

    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 1))
    Z = np.column_stack([x, 3 * x, np.full(50, 5.0), np.ones(50)]) * np.sqrt(scale)
    M = (Z.T @ Z)[None]
    assert psd_failures(M).size == 0
    bad = M.copy()
    c = np.sqrt(bad[0, 0, 0] * bad[0, 1, 1]) * (1 + 1e-6)
    bad[0, 0, 1] = bad[0, 1, 0] = c
    assert psd_failures(bad).tolist() == [0]
