"""Rounds to tolerance with and without accelerated EM (``Federation(acceleration="squarem")``
and ``acceleration="newton"``, subspace Newton with three points a round) against the
centralized EM's iterations, measured in one run (issue 23, done-when 1).

- GMM: 4 components, 5 dimensions, unit covariances, means drawn N(0, 1.5^2 I) (overlapping),
  4,000 rows split at random over 20 clients; tol 1e-6 on the mean log-likelihood; against
  scikit-learn's ``GaussianMixture`` on the pooled rows, (a) each with its default start
  (ours: k-means from sums; scikit-learn: k-means) and (b) from the same random start.
- LCR: 3 lines in 2 features, 3,000 rows over 20 clients, from the same start, against a
  flexmix-style centralized EM written here (stop when the mean log-likelihood changes by less
  than tol).
- FedGMM: the paper's synthetic generator, 20 clients of about 150 rows, d = 5, M1 = M2 = 3
  (no centralized reference: plain against accelerated rounds, each fit with the disclosure
  rules off: under the default rules these 150-row sites refuse a reply of even two
  statistics, and Newton falls back to plain rounds). Under subspace Newton each client
  carries its own mixing weights along the server's path (the server's coefficients applied
  to the states it kept, :mod:`fedlatent.engine.node.pointstate`). The final column counts,
  for the cases without a centralized fit, the seeds whose log-likelihood is at least plain
  EM's to 1e-6 relative.
- LCA: 3 classes, 6 binary items, 3,000 rows over 20 clients (plain against accelerated).

Prints one row per case and seed: rounds plain / SQUAREM / Newton / centralized iterations,
the ratios to the centralized iterations, ``sq@c`` and ``nt@c``: the first accelerated round
whose objective (the mean log-likelihood over every client at that round's statistic) reaches
the centralized fit's final log-likelihood (the stopping rule then still runs a few rounds),
and the final mean log-likelihoods (GMM and LCR: on the pooled rows, at the returned
parameters; FedGMM and LCA: a lower bound from the rounds, see ``final_objective``).

Every round counts, the refused extrapolations' included (a SQUAREM cycle is two rounds, three
with a refusal; a Newton round carries three points, each a statistic in the reply); both
sides stop by the same rule, scikit-learn's: the mean log-likelihood per row changes by less
than tol over one EM step (SQUAREM: between a round and the round sent its EM step; Newton:
between the accepted point and its plain EM step). A final table gives each case's median and
range.

    python benchmarks/rounds_to_tol.py [--seeds 5 | --quick] [--tol 1e-6] [--threads 1]
"""

from __future__ import annotations

import argparse
import warnings

import numpy as np
from sklearn.mixture import GaussianMixture
from threadpoolctl import threadpool_limits

import fedlatent as fl
from fedlatent.data.fedgmm_data import make_fedgmm_synthetic

ACC = fl.Federation(acceleration="squarem")
NEWTON = fl.Federation(acceleration="newton")
FEDS = (None, ACC, NEWTON)


def split(rows, clients, rng):
    """``rows`` (a tuple of arrays) split at random over ``clients`` clients."""
    cl = rng.integers(0, clients, len(rows[0]))
    one = len(rows) == 1
    return fl.FederatedDataset.from_arrays(
        {f"c{c:02d}": (rows[0][cl == c] if one else tuple(a[cl == c] for a in rows))
         for c in range(clients)})


def gmm_data(seed, n=4000, clients=20, K=4, d=5):
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=1.5, size=(K, d))
    X = means[rng.integers(0, K, n)] + rng.standard_normal((n, d))
    start = dict(weights_init=np.full(K, 1 / K), means_init=X[rng.choice(n, K, replace=False)],
                 precisions_init=np.repeat(np.eye(d)[None], K, 0))
    return X, split((X,), clients, rng), start


def gmm_rows(seed, tol):
    X, fd, start = gmm_data(seed)
    out = []
    for label, kw in (("default start", {}), ("same start", start)):
        sk = GaussianMixture(4, tol=tol, max_iter=10_000, random_state=seed, **kw).fit(X)
        fits = [fl.FederatedGaussianMixture(4, tol=tol, max_rounds=10_000, random_state=seed,
                                            federation=fed, verbose=False, **kw).fit(fd)
                for fed in FEDS]
        out.append((f"GMM, {label}", seed, [f.n_iter_ for f in fits], sk.n_iter_,
                    [f.score(X) for f in fits], sk.score(X),
                    [reached(f, sk.score(X)) for f in fits[1:]]))
    return out


def lcr_data(seed, n=3000, clients=20):
    rng = np.random.default_rng(seed)
    beta = rng.normal(size=(3, 3))
    X = rng.uniform(-2, 2, size=(n, 2))
    z = rng.integers(0, 3, n)
    y = (X * beta[z, :2]).sum(1) + beta[z, 2] + np.array([1.0, 1.2, 0.8])[z] * rng.normal(size=n)
    start = dict(weights_init=np.full(3, 1 / 3), coef_init=rng.normal(size=(3, 2)),
                 intercept_init=rng.normal(size=3), noise_variance_init=np.full(3, 2.0))
    return X, y, split((X, y), clients, rng), start


def flexmix_em(X, y, start, tol, reg=1e-6, max_iter=10_000):
    """Centralized EM for a mixture of linear regressions (flexmix's loop); returns the
    iterations (E-steps) and the mean log-likelihood at the last E-step."""
    Xt = np.hstack([X, np.ones((len(X), 1))])
    w, var = start["weights_init"], start["noise_variance_init"]
    beta = np.hstack([start["coef_init"], start["intercept_init"][:, None]])
    last = -np.inf
    for it in range(1, max_iter + 1):
        logp = (-0.5 * np.log(2 * np.pi * var) - 0.5 * (y[:, None] - Xt @ beta.T) ** 2 / var
                + np.log(w))
        ll = np.logaddexp.reduce(logp, axis=1)
        r = np.exp(logp - ll[:, None])
        if abs(ll.mean() - last) < tol:
            return it, float(ll.mean())
        last = ll.mean()
        A = np.einsum("nk,ni,nj->kij", r, Xt, Xt)
        beta = np.linalg.solve(A, np.einsum("nk,ni,n->ki", r, Xt, y)[..., None])[..., 0]
        var = (r * (y[:, None] - Xt @ beta.T) ** 2).sum(0) / r.sum(0) + reg
        w = r.sum(0) / len(y)
    return max_iter, float(last)


def lcr_rows(seed, tol):
    X, y, fd, start = lcr_data(seed)
    iters, ll = flexmix_em(X, y, start, tol)
    fits = [fl.LatentClassRegression(3, tol=tol, max_rounds=10_000, random_state=seed,
                                     reg_noise=1e-6, federation=fed, **start)
            .fit(fd, progress=False) for fed in FEDS]
    return [("LCR, same start", seed, [f.n_iter_ for f in fits], iters,
             [f.score(X, y) for f in fits], ll, [reached(f, ll) for f in fits[1:]])]


def fedgmm_rows(seed, tol):
    fd = make_fedgmm_synthetic(20, 150, n_features=5, fractions=(1.0, 0.0, 0.0),
                               random_state=seed).train
    off = fl.DisclosurePolicy.off()  # (see the module docstring)
    fits = [fl.FedGMM(3, 3, tol=tol, max_rounds=10_000, random_state=seed,
                      federation=fl.Federation(disclosure=off, acceleration=acc),
                      verbose=False).fit(fd) for acc in (None, "squarem", "newton")]
    return [("FedGMM, rules off", seed, [f.n_iter_ for f in fits], None,
             [final_objective(f) for f in fits], None, ["", ""])]


def lca_rows(seed, tol):
    rng = np.random.default_rng(seed)
    P = rng.uniform(0.2, 0.8, size=(3, 6))
    X = (rng.random((3000, 6)) < P[rng.integers(0, 3, 3000)]).astype(float)
    fd = split((X,), 20, rng)
    fits = [fl.LatentClassAnalysis(3, tol=tol, max_rounds=10_000, random_state=seed,
                                   federation=fed).fit(fd) for fed in FEDS]
    return [("LCA", seed, [f.n_iter_ for f in fits], None,
             [final_objective(f) for f in fits], None, ["", ""])]


def final_objective(est) -> float:
    """A lower bound of the returned fit's mean log-likelihood from the rounds: the last
    round's objective (plain, SQUAREM: the fit ends on its EM step), under Newton the best
    objective of a round's statistic (the fit ends on the EM step of the best point)."""
    objs = [r.objective for r in est.history_]
    newton = est.federation is not None and est.federation.newton is not None
    return max(objs) if newton else objs[-1]


def reached(est, target) -> int | str:
    """The first round whose objective is at least ``target`` ("-" when none)."""
    if target is None:
        return ""
    return next((r.round for r in est.history_ if r.objective >= target), "-")


def show(row) -> None:
    """One Markdown row of the per-seed table."""
    case, seed, rounds, central, lls, ll_c, at = row
    cell = (lambda r: "refused" if r is None else r)
    ratios = ["" if central is None or r is None else f"{r / central:.2f}" for r in rounds[1:]]
    lltxt = ["" if v is None else f"{v:.7f}" for v in lls + [ll_c]]
    print(f"| {case} | {seed} | {' | '.join(str(cell(r)) for r in rounds)} | "
          f"{'' if central is None else central} | {' | '.join(ratios)} | "
          f"{' | '.join(map(str, at))} | {' | '.join(lltxt)} |", flush=True)


def summary(rows) -> None:
    """One Markdown row per case: the median and range of SQUAREM's and Newton's rounds over
    the centralized iterations (or over plain EM's rounds), and in how many seeds each ended at
    a log-likelihood at least the centralized one's (to 1e-7; without a centralized fit, at
    least plain EM's to 1e-6 relative)."""
    print("\n| case | seeds | SQUAREM / central | Newton / central | SQUAREM / plain "
          "| Newton / plain | loglik >= central (SQUAREM; Newton) |\n|---|---|---|---|---|---|---|")
    fmt = (lambda v: f"{np.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "")
    for case in dict.fromkeys(r[0] for r in rows):
        sel = [r for r in rows if r[0] == case]
        cols, oks = [], []
        for ref in ("central", "plain"):
            for j in (1, 2):
                cols.append(fmt([r[2][j] / (r[3] if ref == "central" else r[2][0]) for r in sel
                                 if r[2][j] is not None and (ref == "plain" or r[3])]))
        for j in (1, 2):
            ok = [r[4][j] >= r[5] - 1e-7 for r in sel if r[5] is not None and r[4][j] is not None]
            if not ok:  # no centralized fit: against plain EM's, to 1e-6 relative
                ok = [r[4][j] >= r[4][0] - 1e-6 * abs(r[4][0]) for r in sel
                      if r[5] is None and r[4][j] is not None and r[4][0] is not None]
                oks.append(f"{sum(ok)} of {len(ok)} (vs plain)" if ok else "")
                continue
            oks.append(f"{sum(ok)} of {len(ok)}" if ok else "")
        if cols[1] == "" and cols[3] == "":
            cols[3] = "refused (client state)"
        print(f"| {case} | {len(sel)} | {' | '.join(cols)} | {'; '.join(oks) if any(oks) else ''} "
              f"|", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="2 seeds")
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads")
    a = ap.parse_args()
    seeds = 2 if a.quick else a.seeds
    print("| case | seed | plain | SQUAREM | Newton | central | SQUAREM/central | Newton/central "
          "| sq@c | nt@c | loglik plain | loglik SQUAREM | loglik Newton | loglik central |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    with threadpool_limits(a.threads), warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        for make in (gmm_rows, lcr_rows, fedgmm_rows, lca_rows):
            for seed in range(seeds):
                for row in make(seed, a.tol):
                    show(row)
                    rows.append(row)
    summary(rows)


if __name__ == "__main__":
    main()
