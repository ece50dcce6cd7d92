"""A server that crafts the parameters a site evaluates (issue 38), against a real ClientNode.

The attacker sends, beside one broad component, sharp "probe" components (standard deviation
0.02) at random places; a probe that holds one record alone gives it back: its block's
``sx / nk`` is the record and its spread ``sxx / nk - (sx / nk)^2`` vanishes. It keeps every
row so found. Two cases:

- more probes than the setup declared (the issue's second attack: a 2-component setup, then
  101 components a round): refused by the site at the first such round since the site checks
  that what it evaluates is what it declared (:mod:`fedlatent.engine.node.declared`), so
  nothing is rebuilt;
- the positive control: as many components as the setup declared and the saturation rule
  admits (22 for 200 records in 2-d), without secure aggregation: the attacker rebuilds rows
  (this pins that it works).

Under secure aggregation (:func:`secure_attack`: five sites of 200 records, each with the
library's default site policy), the same probes over the federation's sum: with the defaults
(verified rounds, :mod:`fedlatent.engine.node.verify`) every crafted round is refused by
every site and nothing is rebuilt; with ``verified=False`` (the positive control) the sum
still isolates the federation's records in the probes and rows come back.
"""

from __future__ import annotations

import warnings

import numpy as np

import fedlatent as fl
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.protocol.messages import ERROR_KEY, pack, unpack
from fedlatent.engine.rounds.fitsetup import setup_fit
from fedlatent.engine.site.policy import SitePolicy
from fedlatent.engine.transport.inprocess import InProcessRuntime
from fedlatent.models.gmm.math import compute_precision_cholesky
from fedlatent.models.gmm.model import GMMModel

SHARP = 0.02


def _site(n=200, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, 2))
    fd = fl.FederatedDataset.from_arrays({"site": X})
    return fd, X


def _set_up(fd, K: int):
    """A runtime whose one site accepted a fit's setup of ``K`` components (an honest first
    round run by a real fit)."""
    rt = InProcessRuntime(fd, batched=False)
    est = fl.FederatedGaussianMixture(K, max_rounds=1, tol=0.0, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(fd, runtime=rt)
    return rt


def _probes(rng, K: int) -> dict:
    """One broad component and ``K - 1`` sharp ones at random places of the data's range."""
    means = np.vstack([np.zeros((1, 2)), rng.uniform(-2.5, 2.5, size=(K - 1, 2))])
    cov = np.repeat(np.eye(2)[None] * SHARP**2, K, 0)
    cov[0] = np.eye(2) * 4.0
    w = np.full(K, 0.5 / (K - 1))
    w[0] = 0.5
    return {"weights": w, "means": means,
            "precisions_cholesky": compute_precision_cholesky(cov, "full"),
            "center": np.zeros(2)}


def _rows(reply: dict, floor: float = 1e-3 / 200, flat: float = 1e-8) -> np.ndarray:
    """The records the reply gives back: probe blocks of one record (no spread: below
    ``flat``; blocks of weight below ``floor`` left out)."""
    d = unpack(reply, "delta")
    nk, sx, sxx = d["nk"][1:], d["sx"][1:], d["sxx"][1:]
    ok = nk > floor
    mean = sx[ok] / nk[ok, None]
    spread = np.einsum("kii->k", sxx[ok]) / nk[ok] - np.einsum("ki,ki->k", mean, mean)
    return mean[np.abs(spread) < flat]


def attack(rt, K: int, rounds: int, seed: int = 1) -> tuple[np.ndarray, list[str]]:
    """``(rows rebuilt, refusals)`` after ``rounds`` crafted rounds of ``K`` components
    (statistics about centre 0, no control variates: each reply is the mean statistic)."""
    rng = np.random.default_rng(seed)
    found, refusals = [], []
    for k in range(rounds):
        msg = {"seed": 0, "round": 100 + k, "mode": "full", **pack("params", _probes(rng, K))}
        reply = rt.call(["site"], "estep", {"site": msg})["site"]
        if ERROR_KEY in reply:
            refusals.append(str(reply[ERROR_KEY]))
            continue
        found.extend(_rows(reply))
    return (np.unique(np.round(np.array(found), 6), axis=0) if found else np.zeros((0, 2)),
            refusals)


def _matched(rows: np.ndarray, X: np.ndarray, tol: float = 1e-4) -> int:
    """How many distinct records of ``X`` some rebuilt row equals to ``tol``."""
    if len(rows) == 0:
        return 0
    d = np.abs(rows[:, None, :] - X[None, :, :]).max(axis=2)
    return int(np.unique(np.argmin(d, axis=1)[d.min(axis=1) < tol]).size)


def test_probes_beyond_the_declared_components_rebuild_nothing():
    fd, X = _site()
    rt = _set_up(fd, 2)
    rows, refusals = attack(rt, 101, 5)
    assert _matched(rows, X) == 0 and len(rows) == 0
    assert len(refusals) == 5
    assert "round 100 refused: parameter 'means' has shape (101, 2), the setup declared " \
           "(2, 2)" in refusals[0]


def test_positive_control_probes_within_the_declared_components_rebuild_rows():
    fd, X = _site()
    rt = _set_up(fd, 22)
    rows, refusals = attack(rt, 22, 20)
    assert refusals == []
    n = _matched(rows, X)
    assert n >= 20, n  # the attacker works: verified rounds must bring this to 0
    assert n == len(rows)  # every row it keeps is a record


def secure_attack(verified, K: int = 22, rounds: int = 10, sites: int = 5):
    """``(records rebuilt, rows kept, refusals)``: the probes of :func:`attack` sent as a
    server would under secure aggregation (a fit's setup and channel, then crafted E-step
    exchanges), each rebuilt from the federation's unmasked sum, over sites holding the
    library's default site policy."""
    rng = np.random.default_rng(0)
    X = {f"s{i}": rng.normal(size=(200, 2)) for i in range(sites)}
    fd = fl.FederatedDataset.from_arrays(X)
    rt = InProcessRuntime(fd, batched=False, policies=SitePolicy())
    setup = setup_fit(rt, GMMModel(K, "full", 1e-6),
                      fl.Federation(secure_aggregation=True, verified=verified), rounds)
    N = sum(setup.n_units.values())
    w = {c: setup.n_units[c] / N for c in fd.client_ids}
    found, refusals = [], []
    for k in range(1, rounds + 1):
        msg = {"seed": 0, "round": k, "mode": "full", "control_variates": False,
               "alpha": 1.0, "quant_levels": 0, **pack("params", _probes(rng, K))}
        try:
            res = setup.secure.sum("estep", dict.fromkeys(fd.client_ids, msg), round=k,
                                   exchange="estep", weights=w)
        except FederatedFitError as err:
            refusals.append(str(err))
            continue
        d = {k2[len("delta/"):]: v for k2, v in res["sums"].items() if k2.startswith("delta/")}
        found.extend(_rows({f"delta/{b}": v for b, v in d.items()}, floor=1e-9, flat=1e-6))
    rows = np.unique(np.round(np.array(found), 6), axis=0) if found else np.zeros((0, 2))
    return _matched(rows, np.vstack(list(X.values()))), len(rows), refusals


def test_under_secure_aggregation_with_the_defaults_the_attacker_rebuilds_nothing():
    n, kept, refusals = secure_attack(None)
    assert (n, kept) == (0, 0)
    assert len(refusals) == 10  # every crafted round, each refused by all five sites
    assert refusals[0].count("round 1 refused: its start cannot be replayed") == 5
    assert all(r.count("refused: ") >= 5 for r in refusals)  # (a crafted start each time)


def test_positive_control_under_secure_aggregation_without_verification_rows_come_back():
    n, kept, refusals = secure_attack(False)
    assert refusals == []
    assert n >= 10, n  # the sum still isolates the federation's records in sharp probes
    assert n == kept
