"""Differencing of secure aggregates over changing cohorts (issue 22, item 1).

With partial participation and no control variates, every round's secure aggregate is
``sum_{c in cohort} w_c (S_c / n_c - S_hat)``; the server knows ``S_hat`` and the weights, and
the totals ``sum_k sum r (x - centre)`` of ``S_c`` do not change between rounds. Over 40
rounds the cohorts' incidence matrix has full rank, and least squares gives every client's mean
row, a one-row client's row itself. The Federation refuses that setting under the default
policy (the positive control runs it with the policy off); with control variates (the fix) the
replies are differences in which the totals cancel, and the same least squares fails."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("cryptography")

import fedlatent as fl  # noqa: E402
from fedlatent.engine.secagg.secure import SecureChannel  # noqa: E402

ROUNDS = 41  # the initialization round and 40 more


def _fd(seed=0):
    rng = np.random.default_rng(seed)
    data = {f"c{i}": rng.normal(size=(30, 2)) * 2 + rng.normal(size=2) * 3 for i in range(7)}
    data["tiny"] = np.array([[0.7, -1.3]])
    return fl.FederatedDataset.from_arrays(data), data


def _least_squares_attack(monkeypatch, federation):
    """Fit with every secure E-step aggregate recorded; return the attacker's estimate of each
    client's mean row (as if the replies were ``S_c / n_c - S_hat``) and the truth."""
    seen = []
    original = SecureChannel.sum

    def recording(self, method, msgs, **kw):
        out = original(self, method, msgs, **kw)
        if method == "estep":
            seen.append((msgs, kw.get("weights") or {}, out))
        return out

    monkeypatch.setattr(SecureChannel, "sum", recording)
    fd, data = _fd()
    est = fl.FederatedGaussianMixture(2, random_state=0, max_rounds=ROUNDS, tol=0.0,
                                      federation=federation)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est.fit(fd)
    cids = list(fd.client_ids)
    A, Y = [], []
    for msgs, weights, out in seen:
        msg = next(iter(msgs.values()))
        S = out["survivors"]
        w = np.array([weights.get(c, 0.0) if c in S else 0.0 for c in cids])
        shat = np.asarray(msg.get("S_hat/sx", np.zeros((2, 2)))).sum(axis=0)
        A.append(w)
        Y.append(np.asarray(out["sums"]["delta/sx"]).sum(axis=0) + w.sum() * shat)
    v = np.linalg.lstsq(np.array(A) > 0, np.array(Y), rcond=None)[0]  # v_c = w_c mean_c
    centre = np.asarray(next(iter(seen[-1][0].values()))["params/center"])
    w_c = np.array([seen[0][1][c] for c in cids])
    guess = {c: centre + v[i] / w_c[i] for i, c in enumerate(cids)}
    truth = {c: data[c].mean(axis=0) for c in cids}
    return guess, truth, len(seen)


def test_the_setting_is_refused_with_its_fixes():
    fd, _ = _fd()
    rt = fl.InProcessRuntime(fd, record=True)
    fed = fl.Federation(secure_aggregation=True, participation=0.6, control_variates=False)
    with pytest.raises(ValueError, match=r"participation=0\.6, control_variates=False\).*"
                                         r"least squares.*Use control_variates=True.*"
                                         r"participation=1\.0.*differential privacy"):
        fl.FederatedGaussianMixture(2, federation=fed).fit(fd, runtime=rt)
    assert rt.log == []  # refused before any message
    fl.Federation(secure_aggregation=True, participation=0.6).validate()  # control variates
    fl.Federation(secure_aggregation=True, control_variates=False).validate()  # every client


def test_least_squares_recovers_a_one_row_client_with_the_policy_off(monkeypatch):
    fed = fl.Federation(secure_aggregation=True, participation=0.6, control_variates=False,
                        disclosure=fl.DisclosurePolicy.off())
    guess, truth, rounds = _least_squares_attack(monkeypatch, fed)
    assert rounds >= 20
    assert np.abs(guess["tiny"] - truth["tiny"]).max() < 1e-6  # the row itself
    assert max(np.abs(guess[c] - truth[c]).max() for c in truth) < 1e-6  # every client's


def test_least_squares_fails_with_control_variates(monkeypatch):
    fed = fl.Federation(secure_aggregation=True, participation=0.6)
    guess, truth, rounds = _least_squares_attack(monkeypatch, fed)
    assert rounds >= 20
    assert np.abs(guess["tiny"] - truth["tiny"]).max() > 1e-3
