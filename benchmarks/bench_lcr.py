"""Per-round time of LatentClassRegression against a centralized NumPy EM iteration.

K = 3 components, d = 8 features (+ intercept), 300 clients, about 1,000,000 rows in all. Both are
measured in this run on the same data from the same initial parameters: ours per federated
round (every client takes part: E-step and statistics on the clients, weighted least squares
on the server, in-process runtime), the reference per EM iteration on the pooled rows (one
vectorized E-step, the weighted Gram matrices and K solves, written here in NumPy). Prints the
ratio.

    python benchmarks/bench_lcr.py [--samples 1000000] [--clients 300] [--rounds 8] [--threads 1]

Both run with the same BLAS thread limit (default 1: on a shared machine, thread pools spinning
against other work make small products much slower and the timing meaningless).
"""

from __future__ import annotations

import time
import warnings

import numpy as np
from _common import median_round_seconds, run_scaled

import fedlatent as fl


def make_data(n_total, n_clients, d, K, seed=0):
    rng = np.random.default_rng(seed)
    beta = rng.normal(scale=2.0, size=(K, d + 1))
    sizes = rng.multinomial(n_total, rng.dirichlet(np.full(n_clients, 20.0)))
    clients = {}
    for c in range(n_clients):
        share = rng.dirichlet(np.full(K, 0.5))
        n = max(int(sizes[c]), 10)
        z = rng.choice(K, size=n, p=share)
        X = rng.standard_normal((n, d))
        y = np.einsum("ij,ij->i", X, beta[z, :d]) + beta[z, d] + rng.standard_normal(n)
        clients[f"c{c:03d}"] = (X, y)
    return fl.FederatedDataset.from_arrays(clients)


def init_params(K, d, seed=0):
    rng = np.random.default_rng(seed)
    return dict(weights_init=np.full(K, 1.0 / K), coef_init=rng.normal(size=(K, d)),
                intercept_init=rng.normal(size=K), noise_variance_init=np.full(K, 4.0))


def time_ours(fd, K, init, rounds):
    est = fl.LatentClassRegression(K, max_rounds=rounds, tol=0.0, **init)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        est.fit(fd, progress=False)
    return median_round_seconds(est.history_), est


def numpy_em_iteration(Xt, y, w, beta, var, reg=1e-6):
    """One EM iteration for a mixture of linear regressions on pooled rows (the reference)."""
    resid = y[:, None] - Xt @ beta.T
    logp = -0.5 * (np.log(2 * np.pi * var) + resid**2 / var) + np.log(w)
    m = logp.max(1, keepdims=True)
    r = np.exp(logp - m)
    r /= r.sum(1, keepdims=True)
    nk = r.sum(0)
    new_beta = np.empty_like(beta)
    new_var = np.empty_like(var)
    for k in range(len(w)):
        Xr = Xt * r[:, k : k + 1]
        A, b = Xr.T @ Xt, Xr.T @ y
        new_beta[k] = np.linalg.solve(A, b)
        new_var[k] = r[:, k] @ (y - Xt @ new_beta[k]) ** 2 / nk[k] + reg
    return nk / nk.sum(), new_beta, new_var


def time_numpy(fd, init, iters):
    pooled = fd.pooled()
    Xt = np.hstack([pooled.X, np.ones((pooled.X.shape[0], 1))])
    y = pooled.y
    w = init["weights_init"]
    beta = np.hstack([init["coef_init"], init["intercept_init"][:, None]])
    var = init["noise_variance_init"]
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        w, beta, var = numpy_em_iteration(Xt, y, w, beta, var)
        times.append(time.perf_counter() - t)
    return float(np.median(times)), beta


def run(a):
    K, d = a.components, a.features
    fd = make_data(a.samples, a.clients, d, K)
    init = init_params(K, d)
    print(f"data: {fd.n_clients} clients, {fd.n_samples:,} rows, d={d} (+ intercept), K={K}; "
          f"BLAS threads: {a.threads}")
    ours, est = time_ours(fd, K, init, a.rounds + 1)
    theirs, beta = time_numpy(fd, init, a.rounds + 1)
    ours = min(ours, time_ours(fd, K, init, a.rounds + 1)[0])
    theirs = min(theirs, time_numpy(fd, init, a.rounds + 1)[0])
    # same iterates: a check that the two timed the same computation
    ref_beta = np.hstack([est.coef_, est.intercept_[:, None]])
    diff = float(np.max(np.abs(ref_beta - beta)) / np.max(np.abs(beta)))
    print(f"fedlatent LatentClassRegression: {ours:.3f} s per round (median of {a.rounds})")
    print(f"centralized NumPy EM:            {theirs:.3f} s per iteration (pooled rows)")
    print(f"ratio ours/NumPy: {ours / theirs:.2f}   (final coefficients agree to {diff:.1e})")


if __name__ == "__main__":
    run_scaled(__doc__, run, features=8)
