"""HLCR benchmark: label-sampling throughput and FedHLCR seconds per round.

1. Entities per second of the likelihood part of label sampling (all K clusters of one entity):
   - fast path: entity statistics + one Cholesky per (entity, cluster), numba, batched;
   - the literal port of the paper's Algorithm 1 (event-by-event Woodbury recursion, NumPy,
     ``tests/hlcr_reference.py``): the reference the ratio is printed against;
   - the same recursion compiled with numba (to separate the algorithmic gain from compilation).
   at N_ij = 5, 20, 100 events, F = 10 features, K = 16 clusters.
2. Seconds per FedHLCR round (in-process, full participation) on SYNTHHLCR with 128 agents x
   128 entities, N** = 20 events per pair.
3. FedHLCR against the Gibbs sampler it federates (issue 23): CPU seconds of the whole
   fit ``fl.HLCR(4, max_rounds=100)`` (the defaults before issue 24; every agent each round,
   the agents stepping together in-process) and of
   ``fl.HLCR(solver="gibbs")`` on SYNTHHLCR with 130 agents, 2,400 agent-entity pairs and
   30,000 events (K = 4, F = 5), one BLAS thread, in one run; their ratio (at most 2), and the
   agents stepping one by one (``InProcessRuntime(batched=False)``, the path a deployment's
   nodes take) for reference.

Usage: ``python benchmarks/bench_hlcr.py [--quick]``
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import time
import warnings
from pathlib import Path

import numpy as np
from _common import blas_limit  # noqa: E402 (this folder is on sys.path)
from numba import njit

import fedlatent as fl
from fedlatent.models.hlcr import entity_log_marginal, entity_statistics

_spec = importlib.util.spec_from_file_location(
    "hlcr_reference", Path(__file__).resolve().parents[1] / "tests" / "hlcr_reference.py"
)
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)


@njit(cache=True)
def _algorithm1_numba(X, y, H, c, sigma):
    K, F = c.shape
    s2 = sigma * sigma
    out = np.empty(K)
    Ainv = np.empty((F, F))
    b = np.empty(F)
    Ax = np.empty(F)
    for k in range(K):
        Ainv[:, :] = H[k]
        b[:] = c[k]
        lp = 0.0
        for n in range(X.shape[0]):
            x = X[n]
            mean = 0.0
            var = s2
            for i in range(F):
                t = 0.0
                for j in range(F):
                    t += Ainv[i, j] * x[j]
                Ax[i] = t
                mean += b[i] * t
                var += x[i] * t
            lp += -0.5 * math.log(2 * math.pi * var) - 0.5 * (y[n] - mean) ** 2 / var
            for i in range(F):
                b[i] += x[i] * y[n] / s2
            for i in range(F):
                for j in range(F):
                    Ainv[i, j] -= Ax[i] * Ax[j] / var  # eq. (8)
        out[k] = lp
    return out


def throughput(n_events: int, F: int = 10, K: int = 16, sigma: float = 1.0, quick=False):
    rng = np.random.default_rng(n_events)
    n_fast = 2000 if not quick else 200
    n_slow = max(4, (400 if not quick else 40) // n_events)
    Xc = rng.normal(size=(K, 200, F))
    D = np.eye(F)[None] + np.einsum("kni,knj->kij", Xc, Xc) / sigma**2
    c = np.einsum("kni,kn->ki", Xc, rng.normal(size=(K, 200))) / sigma**2
    H = np.linalg.inv(D)
    X = rng.normal(size=(n_fast * n_events, F))
    y = rng.normal(size=n_fast * n_events)
    ent = np.repeat(np.char.zfill(np.arange(n_fast).astype(str), 6), n_events)  # sorted ids
    entity_log_marginal(*entity_statistics(X[:n_events], y[:n_events], ent[:n_events])[1:],
                        D, c, sigma)  # compile
    t0 = time.perf_counter()
    _, XtX, Xty, yty, n = entity_statistics(X, y, ent)
    fast = entity_log_marginal(XtX, Xty, yty, n, D, c, sigma)
    t_fast = (time.perf_counter() - t0) / n_fast
    t0 = time.perf_counter()
    slow = [ref.log_likelihood_algorithm1(X[e * n_events:(e + 1) * n_events],
                                          y[e * n_events:(e + 1) * n_events], H, c, sigma)
            for e in range(n_slow)]
    t_slow = (time.perf_counter() - t0) / n_slow
    _algorithm1_numba(X[:n_events], y[:n_events], H, c, sigma)
    n_nb = min(n_fast, 500)
    t0 = time.perf_counter()
    for e in range(n_nb):
        _algorithm1_numba(X[e * n_events:(e + 1) * n_events], y[e * n_events:(e + 1) * n_events],
                          H, c, sigma)
    t_nb = (time.perf_counter() - t0) / n_nb
    err = np.max(np.abs(fast[:n_slow] - np.array(slow)) / np.abs(np.array(slow)))
    return t_fast, t_slow, t_nb, err


def seconds_per_round(entities_per_agent: float, rounds: int = 4, quick=False, auto=False):
    """Median seconds per FedHLCR round: the paper's fixed sigma and delta, or (``auto``) the
    defaults (standardized statistics, sigma and delta drawn by the server every round)."""
    fd = fl.datasets.make_synthhlcr(
        n_agents=128 if not quick else 16, n_entities=128, entities_per_agent=entities_per_agent,
        events_per_entity=20, n_clusters=16, n_features=10, sigma=1.0, random_state=0)
    fixed = {} if auto else {"sigma": 1.0, "delta": 1.0}
    est = fl.HLCR(16, max_rounds=rounds, tol=0.0, random_state=0, **fixed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(fd)
    secs = [r.seconds for r in est.history_]
    n_ent = sum(len(np.unique(cd.entity)) for _, cd in fd.items())
    return float(np.median(secs[1:] if len(secs) > 1 else secs)), n_ent, fd.n_samples


def _cpu_fit(fd, runtime=None, **kw):
    """CPU seconds of one fit at the old defaults, K = 4 and 100 rounds (and the estimator):
    since issue 24 the default chooses K among 6 candidates of 400 rounds each, which this
    section does not measure."""
    est = fl.HLCR(**{"n_clusters": 4, "max_rounds": 100, "random_state": 0, **kw})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.process_time()
        est.fit(fd, runtime=runtime)
        return time.process_time() - t0, est


def against_gibbs(quick=False) -> None:
    """Section 3: whole default fits, FedHLCR / Gibbs CPU time in one run."""
    from fedlatent.engine import InProcessRuntime

    A, E = (130, 2400) if not quick else (40, 600)
    fd = fl.datasets.make_synthhlcr(n_agents=A, n_entities=E, entities_per_agent=E / A,
                                    events_per_entity=12.5, n_clusters=4, n_features=5,
                                    random_state=0)
    warm = fl.datasets.make_synthhlcr(n_agents=4, n_entities=8, n_features=5, n_clusters=4,
                                      random_state=0)
    for solver in ("gibbs", "federated"):  # compiled kernels loaded before timing
        _cpu_fit(warm, solver=solver, max_rounds=3)
    with blas_limit(1):
        t_gibbs, est = _cpu_fit(fd, solver="gibbs")
        t_fed, _ = _cpu_fit(fd)
        t_one, _ = _cpu_fit(fd, runtime=InProcessRuntime(fd, batched=False))
    print(f"\nFedHLCR against the Gibbs solver: whole default fits (K=4, 100 rounds or sweeps, "
          f"{est._n_chains()} chains), {A} agents, {est.n_entities_} agent-entity pairs, "
          f"{fd.n_samples} events, F=5, one BLAS thread")
    print(f"{'solver':<34} {'CPU s':>7} {'/ gibbs':>8}")
    for name, t in (('solver="gibbs"', t_gibbs), ("FedHLCR, agents batched", t_fed),
                    ("FedHLCR, agents one by one", t_one)):
        print(f"{name:<34} {t:>7.2f} {t / t_gibbs:>8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--gibbs", action="store_true", help="only section 3 (report.py's table)")
    args = ap.parse_args()
    against_gibbs(args.quick)
    if args.gibbs:
        return
    print("label-sampling likelihood for one entity against K=16 clusters, F=10")
    print(f"{'N_ij':>5} {'fast us':>9} {'literal us':>11} {'numba-Alg1 us':>14} "
          f"{'fast/literal':>13} {'fast/numba-Alg1':>16} {'max rel diff':>13}")
    for m in (5, 20, 100):
        tf, ts, tn, err = throughput(m, quick=args.quick)
        print(f"{m:>5} {tf * 1e6:>9.1f} {ts * 1e6:>11.1f} {tn * 1e6:>14.1f} {ts / tf:>13.1f} "
              f"{tn / tf:>16.1f} {err:>13.1e}")
    print("\nFedHLCR round (in-process, all agents, K=16, F=10, N**=20)")
    for nstar in ((16, 128) if not args.quick else (4,)):
        s, n_ent, n_ev = seconds_per_round(nstar, quick=args.quick)
        a, _, _ = seconds_per_round(nstar, quick=args.quick, auto=True)
        print(f"128 agents x 128 entities, N*={nstar}: {n_ent} agent-entity pairs, "
              f"{n_ev} events: {s:.3f} s per round with fixed sigma, delta; {a:.3f} s with "
              f"them estimated on standardized statistics (ratio {a / s:.2f})")


if __name__ == "__main__":
    main()
