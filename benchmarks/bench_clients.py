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
pooled rows, at 10,000 and 100,000 clients of 10 rows (issue 23: at most 5x and 3x), one BLAS
thread. What is timed: each fit's call, nothing else (the data, the ``FederatedDataset`` and
each side's imports are made before; a process's imports belong to no fit). Each size runs in
``--repeats`` fresh processes (the median is printed); in each, scikit-learn's first fit, ours
(the first fit in the process: whatever a first call loads or compiles is in it), then each
side's second fit (warm). One more process per size times the first fits with
``NUMBA_CACHE_DIR`` pointed at an empty directory (a fresh machine, where numba's on-disk cache
is of no use: the GMM start's hard-assignment kernels, ``models/gmm/hardsums.py``, and the
replies' PSD screen, ``engine/protocol/psd_kernel.py``, compile there, about 4 CPU seconds).
The package's modules are byte-compiled before the first process (``compileall``, as
``pip install`` does): where ``PYTHONDONTWRITEBYTECODE`` is set and the sources carry no
bytecode, each new process would compile from source the modules a fit imports on demand
(thirteen, about 0.025 CPU s of the first fit at the last count), which no installed copy
pays.
The ratios are of CPU seconds (what a machine shared with other work does not distort), the
last also of wall seconds. One rule of the default disclosure policy is off: the saturation
rule refuses 10-row clients of this model (180 free numbers about 80 values; issue 22), so the
federation is ``Federation(disclosure=DisclosurePolicy(max_parameters_per_record=math.inf))``,
every other rule at its default:

    python benchmarks/bench_clients.py --whole            # 10,000 and 100,000 clients
    python benchmarks/bench_clients.py --whole --quick    # 10,000 clients only
    python benchmarks/bench_clients.py --whole --sizes 100000 --repeats 1

``--round-table`` prints, per size of ``--sizes`` (clients of ``--per-client`` rows), the
median over ``--repeats`` processes of a plain round (every reply check on; the same rule off)
over scikit-learn's EM iteration (issue 40: at most 1.2x at 100,000 clients):

    python benchmarks/bench_clients.py --round-table --sizes 100000 --repeats 3
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
    """``plain`` or ``fedem`` (see the module docstring), every disclosure rule at its default
    but the saturation rule, which refuses 10-row clients of this model (``--whole`` too)."""
    import math

    import fedlatent as fl

    rules = fl.DisclosurePolicy(max_parameters_per_record=math.inf)
    if kind == "plain":
        return fl.Federation(random_state=0, disclosure=rules)
    return fl.Federation(participation=0.5, quantizer=fl.Quantizer(4), control_variates=True,
                         step_size=0.5, random_state=0, disclosure=rules)


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


def whole(n_clients: int, per_client: int, first_only: bool = False) -> dict:
    """Time whole default fits and scikit-learn's in this fresh process (see the module
    docstring): the first fit of each, then (unless ``first_only``) a second one."""
    import math

    from sklearn.mixture import GaussianMixture

    import fedlatent as fl

    estimator = fl.FederatedGaussianMixture  # (imports made before anything is timed)
    X = make_data(n_clients, per_client)
    width = len(str(n_clients - 1))
    fd = fl.FederatedDataset.from_arrays(
        {f"c{c:0{width}d}": X[c * per_client:(c + 1) * per_client] for c in range(n_clients)})
    fed = fl.Federation(disclosure=fl.DisclosurePolicy(max_parameters_per_record=math.inf))

    def timed(fit):
        t0, c0 = time.perf_counter(), time.process_time()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            est = fit()
        return est, time.perf_counter() - t0, time.process_time() - c0

    def sk_fit():
        return GaussianMixture(K, random_state=0).fit(X)

    def our_fit():
        return estimator(K, random_state=0, federation=fed).fit(fd)

    row = {"clients": n_clients, "per_client": per_client}
    for tag in ("first",) if first_only else ("first", "warm"):
        sk, row[f"sk_{tag}_s"], row[f"sk_{tag}_cpu"] = timed(sk_fit)
        gm, row[f"fit_{tag}_s"], row[f"fit_{tag}_cpu"] = timed(our_fit)
    row.update(rounds=int(gm.n_iter_), sklearn_iter=int(sk.n_iter_),
               start_s=row["fit_first_s"] - float(sum(r.seconds for r in gm.history_)))
    return row


def compile_package() -> None:
    """Byte-compile the fedlatent package the benchmark imports (as ``pip install`` does), so
    that no timed process compiles its modules from source."""
    import compileall
    import importlib.util

    spec = importlib.util.find_spec("fedlatent")
    compileall.compile_dir(os.path.dirname(spec.origin), quiet=1)


def _whole_child(n: int, per_client: int, cold: bool) -> dict:
    import tempfile

    env = {**os.environ, **_THREADS}
    cmd = [sys.executable, __file__, "--whole-one", str(n), str(per_client)]
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as tmp:
        if cold:  # numba's on-disk cache empty, as on a fresh machine
            env["NUMBA_CACHE_DIR"] = tmp
            cmd.append("--first-only")
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"whole fit at {n} clients failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_whole(sizes: list[int], per_client: int, repeats: int) -> None:
    """The table of ``--whole``: per size, the median of ``repeats`` fresh processes."""
    compile_package()
    print(f"whole default fit, GMM d={D}, K={K}, {per_client} rows per client; one BLAS "
          "thread; scikit-learn's whole default fit on the pooled rows in the same process; "
          f"median of {repeats} processes; CPU seconds (ratio wall: wall seconds)")
    print("| clients | rows | rounds | sklearn iters | ours first s | ours warm s | sklearn s "
          "| ratio first | ratio warm | ratio first, empty numba cache | ratio warm wall |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        rows = [_whole_child(n, per_client, False) for _ in range(repeats)]
        cold = _whole_child(n, per_client, True)

        def med(f, rows=rows):
            return float(np.median([f(r) for r in rows]))

        print(f"| {n:,} | {n * per_client:,} | {rows[0]['rounds']} | "
              f"{rows[0]['sklearn_iter']} | {med(lambda r: r['fit_first_cpu']):.2f} | "
              f"{med(lambda r: r['fit_warm_cpu']):.2f} | {med(lambda r: r['sk_warm_cpu']):.2f} | "
              f"{med(lambda r: r['fit_first_cpu'] / r['sk_first_cpu']):.2f} | "
              f"{med(lambda r: r['fit_warm_cpu'] / r['sk_warm_cpu']):.2f} | "
              f"{cold['fit_first_cpu'] / cold['sk_first_cpu']:.2f} | "
              f"{med(lambda r: r['fit_warm_s'] / r['sk_warm_s']):.2f} |", flush=True)


def run_round_table(sizes: list[int], per_client: int, rounds: int, repeats: int) -> None:
    """``--round-table``: per size, the median over ``repeats`` fresh processes of a plain
    round (every check on: the replies' screen, the disclosure rules but saturation) over
    scikit-learn's EM iteration on the pooled rows, in CPU and in wall seconds."""
    print(f"a round of plain federated EM (every client, every reply check on), GMM d={D}, "
          f"K={K}, {per_client} rows per client, against one scikit-learn EM iteration on the "
          f"pooled rows from the same start, same process, one BLAS thread; median of {rounds} "
          f"rounds (initialization round left out), median of {repeats} processes")
    print("| clients | rows | round CPU s | sklearn iteration CPU s | ratio CPU | ratio wall |")
    print("|---|---|---|---|---|---|")
    for n in sizes:
        rs = [run_child(n, per_client, "plain", rounds) for _ in range(repeats)]

        def med(key, rs=rs):
            return float(np.median([r[key] for r in rs]))

        print(f"| {n:,} | {n * per_client:,} | {med('round_cpu'):.3f} | {med('sklearn_cpu'):.3f} "
              f"| {med('ratio_cpu'):.2f} | {med('ratio'):.2f} |", flush=True)


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
    ap.add_argument("--sizes", default="10000,100000",
                    help="with --whole or --round-table: the client counts (e.g. 10000)")
    ap.add_argument("--repeats", type=int, default=3,
                    help="with --whole or --round-table: fresh processes per size (the median "
                    "is printed)")
    ap.add_argument("--round-table", action="store_true",
                    help="a plain round against scikit-learn's iteration at --sizes clients")
    ap.add_argument("--whole-one", nargs=2, type=int, metavar=("CLIENTS", "PER_CLIENT"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--first-only", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.whole_one:
        print(json.dumps(whole(*a.whole_one, first_only=a.first_only)))
        return
    if a.whole:
        run_whole([10_000] if a.quick else _ints(a.sizes), a.per_client, a.repeats)
        return
    if a.round_table:
        run_round_table(_ints(a.sizes), a.per_client, a.rounds, a.repeats)
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
