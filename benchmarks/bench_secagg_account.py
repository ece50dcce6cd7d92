"""Where secure aggregation's time goes: the set-up and a round, part by part, in CPU seconds.

The fit of ``bench_secagg_scale.py`` (a federated GMM, d = 4, K = 3, 200 rows per client,
participation 0.7, quantizer 8, in-process, one client at a time, one BLAS thread), run once
with ``secure_aggregation=True`` and once without, with each part below wrapped by a timer of
the thread's CPU clock (``_timing.py``: about a microsecond a call, some 7,000 calls a round
at 1,000 clients: a few ms). Reported:

- the key set-up: the X25519 agreements (one per neighbour per client), the key derivations
  (one SHA-512 per neighbour per client), sealing and opening the shares (AES-256-GCM, one message
  each way per pair), dealing them (Shamir), the client's checks of its roster (the
  commitments, the graph, its peers' signed keys: verified once per process, so an in-process
  client mostly finds them verified), signing its keys, key generation, the server's rosters
  and routing, the in-process runtime's copies of every message (what stands for the wire),
  and the rest, each also as a multiple of the agreements' time;
- a round (rounds 3..end, each fit's own): the client's E-step (as in the plain fit), its
  masking (of which the pair keystreams), the consistency round and the reveal on the client,
  the server's aggregation and unmasking, and the rest (runtime, messages), each also as a
  fraction of the plain per-client round measured in the same process.

Run: ``python benchmarks/bench_secagg_account.py [--clients 1000] [--rounds 6] [--setup-only]``
(``--setup-only``: the set-up's table alone, the fit stopped after it). Timings on a
shared machine move with its load; the fractions are of one run (say the load: printed).
"""

from __future__ import annotations

import argparse
import collections
import os
import time
import warnings

from _common import blas_limit  # noqa: E402 (this folder is on sys.path)
from _timing import clocked, timed  # noqa: E402
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
    (crypto, "derive_keys", "key derivation (SHA-512 one-step KDF)"),
    (crypto, "aead_seal_rows", "sealing the shares (AES-GCM)"),
    (crypto, "aead_open_rows", "opening the shares (AES-GCM)"),
    (shamir, "share_seeds", "dealing the shares (Shamir)"),
    (Enrolment, "receive_peer_keys", "client: roster checks (commitments, graph, signatures)"),
    (site_keys, "verify_bytes", "  of which verifying peers' keys (Ed25519)"),
    (site_keys.SiteKeys, "sign_bytes", "signing its keys (Ed25519)"),
    (crypto, "generate_private", "X25519 key generation"),
    (SecAggServer, "roster_for", "server: each client's roster"),
    (secure_mod.SecureChannel, "_route", "server: routing the shares"),
    (inprocess, "_freeze", "in-process runtime: message copies"),
]
ROUND_PARTS = [
    (ClientNode, "_answer", "client: E-step (as plain)"),
    (secure_mod, "mask_reply", "client: masking, all of it"),
    (SecAggClient, "_pair_rows", "  of which the pair keystreams (AES-CTR)"),
    (SecAggClient, "consistency", "client: consistency round"),
    (SecAggClient, "reveal", "client: reveal"),
    (SecAggServer, "aggregate", "server: aggregate"),
    (SecAggServer, "collect_confirmations", "server: check confirmations"),
    (SecAggServer, "unmask", "server: unmask"),
]


class SetUpDone(Exception):
    """Stops a fit once its key set-up has been timed (``--setup-only``)."""


def run_fit(fd, secure: bool, rounds: int, acc: collections.Counter,
            setup_only: bool = False) -> dict:
    """One fit; ``acc`` holds the parts of rounds 3..end (and, secure, the set-up's in
    ``["setup_parts"]``); returns the set-up's CPU seconds and the rounds' CPU seconds (none
    with ``setup_only``: the fit stops after its set-up)."""
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
    whole = clocked(open_channel, "set-up", setup)

    def timed_open(*a, **kw):  # the set-up's parts timed inside it only
        with timed(SETUP_PARTS, setup):
            channel = whole(*a, **kw)
        if setup_only:
            raise SetUpDone
        return channel

    secure_mod.open_channel = timed_open
    try:
        with timed(ROUND_PARTS, acc):
            est.fit(fd, runtime=fl.InProcessRuntime(fd, batched=False), callbacks=[record])
    except SetUpDone:
        pass
    finally:
        secure_mod.open_channel = open_channel
    if not setup_only:
        out["round"] = (marks[-1] - marks[1]) / (len(marks) - 2)
        out["parts"] = {k: v / (len(marks) - 2) for k, v in acc.items()}
    out["setup"] = setup.pop("set-up", 0.0)
    out["setup_parts"] = dict(setup)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--setup-only", action="store_true",
                    help="the set-up's parts only (no plain fit, no rounds)")
    a = ap.parse_args()
    fd = data(a.clients)
    with blas_limit(1), warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        plain = None if a.setup_only else run_fit(fd, False, a.rounds, collections.Counter())
        sec = run_fit(fd, True, a.rounds, collections.Counter(), a.setup_only)
    print(f"{a.clients:,} clients, {time.strftime('%Y-%m-%d %H:%M')}, load "
          f"{os.getloadavg()[0]:.1f}; CPU seconds of the fit's thread")
    S, agree = sec["setup_parts"], sec["setup_parts"].get("X25519 agreements", float("nan"))
    print("\n| set-up part | s | / agreements |\n|---|---|---|")
    for _, _, label in SETUP_PARTS:
        print(f"| {label} | {S.get(label, 0.0):.3f} | {S.get(label, 0.0) / agree:.2f} |")
    rest = sec["setup"] - sum(v for k, v in S.items() if not k.startswith("  "))
    print(f"| the rest | {rest:.3f} | {rest / agree:.2f} |")
    print(f"| set-up | {sec['setup']:.3f} | {sec['setup'] / agree:.2f} |")
    if plain is None:
        return
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
