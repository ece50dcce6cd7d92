"""Per-round time of a federated GMM against the number of clients, over scikit-learn's
per-iteration time on the pooled rows (issue 13: runtimes at scale).

Two families of federations, d = 8, K = 4, full covariance:

- a constant number of rows in all (``--total``, default 1,000,000) split over 10 ... 100,000
  clients (``--split``);
- ``--per-client`` rows (default 10) on each of 10 ... 100,000 clients (``--many``);

each with plain federated EM and with FedEM (participation p = 0.5, the quantizer with 4 levels,
control variates, step 0.5). Every configuration runs in its own process (one BLAS thread), so
its peak resident memory (``ru_maxrss``, data included) is its own; scikit-learn's
``GaussianMixture`` iteration is timed in that same process on the pooled rows, from the same
initial parameters.

    python benchmarks/bench_clients.py                    # the whole table (several minutes)
    python benchmarks/bench_clients.py --split 10,100,1000 --total 100000 --many ""
    python benchmarks/bench_clients.py --one 100000 10 fedem   # one configuration

``--whole`` prints instead the time of a whole default fit (setup and initialization
included: ``FederatedGaussianMixture(K, random_state=0).fit(fd)``) over scikit-learn's whole
default fit (``GaussianMixture(K, random_state=0).fit(X)``, its k-means start included) on the
pooled rows, at 10,000 and 100,000 clients of 10 rows (issue 23: at most 5x and 3x), each size
in its own process, both fits in that process (one BLAS thread), in wall and CPU seconds:

    python benchmarks/bench_clients.py --whole            # 10,000 and 100,000 clients
    python benchmarks/bench_clients.py --whole --quick    # 10,000 clients only
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import warnings

import numpy as np

_THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
D, K = 8, 4


def make_data(n_clients: int, per_client: int, seed: int = 0):
    """``n_clients`` clients of ``per_client`` rows, each with its own mixture of the K
    components (non-IID), as one stacked array and the clients' row counts."""
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=3.0, size=(K, D))
    share = rng.dirichlet(np.full(K, 0.5), size=n_clients)
    u = rng.random((n_clients, per_client))
    z = (u[:, :, None] > np.cumsum(share, axis=1)[:, None, :]).sum(axis=2).clip(0, K - 1)
    X = means[z.ravel()] + rng.standard_normal((n_clients * per_client, D))
    return X


def federation(kind: str):
    import fedlatent as fl

    if kind == "plain":
        return fl.Federation(random_state=0)
    return fl.Federation(participation=0.5, quantizer=fl.Quantizer(4), control_variates=True,
                         step_size=0.5, random_state=0)


def one(n_clients: int, per_client: int, kind: str, rounds: int) -> dict:
    """Time one configuration in this process; returns the row of the table."""
    from sklearn.mixture import GaussianMixture

    import fedlatent as fl

    X = make_data(n_clients, per_client)
    width = len(str(n_clients - 1))
    t = time.perf_counter()
    fd = fl.FederatedDataset.from_arrays(
        {f"c{c:0{width}d}": X[c * per_client:(c + 1) * per_client] for c in range(n_clients)})
    t_data = time.perf_counter() - t
    rng = np.random.default_rng(0)
    w0 = np.full(K, 1.0 / K)
    m0 = X[rng.choice(len(X), K, replace=False)]
    p0 = np.repeat(np.eye(D)[None], K, 0)

    gm = fl.FederatedGaussianMixture(K, max_rounds=rounds + 1, tol=0.0, weights_init=w0,
                                     means_init=m0, precisions_init=p0,
                                     federation=federation(kind), random_state=0, verbose=False)
    cpu_marks: list[float] = []  # CPU time at the end of every round (robust to a busy box)
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gm.fit(fd, callbacks=[lambda *a: cpu_marks.append(time.process_time())])
    t_fit = time.perf_counter() - t
    secs = np.array([r.seconds for r in gm.history_])
    ours = float(np.median(secs[1:]))  # the initialization round left out
    ours_cpu = float(np.median(np.diff(cpu_marks)))

    def sk_fit(n):
        sk = GaussianMixture(K, max_iter=n, tol=0.0, weights_init=w0, means_init=m0,
                             precisions_init=p0, init_params="random", random_state=0)
        t0, c0 = time.perf_counter(), time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sk.fit(X)
        return np.array([time.perf_counter() - t0, time.process_time() - c0])

    iters = 4  # n iterations = fit(n + 1) - fit(1) (initialization, final E-step cancel)
    base = np.min([sk_fit(1) for _ in range(3)], axis=0)
    full = np.min([sk_fit(iters + 1) for _ in range(2)], axis=0)
    theirs, theirs_cpu = np.maximum((full - base) / iters, 1e-9)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB (Linux)
    return {"clients": n_clients, "per_client": per_client, "rows": n_clients * per_client,
            "kind": kind, "round_s": ours, "sklearn_s": theirs, "ratio": ours / theirs,
            "round_cpu": ours_cpu, "sklearn_cpu": theirs_cpu, "ratio_cpu": ours_cpu / theirs_cpu,
            "fit_s": t_fit, "data_s": t_data, "first_round_s": float(secs[0]),
            "peak_mib": peak, "data_mib": X.nbytes / 2**20}


def whole(n_clients: int, per_client: int) -> dict:
    """Time a whole default fit and scikit-learn's in this process; returns the row."""
    from sklearn.mixture import GaussianMixture

    import fedlatent as fl

    X = make_data(n_clients, per_client)
    width = len(str(n_clients - 1))
    fd = fl.FederatedDataset.from_arrays(
        {f"c{c:0{width}d}": X[c * per_client:(c + 1) * per_client] for c in range(n_clients)})

    def timed(fit):
        t0, c0 = time.perf_counter(), time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = fit()
        return est, time.perf_counter() - t0, time.process_time() - c0

    sk, sk_s, sk_cpu = timed(lambda: GaussianMixture(K, random_state=0).fit(X))
    gm, fit_s, fit_cpu = timed(lambda: fl.FederatedGaussianMixture(K, random_state=0).fit(fd))
    rounds_s = float(sum(r.seconds for r in gm.history_))
    return {"clients": n_clients, "per_client": per_client, "fit_s": fit_s, "fit_cpu": fit_cpu,
            "start_s": fit_s - rounds_s, "rounds": int(gm.n_iter_), "sklearn_s": sk_s,
            "sklearn_cpu": sk_cpu, "sklearn_iter": int(sk.n_iter_), "ratio": fit_s / sk_s,
            "ratio_cpu": fit_cpu / sk_cpu}


def run_whole(sizes: list[int], per_client: int) -> None:
    """The table of ``--whole``, one process per size."""
    print(f"whole default fit, GMM d={D}, K={K}, {per_client} rows per client; one BLAS "
          "thread; scikit-learn's whole default fit on the pooled rows in the same process")
    head = (f"{'clients':>8} {'rows':>9} {'fit s':>8} {'start s':>8} {'rounds':>6} "
            f"{'sklearn s':>9} {'iters':>5} {'ratio':>6} {'fit CPU':>8} {'sk CPU':>7} "
            f"{'ratio CPU':>9}")
    print(head)
    print("-" * len(head))
    for n in sizes:
        env = {**os.environ, **_THREADS}
        out = subprocess.run([sys.executable, __file__, "--whole-one", str(n), str(per_client)],
                             env=env, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"whole fit at {n} clients failed:\n{out.stderr[-2000:]}")
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['clients']:>8} {r['clients'] * r['per_client']:>9} {r['fit_s']:>8.2f} "
              f"{r['start_s']:>8.2f} {r['rounds']:>6} {r['sklearn_s']:>9.2f} "
              f"{r['sklearn_iter']:>5} {r['ratio']:>6.2f} {r['fit_cpu']:>8.2f} "
              f"{r['sklearn_cpu']:>7.2f} {r['ratio_cpu']:>9.2f}", flush=True)


def run_child(n_clients: int, per_client: int, kind: str, rounds: int) -> dict:
    env = {**os.environ, **_THREADS}
    cmd = [sys.executable, __file__, "--one", str(n_clients), str(per_client), kind,
           "--rounds", str(rounds)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"configuration {n_clients} x {per_client} {kind} failed:\n"
                           f"{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--total", type=int, default=1_000_000, help="rows in all (--split)")
    ap.add_argument("--split", default="10,1000,10000,100000",
                    help="client counts sharing --total rows")
    ap.add_argument("--per-client", type=int, default=10, help="rows per client (--many)")
    ap.add_argument("--many", default="10,1000,10000,100000",
                    help="client counts of --per-client rows each")
    ap.add_argument("--kinds", default="plain,fedem")
    ap.add_argument("--rounds", type=int, default=4, help="timed rounds per fit")
    ap.add_argument("--one", nargs=3, metavar=("CLIENTS", "PER_CLIENT", "KIND"))
    ap.add_argument("--whole", action="store_true",
                    help="whole default fits against scikit-learn's (10,000 and 100,000 "
                    "clients of --per-client rows)")
    ap.add_argument("--quick", action="store_true", help="with --whole: 10,000 clients only")
    ap.add_argument("--whole-one", nargs=2, type=int, metavar=("CLIENTS", "PER_CLIENT"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.whole_one:
        print(json.dumps(whole(*a.whole_one)))
        return
    if a.whole:
        run_whole([10_000] if a.quick else [10_000, 100_000], a.per_client)
        return
    if a.one:
        row = one(int(a.one[0]), int(a.one[1]), a.one[2], a.rounds)
        print(json.dumps(row))
        return
    configs = [(n, a.total // n) for n in _ints(a.split)]
    configs += [(n, a.per_client) for n in _ints(a.many) if (n, a.per_client) not in configs]
    print(f"federated GMM, d={D}, K={K}, full covariance; one BLAS thread; median of "
          f"{a.rounds} rounds (initialization round left out); scikit-learn GaussianMixture "
          "per EM iteration on the pooled rows, same process, same initial parameters")
    print("plain = Federation(); fedem = p=0.5, Quantizer(4), control variates, step 0.5; "
          "ratio CPU: the same ratio in CPU seconds (what a busy machine does not distort)")
    head = (f"{'clients':>8} {'rows/cl':>8} {'rows':>9} {'kind':>6} {'round s':>9} "
            f"{'sklearn s':>9} {'ratio':>7} {'ratio CPU':>9} {'fit s':>8} {'peak MiB':>9} "
            f"{'data MiB':>8}")
    print(head)
    print("-" * len(head))
    for n, m in configs:
        for kind in a.kinds.split(","):
            r = run_child(n, m, kind, a.rounds)
            print(f"{r['clients']:>8} {r['per_client']:>8} {r['rows']:>9} {r['kind']:>6} "
                  f"{r['round_s']:>9.4f} {r['sklearn_s']:>9.4f} {r['ratio']:>7.2f} "
                  f"{r['ratio_cpu']:>9.2f} "
                  f"{r['fit_s']:>8.2f} {r['peak_mib']:>9.0f} {r['data_mib']:>8.1f}",
                  flush=True)


if __name__ == "__main__":
    main()
