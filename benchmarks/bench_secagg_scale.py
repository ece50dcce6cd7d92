"""Secure aggregation at scale (SecAgg+): set-up and round cost against the plain round, one run.

A federated GMM (d = 4, K = 3, full covariance; 200 rows per client) with participation 0.7 and
the quantizer (8 levels), fitted in-process for ``--rounds`` rounds with and without
``Federation(secure_aggregation=True)`` on the same seed, for each number of clients. Reported:
the masking graph (degree k, neighbourhood threshold t; "all" is the complete graph of
Bonawitz et al., with its threshold), the fit's once-per-fit key set-up (CPU seconds, bytes up,
timed inside the secure fit), a secure round and the
plain per-client round (``InProcessRuntime(batched=False)``; medians of rounds 2..end, CPU
seconds of this process, one BLAS thread: every client runs here, in turn), their ratio, and
the bytes up of a round. The set-up plans ``--rounds`` rounds plus the 16 exchanges the
engine reserves.

Run: ``python benchmarks/bench_secagg_scale.py [--clients 10 100 1000] [--rounds 5]``; add
``--big`` for 10,000 clients (minutes): there both fits stop after ``--big-rounds`` rounds
(default 3: the set-up and two timed rounds, not five; the column ``rounds`` says which). The
first line gives the CPU time of one X25519 agreement on the machine at that moment: the set-up
does ``k`` per client, its floor.
"""

from __future__ import annotations

import argparse
import time
import warnings
from unittest import mock

import numpy as np

# the federation and the quorum seed of bench_secure_fit.py (this folder is on sys.path)
from bench_secure_fit import data, quorum_seed  # noqa: E402
from threadpoolctl import threadpool_limits

import fedlatent as fl
import fedlatent.engine.secagg.secure as secure_mod
from fedlatent.engine.secagg.secure import open_channel


def fit(fd, secure: bool, rounds: int):
    """Median CPU seconds and bytes up of rounds 2..end, and (secure) the key set-up's CPU
    seconds, bytes up and graph, timed inside the fit."""
    fed = fl.Federation(participation=0.7, quantizer=fl.Quantizer(8), secure_aggregation=secure)
    est = fl.FederatedGaussianMixture(3, init_params="random", federation=fed, max_rounds=rounds,
                                      tol=0.0, random_state=quorum_seed(fd.n_clients, rounds),
                                      verbose=False)
    marks, setup = [time.process_time()], {}

    def timed(*args, **kw):  # the fit's own set-up, timed
        t0 = time.process_time()
        ch = open_channel(*args, **kw)
        cfg = ch.config
        setup.update(s=time.process_time() - t0, up=ch.setup_up,
                     graph=("all", cfg.threshold) if getattr(cfg, "degree", None) is None
                     else (cfg.degree, cfg.local_threshold))
        return ch

    with warnings.catch_warnings(), mock.patch.object(secure_mod, "open_channel", timed):
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est.fit(fd, runtime=fl.InProcessRuntime(fd, batched=False),
                callbacks=[lambda *a: marks.append(time.process_time())])
    h = est.history_.to_frame().iloc[1:]
    return float(np.median(np.diff(marks)[1:])), float(h["bytes_up"].median()), setup


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--big", action="store_true", help="add 10,000 clients (minutes)")
    ap.add_argument("--big-rounds", type=int, default=3,
                    help="rounds of both fits at 10,000 clients (rounds 2.. are timed)")
    a = ap.parse_args()
    with threadpool_limits(1):  # CPU seconds: idle BLAS threads spinning would count as work
        table(a)


def table(a) -> None:
    """The benchmark's table for the parsed arguments ``a``."""
    sizes = [(n, a.rounds) for n in a.clients] + ([(10_000, a.big_rounds)] if a.big else [])
    print(f"GMM d = 4, K = 3, 200 rows per client, participation 0.7, quantizer 8; CPU s of the "
          f"whole federation in one process, one BLAS thread; {time.strftime('%Y-%m-%d')}")
    print(f"X25519 agreement on this machine now: {x25519_us():.0f} us")
    print("| clients | rounds | graph k | t | set-up s | set-up MB up | secure s/round "
          "| plain s/round | ratio | KB up secure | KB up plain |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n, rounds in sizes:
        fd = data(n)
        plain, plain_up, _ = fit(fd, False, rounds)  # back to back with the secure fit
        sec, sec_up, st = fit(fd, True, rounds)
        t_setup, b_setup, (k, t) = st["s"], st["up"], st["graph"]
        print(f"| {n:,} | {rounds} | {k} | {t} | {t_setup:.2f} | {b_setup / 1e6:.2f} | "
              f"{sec:.4f} | {plain:.4f} | {sec / plain:.2f} | {sec_up / 1e3:.1f} | "
              f"{plain_up / 1e3:.1f} |", flush=True)


def x25519_us(n: int = 2000) -> float:
    """CPU microseconds of one X25519 agreement now (the set-up does k per client)."""
    from fedlatent.engine.secagg import _crypto

    key, peer = _crypto.generate_private(), _crypto.public_raw(_crypto.generate_private())
    t0 = time.process_time()
    for _ in range(n):
        _crypto.agree(key, peer)
    return (time.process_time() - t0) / n * 1e6


if __name__ == "__main__":
    main()
