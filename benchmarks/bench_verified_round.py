"""What verified rounds cost a site: a verified secure fit against an unverified one, the whole
wired protocol, measured in one run (issue 38).

A secure federated GMM (d = 4, K = 3, full covariance, 200 rows a client, the data of
``bench_secure_fit.py``) runs ``--rounds`` rounds in-process over ``--clients`` clients at
full participation (verification needs it), once with ``Federation(verified=False)`` and once
with the default (verified rounds: each message carries the transcript of the site's last
exchange, every site checks its own leaf and path, folds the digest into its consistency
tokens, and replays the FedEM update and the M-step; the server sends no ``S_hat``). Every
client call goes through the runtime, so the CPU time inside ``runtime.call`` during a
round, divided by its participants, is a site's CPU for that round (E-step, masking,
verification, consistency round, reveal; the runtime's copying of messages counted too).
Bytes down per participant come from ``history_``. Round 1 carries the key set-up and the
start's replay and is reported apart (set-up: the key exchange's bytes and CPU, which
verification does not change); rounds 2.. are the steady state (median).

The sites one process holds share one replay of each server step and one challenge of each
claim (keyed by a hash of every input: ``node/verify.py``, ``secagg/sumtree.py``); a deployed
site computes its own. The third fit ("verified, nothing shared") turns that sharing off, so
its figure is what each site pays alone. The server's extra work (the sum tree of each
exchange) is reported as the server's CPU outside ``runtime.call`` per round. The machine is
shared: ratios are within one run.

Run: ``python benchmarks/bench_verified_round.py [--clients 1000] [--rounds 4]``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from _common import blas_limit  # noqa: E402 (this folder is on sys.path)
from bench_secure_fit import data  # noqa: E402

import fedlatent as fl


class TimedRuntime(fl.InProcessRuntime):
    """The in-process runtime, with the CPU seconds spent answering clients kept."""

    def __init__(self, fd):
        super().__init__(fd, batched=False)
        self.cpu = 0.0

    def call(self, client_ids, method, messages):
        t = time.process_time()
        try:
            return super().call(client_ids, method, messages)
        finally:
            self.cpu += time.process_time() - t


class _Unshared(dict):
    """A memo that never hits (each site computes its own replay and challenge)."""

    def get(self, key, default=None):
        return default


def secure_fit(fd, rounds: int, verified: bool, shared: bool = True) -> dict:
    """Per round: site CPU per participant, server CPU, bytes down per participant."""
    import fedlatent.engine.node.verify as verify
    import fedlatent.engine.secagg.sumtree as sumtree

    memos = (verify._REPLAYS, sumtree._CLAIMS)
    if not shared:
        verify._REPLAYS, sumtree._CLAIMS = _Unshared(), _Unshared()
    try:
        return _secure_fit(fd, rounds, verified)
    finally:
        verify._REPLAYS, sumtree._CLAIMS = memos


def _secure_fit(fd, rounds: int, verified: bool) -> dict:
    rt = TimedRuntime(fd)
    fed = fl.Federation(secure_aggregation=True, verified=verified)
    est = fl.FederatedGaussianMixture(3, init_params="random", federation=fed, max_rounds=rounds,
                                      tol=0.0, random_state=7, verbose=False)
    marks = [(0.0, time.process_time())]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est.fit(fd, runtime=rt,
                callbacks=[lambda *a: marks.append((rt.cpu, time.process_time()))])
    h = est.history_.to_frame()
    site = np.diff([m[0] for m in marks])
    total = np.diff([m[1] for m in marks])
    n = h["participants"].to_numpy()
    return {"site": site / n, "server": total - site, "down": (h["bytes_down"] / n).to_numpy(),
            "params": est.means_}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    with blas_limit(1):
        fd = data(a.clients)
        off = secure_fit(fd, a.rounds, False)
        on = secure_fit(fd, a.rounds, True)
        alone = secure_fit(fd, a.rounds, True, shared=False)
    same = float(np.max(np.abs(on["params"] - off["params"])))
    print(f"clients {a.clients}, rounds {a.rounds} (machine shared; ratios within this run); "
          f"verified and unverified means differ by {same:.3g}")
    for what, r in (("round 1 (set-up, start)", slice(0, 1)), ("rounds 2.. (median)",
                                                                slice(1, None))):
        cpu = [float(np.median(x["site"][r])) for x in (off, on, alone)]
        down = [float(np.median(x["down"][r])) for x in (off, on)]
        srv = [float(np.median(x["server"][r])) for x in (off, on)]
        print(f"{what}:")
        print(f"  site CPU per participant  unverified {cpu[0] * 1e3:9.3f} ms   verified "
              f"{cpu[1] * 1e3:9.3f} ms   ratio {cpu[1] / cpu[0]:6.3f}x   nothing shared "
              f"{cpu[2] * 1e3:9.3f} ms   ratio {cpu[2] / cpu[0]:6.3f}x")
        print(f"  bytes down per participant unverified {down[0]:9.0f}      verified "
              f"{down[1]:9.0f}      ratio {down[1] / down[0]:6.3f}x")
        print(f"  server CPU (outside calls) unverified {srv[0]:9.3f} s    verified "
              f"{srv[1]:9.3f} s")


if __name__ == "__main__":
    main()
