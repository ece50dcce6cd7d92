"""The saturation rule (issue 22, item 1): a reply may not carry more free numbers than a third
of the values of the records it summarizes (DataSHIELD's ``nfilter.glm``).

A client of 3 rows (exactly ``min_records``) in two dimensions is six unknowns; a two-component
Gaussian mixture's round statistic is twelve numbers about them, and they give the rows back
(the positive control solves them, with the rule disabled). Under the default policy the client
refuses at setup, before any round, naming itself, the rule and the fixes."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from scipy.optimize import least_squares

import fedlatent as fl
from fedlatent.data.client import ClientData
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.node.client import ClientNode
from fedlatent.engine.privacy.enforce import policy_to_json
from fedlatent.engine.protocol.messages import ERROR_KEY, REFUSED_KEY
from fedlatent.engine.site import SitePolicy
from fedlatent.engine.warn import SitesExcludedWarning
from fedlatent.models.gmm.model import GMMModel

NO_SATURATION = fl.DisclosurePolicy(max_parameters_per_record=math.inf)


def _three_row_federation(seed=0):
    rng = np.random.default_rng(seed)
    data = {c: rng.normal(size=(60, 2)) * 2 + rng.normal(size=2) * 3 for c in ("a", "b")}
    data["small"] = rng.normal(size=(3, 2)) * 2
    return fl.FederatedDataset.from_arrays(data), data["small"]


def _gmm(policy, **kw):
    return fl.FederatedGaussianMixture(2, random_state=0, max_rounds=2, verbose=False,
                                       federation=fl.Federation(disclosure=policy, **kw))


def _first_estep(log, client):
    """``(params, sums)`` of the client's first E-step reply (the initialization round sends
    the statistic itself, as a mean over its rows)."""
    down = None
    for direction, cid, method, msg in log:
        if cid != client or method != "estep":
            continue
        if direction == "down":
            down = msg
            continue
        n = float(msg["n"])
        sums = {k[6:]: np.asarray(v) * n for k, v in msg.items() if k.startswith("delta/")}
        params = {k[7:]: np.asarray(v) for k, v in down.items() if k.startswith("params/")}
        return params, sums
    raise AssertionError(f"no E-step reply of {client!r}")


def _solve_three_rows(params, sums):
    """The honest-but-curious server's solve: the totals fix the rows' mean and scatter, so
    the rows are ``m + B R L^T`` (``B`` an orthonormal basis of the vectors orthogonal to
    ``1``, ``L`` the scatter's Cholesky factor, ``R`` a rotation or reflection); the
    per-component split of the soft sums fixes the angle."""
    model = GMMModel(2)
    n = float(sums["nk"].sum())
    c = params["center"]
    m = c + sums["sx"].sum(axis=0) / n
    scatter = sums["sxx"].sum(axis=0) - n * np.outer(m - c, m - c)
    L = np.linalg.cholesky(scatter)
    B = np.linalg.svd(np.eye(3) - 1.0 / 3)[0][:, :2]

    def rows(phi, flip):
        R = np.array([[np.cos(phi), -np.sin(phi)], [np.sin(phi), np.cos(phi)]])
        return m + B @ (R @ np.diag([1.0, flip])) @ L.T

    def resid(phi, flip):
        got = model.client_stats(params, ClientData(rows(phi[0], flip)), {}, None).stats
        return np.concatenate([np.ravel(got[k] - sums[k]) for k in ("nk", "sx", "sxx")])

    best = min(((phi, flip) for flip in (1.0, -1.0) for phi in np.linspace(0, 2 * np.pi, 721)),
               key=lambda a: float(np.sum(resid([a[0]], a[1]) ** 2)))
    fit = least_squares(resid, [best[0]], args=(best[1],), xtol=1e-15, ftol=1e-15, gtol=1e-15)
    return rows(fit.x[0], best[1])


def _fit(est, fd):
    rt = fl.InProcessRuntime(fd, record=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est.fit(fd, runtime=rt)
    return rt.log


def test_three_rows_come_back_from_round_one_without_the_saturation_rule():
    fd, X = _three_row_federation()
    log = _fit(_gmm(NO_SATURATION), fd)
    got = _solve_three_rows(*_first_estep(log, "small"))
    err = np.abs(got[:, None, :] - X[None, :, :]).max(axis=2).min(axis=0)
    assert err.max() < 1e-8  # every row, to 1e-8 (the positive control)


def test_the_three_row_client_refuses_at_setup_under_the_default_policy():
    fd, _ = _three_row_federation()
    rt = fl.InProcessRuntime(fd, record=True)
    with pytest.warns(SitesExcludedWarning, match=r"client 'small': the round statistic "
                      r"carries 12 free numbers about 3 record\(s\) of 2 value\(s\).*"
                      r"max_parameters_per_record=0\.33.*Merge sites to at least 19 records.*"
                      r"secure_aggregation"):
        est = _gmm(fl.DisclosurePolicy()).fit(fd, runtime=rt)
    assert list(est.excluded_clients_) == ["small"]  # left out; the others fitted
    assert {m for _, c, m, _ in rt.log if c == "small"} == {"setup"}  # refused before round 1
    up = [msg for d, c, _, msg in rt.log if d == "up" and c == "small"]
    assert [set(u) for u in up] == [{ERROR_KEY, REFUSED_KEY}]


@pytest.mark.parametrize(("cov", "expected"), [("full", 2 * 6), ("tied", 2 * 3 + 3),
                                               ("diag", 2 * 5), ("spherical", 2 * 5)])
def test_a_gaussian_mixture_declares_its_free_numbers(cov, expected):
    assert GMMModel(2, covariance_type=cov).reply_numbers(ClientData(np.zeros((4, 2)))) \
        == expected


def test_free_numbers_count_a_symmetric_block_once():
    from fedlatent.engine.privacy.disclosure import free_numbers

    assert free_numbers({"nk": (3,), "sx": (3, 4), "sxx": (3, 4, 4)}, ("sxx",)) \
        == 3 * (1 + 4 + 10)
    assert free_numbers({"sxx": (3, 4, 4)}) == 48


def test_the_rule_is_a_third_of_the_values():
    from fedlatent.engine.privacy.disclosure import check_reply_numbers

    pol = fl.DisclosurePolicy()
    assert check_reply_numbers(pol, "x", 19, 29, 2, "r") is None  # 19 <= 0.33 * 58
    assert "carries 20 free numbers" in check_reply_numbers(pol, "x", 20, 30, 2, "r")
    assert check_reply_numbers(pol, "x", None, 1, 2, "r") is None  # nothing declared


def _models(rng):
    """Each model that sends per-client statistics, with a client of 5 records its numbers
    saturate (and two large clients)."""
    X = {c: rng.normal(size=(n, 2)) for c, n in (("a", 80), ("b", 90), ("small", 5))}
    y = {c: (x[:, 0] > 0).astype(float) for c, x in X.items()}
    codes = {c: rng.integers(0, 2, size=(len(x), 4)).astype(float) for c, x in X.items()}
    codes["small"] = np.tile([0.0, 1.0, 0.0, 1.0], (5, 1))  # no rare category: saturation
    ents = {c: np.repeat(np.arange(len(x) // 5), 5)[:len(x)] for c, x in X.items()}
    xy = fl.FederatedDataset.from_arrays({c: (X[c], X[c] @ [1.0, -1.0]) for c in X})
    return [
        ("gmm", fl.FederatedGaussianMixture(2, random_state=0, max_rounds=2),
         fl.FederatedDataset.from_arrays(X)),
        ("lcr", fl.LatentClassRegression(2, random_state=0, max_rounds=2), xy),
        ("lca", fl.LatentClassAnalysis(3, random_state=0, max_rounds=2),
         fl.FederatedDataset.from_arrays(codes)),
        ("fedgmm", fl.FedGMM(n_input_components=2, n_learners=2, random_state=0,
                             max_rounds=2),
         fl.FederatedDataset.from_arrays({c: (X[c], y[c]) for c in X})),
        ("hlcr", fl.HLCR(n_clusters=2, random_state=0, max_rounds=2),
         fl.FederatedDataset.from_arrays({c: (X[c], X[c] @ [1.0, -1.0]) for c in X},
                                         entities=ents)),
    ]


@pytest.mark.parametrize("i", range(5), ids=["gmm", "lcr", "lca", "fedgmm", "hlcr"])
def test_every_model_that_sends_statistics_is_checked_at_setup(i):
    name, est, fd = _models(np.random.default_rng(1))[i]
    rt = fl.InProcessRuntime(fd, record=True)
    with pytest.warns(SitesExcludedWarning, match=r"client 'small': the round statistic "
                      r"carries \d+ free numbers about 5 record"):
        est.fit(fd, runtime=rt)
    assert list(est.excluded_clients_) == ["small"], name
    assert {m for _, c, m, _ in rt.log if c == "small"} == {"setup"}, name


def test_a_site_floor_the_server_cannot_lower():
    X = np.random.default_rng(2).normal(size=(10, 2))
    node = ClientNode("site", ClientData(X), disclosure=fl.DisclosurePolicy())
    model = GMMModel(2)
    msg = {"model": "gmm", "model_config": json.dumps(model.get_config()),
           "disclosure": policy_to_json(NO_SATURATION), "fit": 1}
    reply = node.handle("setup", msg)  # the site's floor held (its default policy's guard)
    assert "max_parameters_per_record=inf (floor 0.33)" in reply[ERROR_KEY]
    open_node = ClientNode("site", ClientData(X), policy=SitePolicy.for_simulation())  # no floor
    assert ERROR_KEY not in open_node.handle("setup", msg)
    stricter = ClientNode("site", ClientData(np.random.default_rng(3).normal(size=(40, 2))),
                          disclosure=fl.DisclosurePolicy(max_parameters_per_record=0.1),
                          policy=SitePolicy.for_simulation())
    msg["disclosure"] = policy_to_json(fl.DisclosurePolicy())  # 12 <= 0.33 * 80, not 0.1 * 80
    assert "max_parameters_per_record=0.1" in stricter.handle("setup", msg)[ERROR_KEY]


def test_a_mini_batch_is_checked_at_setup():
    rng = np.random.default_rng(4)
    fd = fl.FederatedDataset.from_arrays({c: rng.normal(size=(80, 2)) for c in "abc"})
    est = fl.FederatedGaussianMixture(2, random_state=0, max_rounds=2,
                                      federation=fl.Federation(batch_size=10, step_size=0.5))
    with pytest.raises(FederatedFitError, match=r"client 'a': a mini-batch statistic carries "
                                                r"12 free numbers about 10 record"):
        est.fit(fd)


def test_under_secure_aggregation_the_rule_covers_the_smallest_cohort():
    pytest.importorskip("cryptography")
    rng = np.random.default_rng(5)
    small = {f"s{i}": rng.normal(size=(4, 2)) for i in range(5)}  # 4 rows: 12 > 0.33 * 8
    fd = fl.FederatedDataset.from_arrays(small)
    fed = fl.Federation(secure_aggregation=True)
    est = fl.FederatedGaussianMixture(2, random_state=0, max_rounds=2, federation=fed)
    with pytest.raises(FederatedFitError, match=r"the smallest aggregate secure aggregation "
                                                r"can unmask \(3 client\(s\).*12 free numbers "
                                                r"about 12 record\(s\)"):
        est.fit(fd)  # threshold 3 of 5: 12 records, 24 values, 12 > 0.33 * 24
    big = {**small, **{f"t{i}": rng.normal(size=(30, 2)) for i in range(4)}}
    fd = fl.FederatedDataset.from_arrays(big)  # threshold 5 of 9: 20 records, 40 values
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        fitted = fl.FederatedGaussianMixture(2, random_state=0, max_rounds=2,
                                             federation=fed).fit(fd)
    assert np.isfinite(fitted.means_).all()  # each 4-row client alone would be refused
