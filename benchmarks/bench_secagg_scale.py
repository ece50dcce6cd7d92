"""Secure aggregation at scale (SecAgg+): set-up and round cost against the plain round, one run.

A federated GMM (d = 4, K = 3, full covariance; 200 rows per client) with participation 0.7 and
the quantizer (8 levels), fitted in-process with and without
``Federation(secure_aggregation=True)`` on the same seed, for each number of clients: the
secure fit for ``--rounds`` rounds, the plain per-client fit (``InProcessRuntime(batched=
False)``) for as long as the secure one runs. The two fits run in one process, in two threads
that take turns every ``--every`` client calls (one runs while the other waits), so both see
the same machine at the same moments: the load of a shared machine moves within seconds (the
plain round alone moved 0.6-1.2 s between successive rounds of one fit), and comparing fits,
or even whole rounds, run one after the other measured that as much as the code. Each round
is timed in CPU seconds of its own thread (one BLAS thread: every client runs here, in turn).
The key set-up runs once and is not a ratio: it is timed alone (the plain fit waits meanwhile),
as a server that does nothing else runs it.

Reported per number of clients: the masking graph (degree k, neighbourhood threshold t; "all"
is the complete graph of Bonawitz et al., with its threshold), the fit's once-per-fit key
set-up (CPU seconds, timed inside the secure fit, and its bytes up per client), the median
secure round (rounds 2..end) and the median plain round (those run meanwhile), the ratio of
each secure round to the median of the plain rounds that ran at the same time (median and
range: ``--rounds 7`` gives six), and the bytes up of a round per participant (median). The
set-up plans ``--rounds`` rounds plus the 16 exchanges the engine reserves. A number of
clients given twice (``--clients 1000 1000``) is measured twice, on new fits.

Run: ``python benchmarks/bench_secagg_scale.py [--clients 10 100 1000] [--rounds 7]``; add
``--big`` for 10,000 clients (minutes; ``--big-rounds`` rounds, default 4: three);
``--setup-only`` times each set-up alone and divides it by its ``n k`` X25519 agreements
(``--jobs 2``: with ``InProcessRuntime(n_jobs=2)``, its agreements partly in a forked worker,
whose CPU seconds and the set-up's wall seconds are given too). The first line gives the
CPU time of one X25519 agreement on the machine at that moment: the set-up does ``k`` per
client, its floor.
"""

from __future__ import annotations

import argparse
import threading
import time
import warnings
from unittest import mock

import numpy as np
from _common import blas_limit  # noqa: E402 (this folder is on sys.path)

# the federation and the quorum seed of bench_secure_fit.py (this folder is on sys.path)
from bench_secure_fit import data, quorum_seed  # noqa: E402

import fedlatent as fl
import fedlatent.engine.secagg.secure as secure_mod
from fedlatent.engine.secagg.secure import open_channel


class Turns:
    """Two threads taking turns: one runs while it holds the turn, the other waits."""

    def __init__(self):
        self.cv = threading.Condition()
        self.turn, self.done = 0, [False, False]

    def wait(self, me: int) -> None:
        with self.cv:
            self.cv.wait_for(lambda: self.turn == me or self.done[1 - me])

    def give(self, me: int, finished: bool = False) -> None:
        with self.cv:
            self.done[me] = self.done[me] or finished
            self.turn = 1 - me
            self.cv.notify_all()


#: the steps of the once-per-fit key set-up (method ``secagg``; ``consistency`` and ``reveal``
#: belong to a round)
SETUP_STEPS = ("keys", "open", "roster", "shares")


class Interleaved(fl.InProcessRuntime):
    """The per-client in-process runtime, handing the turn over every ``every`` client calls
    (except during the key set-up: it runs alone, the other fit waiting)."""

    def __init__(self, fd, turns: Turns, me: int, every: int):
        super().__init__(fd, batched=False)
        self.turns, self.me, self.every, self.calls = turns, me, every, 0

    def _handle(self, cid, method, msg):  # one client's reply (the runtime's own step)
        out = super()._handle(cid, method, msg)
        if method == "secagg" and msg.get("step") in SETUP_STEPS:
            return out
        self.calls += 1
        if self.calls % self.every == 0:
            self.turns.give(self.me)
            self.turns.wait(self.me)
        return out


class Stop(Exception):
    """Ends the plain fit once the secure one has finished."""


def fit(fd, secure: bool, rounds: int, turns: Turns, every: int, out: dict) -> None:
    """One fit in this thread, taking turns with the other: ``out["rounds"]`` gets, per round,
    (CPU seconds of this thread, wall clock at its start and end, bytes up). The plain fit
    (``secure=False``) runs until the secure fit has finished."""
    me = int(secure)
    fed = fl.Federation(participation=0.7, quantizer=fl.Quantizer(8), secure_aggregation=secure)
    est = fl.FederatedGaussianMixture(3, init_params="random", federation=fed,
                                      max_rounds=rounds if secure else 100_000, tol=0.0,
                                      random_state=quorum_seed(fd.n_clients, rounds),
                                      verbose=False)
    rt = Interleaved(fd, turns, me, every)
    out["rounds"], last = [], [time.thread_time(), time.perf_counter()]

    def record(k, params, S_hat, rec):
        now = [time.thread_time(), time.perf_counter()]
        out["rounds"].append((now[0] - last[0], last[1], now[1], rec.bytes_up,
                              max(rec.participants, 1)))
        last[:] = now
        if not secure and turns.done[1]:
            raise Stop

    turns.wait(me)
    try:
        est.fit(fd, runtime=rt, callbacks=[record])
    except Stop:
        pass
    finally:
        turns.give(me, finished=True)


def timed_setup(record: dict):
    """``open_channel`` timed in the calling thread's CPU seconds into ``record``."""

    def timed(*args, **kw):
        t0, w0 = time.thread_time(), time.perf_counter()
        ch = open_channel(*args, **kw)
        cfg = ch.config
        record.update(s=time.thread_time() - t0, wall=time.perf_counter() - w0, up=ch.setup_up,
                      workers=getattr(ch.runtime, "worker_cpu", 0.0),
                      sites=getattr(ch.runtime, "worker_sites", 0),
                      graph=("all", cfg.threshold) if getattr(cfg, "degree", None) is None
                      else (cfg.degree, cfg.local_threshold))
        return ch

    return timed


def paired(fd, rounds: int, every: int = 10) -> dict:
    """The secure and the plain fit of ``fd`` taking turns: the secure rounds 2..end, the
    plain rounds run meanwhile, each secure round's ratio to the median of the plain rounds
    that overlap it, the median bytes up of a round and the secure set-up."""
    turns, plain, sec, setup = Turns(), {}, {}, {}
    with mock.patch.object(secure_mod, "open_channel", timed_setup(setup)):
        threads = [threading.Thread(target=fit, args=(fd, bool(i), rounds, turns, every, out))
                   for i, out in enumerate((plain, sec))]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    if len(sec.get("rounds", ())) != rounds or len(plain.get("rounds", ())) < 2:
        raise RuntimeError("a fit failed (its error was printed above)")
    S = np.array(sec["rounds"])[1:]
    P = np.array(plain["rounds"])[1:]
    P = P[(P[:, 2] > S[0, 1]) & (P[:, 1] < S[-1, 2])]  # run while the secure rounds ran
    ratio = np.array([s[0] / np.median(P[(P[:, 2] > s[1]) & (P[:, 1] < s[2]), 0]) for s in S])
    return {"plain": P[:, 0], "secure": S[:, 0], "ratio": ratio, "setup": setup,
            "up": [float(np.median(S[:, 3])), float(np.median(P[:, 3]))],
            "up_client": [float(np.median(S[:, 3] / S[:, 4])),
                          float(np.median(P[:, 3] / P[:, 4]))]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 100, 1000])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--big", action="store_true", help="add 10,000 clients (minutes)")
    ap.add_argument("--big-rounds", type=int, default=4,
                    help="rounds of the secure fit at 10,000 clients (rounds 2.. are timed)")
    ap.add_argument("--every", type=int, default=10,
                    help="client calls a fit makes before handing the turn to the other")
    ap.add_argument("--setup-only", action="store_true",
                    help="time each key set-up alone (no rounds), and divide it by its n k "
                         "X25519 agreements timed right after it")
    ap.add_argument("--jobs", type=int, default=1,
                    help="--setup-only: InProcessRuntime(n_jobs=...), the set-up's agreements "
                         "ahead in forked workers (Linux)")
    a = ap.parse_args()
    with blas_limit(1), warnings.catch_warnings():  # CPU seconds: no spinning BLAS
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        setups(a) if a.setup_only else table(a)


class SetUpDone(Exception):
    """Stops a fit once its key set-up has been timed."""


def setups(a) -> None:
    """``--setup-only``: per number of clients, the set-up's CPU seconds and its ratio to the
    cost of its ``n k`` X25519 agreements (the floor: one per neighbour per client)."""
    import os

    sizes = list(a.clients) + ([10_000] if a.big else [])
    print(f"n_jobs = {a.jobs}: the set-up's CPU seconds in this process (and, with workers, "
          "theirs), its wall seconds")
    print("| clients | k | t | set-up s (CPU) | X25519 us | set-up / (n k X25519) | workers' "
          "CPU s (sites) | wall s | load |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in sizes:
        fd, rec = data(n), {}

        def stop(*args, timed=timed_setup(rec), **kw):
            timed(*args, **kw)
            raise SetUpDone

        fed = fl.Federation(participation=0.7, quantizer=fl.Quantizer(8), secure_aggregation=True)
        est = fl.FederatedGaussianMixture(3, init_params="random", federation=fed, max_rounds=4,
                                          tol=0.0, random_state=quorum_seed(n, 4), verbose=False)
        with mock.patch.object(secure_mod, "open_channel", stop):
            try:
                est.fit(fd, runtime=fl.InProcessRuntime(fd, batched=False, n_jobs=a.jobs))
            except SetUpDone:
                pass
        k, t = rec["graph"]
        k_n = (n - 1) if k == "all" else k
        us = x25519_us()
        print(f"| {n:,} | {k} | {t} | {rec['s']:.2f} | {us:.1f} | "
              f"{rec['s'] / (n * k_n * us * 1e-6):.2f} | {rec['workers']:.2f} ({rec['sites']:,}) | "
              f"{rec['wall']:.2f} | {os.getloadavg()[0]:.1f} |", flush=True)


def table(a) -> None:
    """The benchmark's table for the parsed arguments ``a``."""
    sizes = [(n, a.rounds) for n in a.clients] + ([(10_000, a.big_rounds)] if a.big else [])
    print(f"GMM d = 4, K = 3, 200 rows per client, participation 0.7, quantizer 8; CPU s of each "
          f"fit's thread, the two fits taking turns every {a.every} client calls in one "
          f"process, one BLAS thread; {time.strftime('%Y-%m-%d')}")
    print(f"X25519 agreement on this machine now: {x25519_us():.0f} us")
    print()
    print("| clients | rounds | graph k | t | set-up s | set-up KB up/client | secure s/round "
          "| plain s/round | ratio median | ratio range | KB up/client secure "
          "| KB up/client plain |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, rounds in sizes:
        r = paired(data(n), rounds, a.every)
        st, (k, t) = r["setup"], r["setup"]["graph"]
        up = r["up_client"]
        print(f"| {n:,} | {rounds} | {k} | {t} | {st['s']:.2f} | {st['up'] / n / 1e3:.1f} | "
              f"{np.median(r['secure']):.4f} | {np.median(r['plain']):.4f} | "
              f"{np.median(r['ratio']):.2f} | {r['ratio'].min():.2f}-{r['ratio'].max():.2f} | "
              f"{up[0] / 1e3:.2f} | {up[1] / 1e3:.2f} |", flush=True)


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
