"""Where secure aggregation's time goes: the set-up and a round, part by part, in CPU seconds.

The fit of ``bench_secagg_scale.py`` (a federated GMM, d = 4, K = 3, 200 rows per client,
participation 0.7, quantizer 8, in-process, one client at a time, one BLAS thread), run once
with ``secure_aggregation=True`` and once without, with each part below wrapped by a timer of
the thread's CPU clock (about a microsecond a call, some 7,000 calls a round at 1,000
clients: a few ms). Reported:

- the key set-up: the X25519 agreements (one per neighbour per client), the key derivations
  (HKDF, one per neighbour per client), sealing and opening the shares (AES-256-GCM, one message
  each way per pair), dealing them (Shamir), the client's checks of its roster (the
  commitments, the graph, its peers' signed keys: verified once per process, so an in-process
  client mostly finds them verified), signing its keys, key generation, the server's rosters
  and routing, the in-process runtime's copies of every message (what stands for the wire),
  and the rest, each also as a multiple of the agreements' time;
- a round (rounds 3..end, each fit's own): the client's E-step (as in the plain fit), its
  masking (of which the pair keystreams), the consistency round and the reveal on the client,
  the server's aggregation and unmasking, and the rest (runtime, messages), each also as a
  fraction of the plain per-client round measured in the same process.

Run: ``python benchmarks/bench_secagg_account.py [--clients 1000] [--rounds 6]``. Timings on a
shared machine move with its load; the fractions are of one run (say the load: printed).
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import time
import warnings

from _common import blas_limit  # noqa: E402 (this folder is on sys.path)
from bench_secure_fit import data, quorum_seed  # noqa: E402

import fedlatent as fl
import fedlatent.engine.secagg._crypto as crypto
import fedlatent.engine.secagg.secure as secure_mod
import fedlatent.engine.secagg.shamir as shamir
import fedlatent.engine.site.keys as site_keys
import fedlatent.engine.transport.inprocess as inprocess
from fedlatent.engine.node.client import ClientNode
from fedlatent.engine.secagg.client import SecAggClient
from fedlatent.engine.secagg.enrol import Enrolment
from fedlatent.engine.secagg.server import SecAggServer

#: (owner, attribute, part): what is timed; a part nested in another is listed after it
SETUP_PARTS = [
    (crypto, "agree_many", "X25519 agreements"),
    (crypto, "derive_keys", "key derivation (HKDF)"),
    (crypto, "aead_seal_rows", "sealing the shares (AES-GCM)"),
    (crypto, "aead_open_rows", "opening the shares (AES-GCM)"),
    (shamir, "share_seeds", "dealing the shares (Shamir)"),
    (Enrolment, "receive_peer_keys", "client: roster checks (commitments, graph, signatures)"),
    (site_keys, "verify_many", "  of which verifying peers' keys (Ed25519)"),
    (site_keys.SiteKeys, "sign_bytes", "signing its keys (Ed25519)"),
    (crypto, "generate_private", "X25519 key generation"),
    (SecAggServer, "roster_for", "server: each client's roster"),
    (secure_mod.SecureChannel, "_route", "server: routing the shares"),
    (inprocess, "_freeze", "in-process runtime: message copies"),
]
ROUND_PARTS = [
    (ClientNode, "_answer", "client: E-step (as plain)"),
    (secure_mod, "mask_reply", "client: masking, all of it"),
    (SecAggClient, "_pair_masks", "  of which the pair keystreams (AES-CTR)"),
    (SecAggClient, "consistency", "client: consistency round"),
    (SecAggClient, "reveal", "client: reveal"),
    (SecAggServer, "aggregate", "server: aggregate"),
    (SecAggServer, "collect_confirmations", "server: check confirmations"),
    (SecAggServer, "unmask", "server: unmask"),
]


def timed(parts, acc: collections.Counter):
    """Wrap every part with a CPU-clock timer adding into ``acc``; returns the undo list."""
    undo = []
    for owner, name, label in parts:
        f = getattr(owner, name)

        @functools.wraps(f)
        def g(*a, _f=f, _label=label, **kw):
            t0 = time.thread_time()
            try:
                return _f(*a, **kw)
            finally:
                acc[_label] += time.thread_time() - t0

        setattr(owner, name, g)
        undo.append((owner, name, f))
    return undo


def run_fit(fd, secure: bool, rounds: int, acc: collections.Counter) -> dict:
    """One fit; ``acc`` holds the parts of rounds 3..end (and, secure, the set-up's in
    ``["setup"]``); returns the set-up's CPU seconds and the rounds' CPU seconds."""
    n = fd.n_clients
    out, marks = {}, []
    setup = collections.Counter()

    def record(k, params, S_hat, rec):
        marks.append(time.thread_time())
        if k == 2:
            acc.clear()  # the parts of rounds 3..end only

    fed = fl.Federation(participation=0.7, quantizer=fl.Quantizer(8), secure_aggregation=secure)
    est = fl.FederatedGaussianMixture(3, init_params="random", federation=fed, max_rounds=rounds,
                                      tol=0.0, random_state=quorum_seed(n, rounds),
                                      verbose=False)
    open_channel = secure_mod.open_channel

    def timed_open(*a, **kw):
        undo = timed(SETUP_PARTS, setup)
        t0 = time.thread_time()
        try:
            return open_channel(*a, **kw)
        finally:
            out["setup"] = time.thread_time() - t0
            for owner, name, f in undo:
                setattr(owner, name, f)

    secure_mod.open_channel = timed_open
    undo = timed(ROUND_PARTS, acc)
    try:
        est.fit(fd, runtime=fl.InProcessRuntime(fd, batched=False), callbacks=[record])
    finally:
        secure_mod.open_channel = open_channel
        for owner, name, f in undo:
            setattr(owner, name, f)
    out["round"] = (marks[-1] - marks[1]) / (len(marks) - 2)
    out["parts"] = {k: v / (len(marks) - 2) for k, v in acc.items()}
    out["setup_parts"] = dict(setup)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=6)
    a = ap.parse_args()
    fd = data(a.clients)
    with blas_limit(1), warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        plain = run_fit(fd, False, a.rounds, collections.Counter())
        sec = run_fit(fd, True, a.rounds, collections.Counter())
    print(f"{a.clients:,} clients, {time.strftime('%Y-%m-%d %H:%M')}, load "
          f"{os.getloadavg()[0]:.1f}; CPU seconds of the fit's thread")
    S, agree = sec["setup_parts"], sec["setup_parts"].get("X25519 agreements", float("nan"))
    print("\n| set-up part | s | / agreements |\n|---|---|---|")
    for _, _, label in SETUP_PARTS:
        print(f"| {label} | {S.get(label, 0.0):.3f} | {S.get(label, 0.0) / agree:.2f} |")
    rest = sec["setup"] - sum(v for k, v in S.items() if not k.startswith("  "))
    print(f"| the rest | {rest:.3f} | {rest / agree:.2f} |")
    print(f"| set-up | {sec['setup']:.3f} | {sec['setup'] / agree:.2f} |")
    P, base = sec["parts"], plain["round"]
    print(f"\n| round part (rounds 3..{a.rounds}) | ms | / plain round |\n|---|---|---|")
    for _, _, label in ROUND_PARTS:
        print(f"| {label} | {1e3 * P.get(label, 0.0):.1f} | {P.get(label, 0.0) / base:.2f} |")
    top = sum(v for k, v in P.items() if not k.startswith("  "))
    rest = sec["round"] - top
    print(f"| the rest (runtime, messages, the server's round) | {1e3 * rest:.1f} | "
          f"{rest / base:.2f} |")
    print(f"| secure round | {1e3 * sec['round']:.1f} | {sec['round'] / base:.2f} |")
    print(f"| plain per-client round | {1e3 * base:.1f} | 1.00 |")


if __name__ == "__main__":
    main()
