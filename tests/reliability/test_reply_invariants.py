"""Replies are checked for meaning, not only for shape (issue 11, item 3).

A client whose statistics cannot be true (negative counts, more units than it set up, sums
shifted so that no data give them, 1e300) is left out of the round and named in
``history_.rejected``, or stops the fit naming it with ``on_invalid="raise"``; a client that
raises is missing with its exception text; an M-step that fails names the round and keeps the
last good state; initialization replies are checked the same way. Honest clients are never
rejected, whatever the federation settings.
"""

import warnings

import numpy as np
import pandas as pd
import pytest

import fedlatent as fl
from federations import make_blobs_federation
from fedlatent.engine import (
    ClientStep,
    FederatedModel,
    InProcessRuntime,
    Stats,
    register_model,
    run_federated_em,
)
from fedlatent.engine.fedem.history import History
from fedlatent.engine.rounds.loop import FederatedFitError, ServerStepError
from tolerance import assert_close, assert_same


class Tamper(InProcessRuntime):
    """In-process clients, except that ``edit`` rewrites the ``victim``'s replies to ``method``
    (``estep`` from round ``from_round`` on, or the initialization ``query`` named ``query``)."""

    def __init__(self, fd, victim, edit, method="estep", from_round=2, query=None):
        super().__init__(fd)
        self.victim, self.edit, self.method = victim, edit, method
        self.from_round, self.query, self.hits = from_round, query, 0

    def call(self, client_ids, method, messages):
        out = super().call(client_ids, method, messages)
        msg = messages.get(self.victim, {})
        if method != self.method or self.victim not in out:
            return out
        if method == "estep" and int(msg["round"]) < self.from_round:
            return out
        if self.query is not None and msg.get("query") != self.query:
            return out
        self.hits += 1
        out[self.victim] = self.edit(dict(out[self.victim]))
        return out


FD = make_blobs_federation(n_clients=8)
VICTIM = FD.client_ids[2]


def gmm(federation=None, rounds=6, **kw):
    return fl.FederatedGaussianMixture(3, max_rounds=rounds, tol=0.0, random_state=0,
                                       federation=federation, **kw)


def fit(est, fd=FD, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return est.fit(fd, **kw)


def negative_count(r):
    r["delta/nk"] = r["delta/nk"] - np.array([2.0, 0.0, 0.0])
    return r


def claims_1e9_units(r):
    r["n"] = 10**9
    return r


def shifted_sum_x(r):  # +1e6 to the client's sum of x (the mean statistic is sum / n)
    r["delta/sx"] = r["delta/sx"] + 1e6 / r["n"]
    return r


def huge(r):
    return {k: (np.full_like(v, 1e300) if k.startswith("delta/") else v) for k, v in r.items()}


@pytest.mark.parametrize("edit, reason", [
    (negative_count, r"count 'nk' is negative"),
    (claims_1e9_units, rf"claims 1e\+09 units, {FD[VICTIM].n_samples} at setup"),
    (shifted_sum_x, r"the moment matrix \[\[sum q, sum q x\], \[sum q x, sum q x x\^T\]\] of "
                    r"component \d is not positive semi-definite"),
    (huge, r"count 'nk' is [\d.]+e\+30\d at index 0, more than the \d+ units"),
])
def test_a_lying_client_is_left_out_and_named_in_history(edit, reason):
    """Control variates on, no quantizer (the default): the server rebuilds the client's own
    statistic from its difference and checks it every round it lies."""
    rt = Tamper(FD, VICTIM, edit, from_round=3)
    est = fit(gmm(), runtime=rt)
    assert rt.hits == 4
    for rec in est.history_[:2]:
        assert rec.rejected == {} and rec.participants == 8
    for rec in est.history_[2:]:
        assert list(rec.rejected) == [VICTIM] and rec.participants == 7
        assert pd.Series([rec.rejected[VICTIM]]).str.contains(reason).all(), rec.rejected
    assert np.all(np.isfinite(est.means_)) and np.all(np.isfinite(est.covariances_))
    assert VICTIM in est.history_.to_frame()["rejected"].iloc[-1]


def test_excluded_client_is_the_fit_without_it():
    """Without control variates an excluded client weighs nothing: the fit is the one of the
    other clients (to rounding), while the same lie aggregated moves the means by 100s."""
    fed = fl.Federation(control_variates=False)
    rt = Tamper(FD, VICTIM, shifted_sum_x, from_round=2)
    est = fit(gmm(fed, rounds=40), runtime=rt)
    assert all(list(r.rejected) == [VICTIM] for r in est.history_[1:])
    others = FD.subset([c for c in FD.client_ids if c != VICTIM])
    ref = fit(gmm(fed, rounds=40), others)
    order = lambda m: m[np.argsort(m[:, 0])]  # noqa: E731
    np.testing.assert_allclose(order(est.means_), order(ref.means_), rtol=1e-6, atol=1e-6)


def test_on_invalid_raise_stops_naming_the_client_and_keeps_the_last_good_round(tmp_path):
    fed = fl.Federation(on_invalid="raise")
    rt = Tamper(FD, VICTIM, negative_count, from_round=3)
    ck = tmp_path / "ck"
    with pytest.raises(FederatedFitError, match=rf"round 3: client '{VICTIM}' sent statistics "
                       r"that cannot be true: count 'nk' is negative \(-.* at index 0\); stopped "
                       r"\(on_invalid='raise'\), kept the parameters of round 2") as err:
        fit(gmm(fed), runtime=rt, checkpoint=ck)
    assert err.value.round_ == 3
    good = fit(gmm(fed, rounds=2))
    assert_close(err.value.last_good["means"], good.means_)  # per-client vs batched clients
    from fedlatent.engine.fedem.checkpoint import load_arrays_json

    arrays, meta = load_arrays_json(ck)
    assert meta["round"] == 2
    assert_close(arrays["params/means"], good.means_)


def test_on_invalid_is_validated_and_round_trips_through_the_config():
    with pytest.raises(ValueError, match=r"Federation\(on_invalid=...\) must be 'exclude' .* or "
                       r"'raise' \(stop the fit\), got 'ignore'"):
        gmm(fl.Federation(on_invalid="ignore")).fit(FD)
    fed = fl.Federation(on_invalid="raise", participation=0.5)
    assert fl.Federation.from_config(fed.to_config()) == fed
    assert fl.Federation.from_config({}).on_invalid == "exclude"


def test_a_client_that_raises_mid_round_is_missing_with_its_text():
    class Raising(InProcessRuntime):
        def call(self, client_ids, method, messages):
            node = self.nodes[VICTIM]
            if method == "estep" and messages[client_ids[0]]["round"] == 3:
                state_before = {k: v.copy() for k, v in node.state.items()}

                def boom(*a, **k):
                    raise RuntimeError("disk on fire")

                node._local_stats = boom
                try:
                    return super().call(client_ids, method, messages)
                finally:
                    del node._local_stats
                    assert node.state.keys() == state_before.keys()
                    for key in state_before:  # the failed round left its state as it was
                        assert_same(node.state[key], state_before[key])
            return super().call(client_ids, method, messages)

    est = fit(gmm(fl.Federation(step_size=0.5)), runtime=Raising(FD))
    rec = est.history_[2]
    assert rec.missing == [VICTIM] and rec.participants == 7 and rec.rejected == {}
    assert rec.errors == {VICTIM: "RuntimeError: disk on fire"}
    assert all(r.missing == [] and r.errors == {} for i, r in enumerate(est.history_) if i != 2)


# ---- the server step -------------------------------------------------------------------------
@register_model
class FragileToy(FederatedModel):
    """mu <- mean x; the M-step's linear system turns singular at its ``fail_at``-th call."""

    name = "test-fragile-toy"

    def __init__(self, fail_at: int = 4, error: str = "linalg"):
        super().__init__(fail_at=fail_at, error=error)
        self.fail_at, self.error = fail_at, error

    def client_stats(self, params, data, state, rng, rows=None):
        X = data.X if rows is None else data.X[rows]
        return ClientStep(Stats({"s": X.sum(0)}), X.shape[0], 0.0, state)

    def stat_shapes(self, params):
        return {"s": params["mu"].shape}

    def reply_numbers(self, data):
        return None  # declared off: the toy's clients (3 rows and up) test the loop, not the rule

    def evaluated_shapes(self, data):
        return {"mu": (data.n_features,)}

    def server_step(self, S, params, n_total):
        t = float(params["t"]) + 1
        if t >= self.fail_at:
            if self.error == "linalg":
                np.linalg.cholesky(-np.eye(2))
            with np.errstate(over="raise"):
                np.exp(np.array([1e4]))
        return {"mu": S["s"] * 0.5 + params["mu"] * 0.5, "t": np.array(t)}


@pytest.mark.parametrize("error, kind", [("linalg", "LinAlgError"),
                                         ("overflow", "FloatingPointError")])
def test_server_step_failure_names_the_round_and_keeps_the_last_good_state(tmp_path, error,
                                                                           kind):
    fd = make_blobs_federation(n_clients=4)
    p0 = {"mu": np.zeros(4), "t": np.array(0.0)}
    ck = tmp_path / "ck"
    with pytest.raises(ServerStepError, match=rf"round 4: the M-step failed on the aggregated "
                       rf"statistics \({kind}: .*\); kept the parameters of round 3") as err:
        run_federated_em(FragileToy(4, error), InProcessRuntime(fd), fl.Federation(), p0,
                         seed=0, max_rounds=8, tol=0.0, progress=False, checkpoint=ck)
    assert isinstance(err.value, ValueError) and err.value.round_ == 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        good = run_federated_em(FragileToy(99, error), InProcessRuntime(fd), fl.Federation(),
                                p0, seed=0, max_rounds=3, tol=0.0, progress=False)
    # exact: one runtime and one toy model, the same operations until round 3 in both runs
    assert_same(err.value.last_good["mu"], good.params["mu"])
    from fedlatent.engine.fedem.checkpoint import load_arrays_json

    arrays, meta = load_arrays_json(ck)
    assert meta["round"] == 3
    assert_same(arrays["params/mu"], good.params["mu"])


# ---- initialization exchanges ----------------------------------------------------------------
def _edit(key, fn):
    def edit(r):
        r[key] = fn(np.asarray(r[key]))
        return r
    return edit


@pytest.mark.parametrize("query, edit, reason", [
    ("moments", _edit("sxx", lambda a: a - 1e4 * np.eye(len(a))),
     r"value 'sxx': the moment matrix \[\[sum x x\^T, sum x\], \[., n\]\] of block 0 is not "
     r"positive semi-definite"),
    ("moments", _edit("n", lambda a: 10**9),
     rf"value 'n': claims 1e\+09 samples, {FD[VICTIM].n_samples} at setup"),
    ("kmeans", _edit("counts", lambda a: a + 1e9),
     r"value 'counts': count 'counts' is 1e\+09.* more than the \d+ units"),
    ("kmeans", _edit("centroids", lambda a: a * -50.0),
     r"value 'centroids': the samples left over by the centroids .* not positive semi-definite"),
    ("hard_stats", _edit("stat/nk", lambda a: a * 3),
     r"value 'stat/nk': count 'nk' is \d+ at index \d, more than the \d+ units"),
    ("hard_stats", _edit("stat/sx", lambda a: a + 1e6),
     r"value 'stat/nk': the moment matrix .* of component \d is not positive semi-definite"),
])
def test_an_initialization_reply_that_cannot_be_true_is_named(query, edit, reason):
    rt = Tamper(FD, VICTIM, edit, method="query", query=query)
    with pytest.raises(FederatedFitError, match=rf"client '{VICTIM}': {reason}.*nothing of this "
                       "exchange was used"):
        # the exchanges of the "kmeans-federated" start (local centroids, then hard_stats)
        fit(gmm(init_params="kmeans-federated"), runtime=rt)
    assert rt.hits == 1


@pytest.mark.parametrize("edit, reason", [
    (_edit("stat/nk", lambda a: a + 1.0), r"counts 'nk' sum to [\d.]+, not to the \d+ units"),
    (_edit("stat/syy", lambda a: a * 1e-6),
     r"the moment matrix \[\[sum r x x\^T, sum r x y\], \[., sum r y\^2\]\] of component \d is "
     r"not positive"),
    (_edit("n", lambda a: 10**9), r"claims 1e\+09 rows"),
])
def test_latent_class_regression_random_start_is_checked(edit, reason):
    from test_estimators import _lcr_data

    fd = _lcr_data()
    victim = fd.client_ids[1]
    rt = Tamper(fd, victim, edit, method="query", query="random_stats")
    with pytest.raises(FederatedFitError, match=rf"client '{victim}': value '.*': {reason}"):
        fit(fl.LatentClassRegression(2, max_rounds=3, random_state=0), fd, runtime=rt)


# ---- honest clients are never rejected -------------------------------------------------------
@pytest.mark.usefixtures("saturation_rule_off")
@pytest.mark.parametrize("federation", [
    fl.Federation(quantizer=fl.Quantizer(4)),
    fl.Federation(batch_size=16, step_size=0.5),
    fl.Federation(variance_reduction=fl.Spider(3, 16), step_size=0.5),
    fl.Federation(participation=0.5, step_size=0.5),
    fl.Federation(participation=0.5, step_size=0.5, alpha=0.5),
    fl.Federation(participation=0.7, control_variates=False, client_weighting="uniform"),
], ids=["quantizer", "mini-batch", "spider", "partial", "partial-alpha", "uniform"])
def test_honest_clients_are_never_rejected(federation):
    est = fit(gmm(federation, rounds=12))
    assert [r.rejected for r in est.history_] == [{}] * 12


def test_a_lost_reply_does_not_make_an_honest_client_rejected_later():
    """A reply lost after the client updated its control variate: the server no longer knows
    V_c, so it stops rebuilding that client's statistic instead of rejecting it."""
    class Losing(InProcessRuntime):
        def call(self, client_ids, method, messages):
            out = super().call(client_ids, method, messages)
            if method == "estep" and messages[client_ids[0]]["round"] == 3:
                out.pop(VICTIM)
            return out

    est = fit(gmm(rounds=8), runtime=Losing(FD))
    assert est.history_[2].missing == [VICTIM]
    assert [r.rejected for r in est.history_] == [{}] * 8


def test_history_round_trips_the_new_columns_and_reads_old_histories():
    rec = {"round": 2, "objective": -1.5, "h_norm2": None, "bytes_up": 10, "bytes_down": 20,
           "participants": 7, "step_size": 1.0, "seconds": 0.1, "missing": "c1"}
    old = History.from_records([rec])  # saved before the columns existed
    assert old[0].rejected == {} and old[0].errors == {} and old[0].missing == ["c1"]
    h = History.from_records([{**rec, "rejected": {"c3": "count 'nk' is negative; x: y"},
                               "errors": {"c1": "RuntimeError: boom"}}])
    back = History.from_records(h.to_frame().to_dict(orient="records"))
    assert back == h
    with pytest.raises(ValueError, match="a history's reasons must be a JSON object"):
        History.from_records([{**rec, "rejected": "[1, 2]"}])


def test_a_saved_model_keeps_who_was_rejected(tmp_path):
    est = fit(gmm(rounds=4), runtime=Tamper(FD, VICTIM, negative_count, from_round=3))
    est.save(tmp_path / "m")
    back = fl.FederatedGaussianMixture.load(tmp_path / "m")
    assert [r.rejected for r in back.history_] == [r.rejected for r in est.history_]
    assert list(back.history_[-1].rejected) == [VICTIM]


@pytest.mark.parametrize("compiled", [True, False])
def test_a_lie_is_left_out_of_the_sum_whichever_screen_reads_it(monkeypatch, compiled):
    """The compiled screen adds the round's weighted sum as it reads the replies; a round with
    a refused reply is summed over the accepted rows apart: the liar is named and the fit is
    the NumPy screen's (to rounding), the one without its lies."""
    import fedlatent.engine.protocol.compiled as comp

    fed = fl.Federation(control_variates=False)
    monkeypatch.setattr(comp, "ready", lambda: False)
    monkeypatch.setattr(comp, "MIN_WORK", 10**12)
    ref = fit(gmm(fed, rounds=6), runtime=Tamper(FD, VICTIM, shifted_sum_x, from_round=2))
    monkeypatch.setattr(comp, "MIN_WORK", 1 if compiled else 10**12)
    est = fit(gmm(fed, rounds=6), runtime=Tamper(FD, VICTIM, shifted_sum_x, from_round=2))
    assert [list(r.rejected) for r in est.history_] == [[]] + [[VICTIM]] * 5
    assert_close(est.means_, ref.means_, rtol=1e-10)
    assert_close(est.covariances_, ref.covariances_, rtol=1e-10)
