"""Cost of secure aggregation per round of a fit, in-process, against the plain round (one run).

A federated GMM (d = 4, K = 3, full covariance; 200 rows per client) with participation 0.7,
the quantizer (8 levels) and control variates, fitted for ``--rounds`` rounds with and without
``Federation(secure_aggregation=True)`` on the same seed. Reported per round (rounds 2..end,
medians): CPU seconds of this process (every client runs here, in turn: divide the client part
by the participants for one client's time in a deployment) and bytes up and down as the
history records them (secure: masked uint64 replies plus the reveal round trip); and the
once-per-fit key set-up (seconds, bytes; the history adds them to round 1). The plain
reference is the per-client path (``InProcessRuntime(batched=False)``) and the batched one.

Run: ``python benchmarks/bench_secure_fit.py [--clients 10 50] [--rounds 8]``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

import fedlatent as fl
from fedlatent.engine.fedem.update import select_active
from fedlatent.engine.protocol.exchange import setup_clients
from fedlatent.engine.secagg.secure import open_channel


def quorum_seed(n: int, rounds: int, p: float = 0.7, seed: int = 7) -> int:
    """The first seed whose participation draws keep every round above n / 2 (fewer stop a
    secure fit by design)."""
    while any(len(select_active(list(range(n)), p, seed, k, False)) <= n // 2
              for k in range(2, rounds + 1)):
        seed += 1
    return seed


def data(n_clients: int, seed: int = 0) -> fl.FederatedDataset:
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, (3, 4))
    return fl.FederatedDataset.from_arrays(
        {f"c{i:05d}": centers[rng.integers(0, 3, 200)] + rng.normal(size=(200, 4))
         for i in range(n_clients)})


def fit(fd, secure: bool, rounds: int, batched: bool):
    fed = fl.Federation(participation=0.7, quantizer=fl.Quantizer(8), secure_aggregation=secure)
    est = fl.FederatedGaussianMixture(3, init_params="random", federation=fed, max_rounds=rounds,
                                      tol=0.0, random_state=quorum_seed(fd.n_clients, rounds),
                                      verbose=False)
    marks = [time.process_time()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est.fit(fd, runtime=fl.InProcessRuntime(fd, batched=batched),
                callbacks=[lambda *a: marks.append(time.process_time())])
    h = est.history_.to_frame().iloc[1:]
    return (float(np.median(np.diff(marks)[1:])), float(h["bytes_up"].median()),
            float(h["bytes_down"].median()), float(h["participants"].median()))


def setup_cost(fd, rounds: int):
    rt = fl.InProcessRuntime(fd)
    est = fl.FederatedGaussianMixture(3)
    setup_clients(rt, est._make_model(fd))
    fed = fl.Federation(secure_aggregation=True)
    t0 = time.process_time()
    ch = open_channel(rt, fed, {c: 200 for c in fd.client_ids}, rounds)
    return time.process_time() - t0, ch.setup_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 50])
    ap.add_argument("--rounds", type=int, default=8)
    a = ap.parse_args()
    print(f"{'clients':>7} {'path':<18} {'s/round':>9} {'up KB':>8} {'down KB':>8} "
          f"{'active':>6} {'x time':>7} {'x up':>6}")
    for n in a.clients:
        fd = data(n)
        ref = fit(fd, False, a.rounds, batched=False)
        rows = [("plain, per client", ref), ("plain, batched", fit(fd, False, a.rounds, True)),
                ("secure", fit(fd, True, a.rounds, False))]
        for name, (s, up, down, act) in rows:
            print(f"{n:>7} {name:<18} {s:>9.4f} {up / 1e3:>8.1f} {down / 1e3:>8.1f} {act:>6.0f} "
                  f"{s / ref[0]:>7.1f} {up / ref[1]:>6.1f}")
        t, b = setup_cost(fd, a.rounds)
        print(f"{n:>7} {'secure set-up':<18} {t:>9.4f} {b / 1e3:>8.1f} (once per fit, "
              f"{a.rounds} rounds + 8 initialization exchanges planned)")


if __name__ == "__main__":
    main()
