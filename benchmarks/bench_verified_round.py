"""What verified rounds cost a site: a verified secure fit against an unverified one, the whole
wired protocol, measured in one run (issue 38).

A secure federated GMM (d = 4, K = 3, full covariance, 200 rows a client, the data of
``bench_secure_fit.py``; ``--rows`` another number of rows a client, drawn the same way) runs
``--rounds`` rounds in-process over ``--clients`` clients at full participation
(verification needs it), once with ``Federation(verified=False)`` and once with the default
(verified rounds: each message carries the transcript of the site's last exchange, every
site checks its own leaf and path, folds the digest into its consistency tokens, and
replays the FedEM update and the M-step; the server sends no ``S_hat``). Every client call
goes through the runtime, so the CPU time inside ``runtime.call`` during a round, divided
by its participants, is a site's CPU for that round (E-step, masking, verification,
consistency round, reveal; the runtime's copying of messages counted too). Bytes down per
participant come from ``history_``. Round 1 carries the key set-up and the start's replay
and is reported apart (set-up: the key exchange's bytes and CPU, which verification does
not change); rounds 2.. are the steady state (median). Each site replays alone, as a
deployed one does; what the process's sites share is numba's set-up: 1,000 verifying sites in
one process run their checks compiled (``verify.SITES_FOR_KERNELS``: their savings repay it),
where one deployed site's process checks in NumPy (``--numpy``: the checks so here too).

Where a verified round's extra goes (rounds 3.., per site: round 2, the first steady one, is
where the process loads the compiled kernels, once): each part of the site's verification
timed with the thread's CPU clock, only inside ``runtime.call`` (the server runs
some of the same functions outside it), and the fields a verified message carries instead of
an unverified one's, with their bytes. The server's extra work (the sum tree of each
exchange) is reported as the server's CPU outside ``runtime.call`` per round. The machine is
shared: ratios are within one run (the load is printed).

Run: ``python benchmarks/bench_verified_round.py [--clients 1000] [--rounds 5] [--rows 200]
[--no-parts] [--pairs 3] [--together 3] [--numpy]``.
"""

from __future__ import annotations

import argparse
import collections
import os
import time
import warnings

import numpy as np
from _common import blas_limit  # noqa: E402 (this folder is on sys.path)
from _timing import timed  # noqa: E402
from bench_secure_fit import data  # noqa: E402

import fedlatent as fl
from fedlatent.engine.protocol.messages import message_nbytes


def rows_data(n_clients: int, rows: int, seed: int = 0) -> fl.FederatedDataset:
    """``bench_secure_fit.data`` (200 rows a client), or the same draw with ``rows`` rows."""
    if rows == 200:
        return data(n_clients, seed)
    rng = np.random.default_rng(seed)
    centers = rng.normal(0, 3, (3, 4))
    return fl.FederatedDataset.from_arrays(
        {f"c{i:05d}": centers[rng.integers(0, 3, rows)] + rng.normal(size=(rows, 4))
         for i in range(n_clients)})


def _parts():
    """(owner, attribute, part) of a site's verification, a part nested in another after it."""
    import fedlatent.engine.node.replay as replay
    import fedlatent.engine.node.verify as verify
    import fedlatent.engine.secagg.sumtree as sumtree
    from fedlatent.engine.fedem.update import FedEMState
    from fedlatent.models.gmm.model import GMMModel

    try:  # the transcript's check (verify's _check_transcript in an older library)
        import fedlatent.engine.node.verify_transcript as transcript
        checks = "check_transcript"
    except ImportError:
        transcript, checks = verify, "_check_transcript"

    return [part for part in [
        (verify, "check_exchange", "verification, all of it"),
        (verify, "_replay_round", " its replay side (_replay_round)"),  # (one space: it
        # holds the replay's parts below, so the rest's sum leaves it out)
        (transcript, checks, " its transcript side (check_transcript)"),  # (one
        # space, as the replay side: its parts are the two below and the glue around them)
        (sumtree, "read_transcript", "  reading the transcript's bytes"),
        (sumtree, "verify_leaf", "  leaf and path check (sum tree)"),
        (verify, "_delta", "  aggregate's S_hat fields decoded (_delta)"),
        (FedEMState, "advance", "  replay: FedEM update"),
        (verify, "_flat_step", "  replay: FedEM update (flat, steady rounds)"),
        (GMMModel, "check_step", "  M-step checked forward (check_step)"),
        (GMMModel, "replay_step", "  replay: M-step (replay_step, if not checked)"),
        (replay, "replay_refusal", "  parameters compared (if not checked)"),
        (verify, "_check_round", "  round settings checked (_check_round)"),
        (verify, "_check_scale", "  unit and weight checked (_check_scale)"),
    ] if hasattr(part[0], part[1])]  # (an older library: no check_step)


class TimedRuntime(fl.InProcessRuntime):
    """The in-process runtime, with the CPU seconds spent answering clients kept (``inside``
    while it does: the gate of the parts' timers) and the last E-step message of one client."""

    def __init__(self, fd):
        super().__init__(fd, batched=False)
        self.cpu, self.inside, self.acc, self.msg = 0.0, False, collections.Counter(), None

    def call(self, client_ids, method, messages):
        if method == "estep" and client_ids:
            self.msg = dict(messages[client_ids[0]])
        t = time.thread_time()
        self.inside = True
        try:
            return super().call(client_ids, method, messages)
        finally:
            self.inside = False
            self.cpu += time.thread_time() - t


def secure_fit(fd, rounds: int, verified: bool, parts: bool = True) -> dict:
    """Per round: site CPU per participant, server CPU, bytes down per participant; the
    verification's parts per participant (rounds 3..) and the last E-step message. Both fits
    run with the same timers (the unverified one calls none of them inside the sites)."""
    rt = TimedRuntime(fd)
    fed = fl.Federation(secure_aggregation=True, verified=verified)
    est = fl.FederatedGaussianMixture(3, init_params="random", federation=fed, max_rounds=rounds,
                                      tol=0.0, random_state=7, verbose=False)
    marks = [(0.0, time.thread_time())]

    def record(*a):
        marks.append((rt.cpu, time.thread_time()))
        if len(marks) == 3:
            rt.acc.clear()  # (rounds 3.. only: round 2 loads the compiled kernels)

    with warnings.catch_warnings(), timed(_parts() if parts else (), rt.acc,
                                          gate=lambda: rt.inside):
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est.fit(fd, runtime=rt, callbacks=[record])
    h = est.history_.to_frame()
    site = np.diff([m[0] for m in marks])
    total = np.diff([m[1] for m in marks])
    n = h["participants"].to_numpy()
    per = float(np.sum(n[2:]))
    return {"site": site / n, "server": total - site, "down": (h["bytes_down"] / n).to_numpy(),
            "params": est.means_, "parts": {k: v / per for k, v in rt.acc.items()},
            "msg": rt.msg}


def _fields(off: dict, on: dict) -> None:
    """The fields one message carries and the other does not, with their bytes."""
    a, b = off["msg"], on["msg"]
    print("  fields of a round's E-step message (bytes: name and value):")
    for k in sorted(set(a) ^ set(b)):
        v = a.get(k, b.get(k))
        what = f"{np.asarray(v).dtype}{np.shape(v)}" if isinstance(v, np.ndarray) else ""
        side = "verified only" if k in b else "unverified only"
        print(f"    {k:24s} {message_nbytes({k: v}):6d}  {side:16s} {what}")
    print(f"    message: unverified {message_nbytes(a)}, verified {message_nbytes(b)}")


def _account(on: dict, base: float, extra: float) -> None:
    print("  where a verified round's site CPU goes (thread CPU, inside the site's calls; "
          "mean of rounds 3..):")
    parts = on["parts"]
    for _, _, label in _parts():
        v = parts.get(label, 0.0)
        print(f"    {label:42s} {v * 1e6:8.1f} us  {v / base:6.3f} of the unverified round")
    top = parts.get("verification, all of it", 0.0)
    nested = sum(v for k, v in parts.items() if k.startswith("  "))
    print(f"    {'  the rest of it (messages, state, parsing)':42s} {(top - nested) * 1e6:8.1f} us")
    print(f"    {'outside it (E-step and masking after it)':42s} {(extra - top) * 1e6:8.1f} us")
    print(f"    {'verified round less unverified round':42s} {extra * 1e6:8.1f} us  "
          f"{extra / base:6.3f} of the unverified round")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--no-parts", action="store_true",
                    help="time no part (the ratios without the timers' own cost)")
    ap.add_argument("--pairs", type=int, default=1,
                    help="alternate this many (unverified, verified) fits without the part "
                         "timers and print each pair's steady-round ratio and their median "
                         "(a shared machine's speed drifts: one pair's ratio moves by ~0.1)")
    ap.add_argument("--together", type=int, default=0,
                    help="also run this many (unverified, verified) pairs each at once, in two "
                         "threads (the machine's drift falls on both fits alike), and print "
                         "each pair's steady-round ratio and their median")
    ap.add_argument("--numpy", action="store_true",
                    help="the sites check in NumPy, as one deployed site's process does (no "
                         "compiled kernels whatever the number of sites in the process)")
    a = ap.parse_args()
    if a.numpy:  # (as if fewer sites than repay numba's set-up verified in the process)
        import fedlatent.engine.node.verify as verify

        verify.SITES_FOR_KERNELS = 1 << 40
    with blas_limit(1):
        fd = rows_data(a.clients, a.rows)
        off = secure_fit(fd, a.rounds, False, not a.no_parts)
        on = secure_fit(fd, a.rounds, True, not a.no_parts)
        ratios = [_steady(on) / _steady(off)] if a.no_parts else []
        while a.pairs > 1 and len(ratios) < a.pairs:
            pair = [_steady(secure_fit(fd, a.rounds, v, False)) for v in (False, True)]
            ratios.append(pair[1] / pair[0])
        together = [_together(fd, a.rounds) for _ in range(a.together)]
    same = float(np.max(np.abs(on["params"] - off["params"])))
    print(f"clients {a.clients}, rows a client {a.rows}, rounds {a.rounds}, load "
          f"{os.getloadavg()[0]:.1f} (machine shared; ratios within this run); verified and "
          f"unverified means differ by {same:.3g}")
    for what, r in (("round 1 (set-up, start)", slice(0, 1)), ("rounds 2.. (median)",
                                                                slice(1, None))):
        cpu = [float(np.median(x["site"][r])) for x in (off, on)]
        down = [float(np.median(x["down"][r])) for x in (off, on)]
        srv = [float(np.median(x["server"][r])) for x in (off, on)]
        print(f"{what}:")
        print(f"  site CPU per participant   unverified {cpu[0] * 1e3:9.3f} ms   verified "
              f"{cpu[1] * 1e3:9.3f} ms   ratio {cpu[1] / cpu[0]:6.3f}x")
        print(f"  bytes down per participant unverified {down[0]:9.0f}      verified "
              f"{down[1]:9.0f}      ratio {down[1] / down[0]:6.3f}x")
        print(f"  server CPU (outside calls) unverified {srv[0]:9.3f} s    verified "
              f"{srv[1]:9.3f} s")
    base = float(np.mean(off["site"][1:]))
    if not a.no_parts:
        _account(on, base, float(np.mean(on["site"][1:])) - base)
    _fields(off, on)
    if ratios and a.pairs > 1:
        print(f"steady-round site CPU ratio of {len(ratios)} alternated pairs (no part timers): "
              + ", ".join(f"{r:.3f}x" for r in ratios) + f"; median {np.median(ratios):.3f}x")
    if together:
        print(f"steady-round site CPU ratio of {len(together)} pairs run at once (two threads, "
              "no part timers): " + ", ".join(f"{r:.3f}x ({u * 1e3:.3f} / {v * 1e3:.3f} ms)"
                                              for r, u, v in together)
              + f"; median {np.median([r for r, _, _ in together]):.3f}x")


def _together(fd, rounds: int) -> tuple[float, float, float]:
    """``(ratio, unverified, verified)``: the steady-round site CPU of one (unverified,
    verified) pair of fits run at once, and its ratio, each fit in its own thread: the
    interpreter switches between them every few milliseconds, so a shared machine's drift
    (its speed moves by 10-30% within a minute: alternated pairs' ratios spread by 0.3)
    falls on both alike, and neither fit's sites find the caches as the site before them
    left them (as one deployed site never does). Each fit's site CPU is its own thread's
    (the runtime reads the thread's clock)."""
    import threading

    out: dict[bool, float] = {}
    threads = [threading.Thread(target=lambda v=v: out.__setitem__(v, _steady(secure_fit(
        fd, rounds, v, False)))) for v in (False, True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out[True] / out[False], out[False], out[True]


def _steady(fit: dict) -> float:
    """A fit's site CPU per participant in its steady rounds (2.., the median)."""
    return float(np.median(fit["site"][1:]))


if __name__ == "__main__":
    main()
