"""What verifying a secure round adds at each site: the projected sum tree's check and the replay
of the server's update and M-step, against the site's own cost of the unverified secure round,
measured in one run (issue 38).

A secure federated GMM (d = 4, K = 3, full covariance, 200 rows a client, participation 0.7,
the quantizer: the federation of ``bench_secure_fit.py``) runs ``--rounds`` rounds in-process
over ``--clients`` clients. Every client call of the fit goes through the runtime, so the CPU
time spent inside ``runtime.call`` during a round, divided by its participants, is a site's
CPU for that round (its E-step, masking, consistency round and reveal; the runtime's copying
of messages is counted too, against us). Bytes down per participant come from ``history_``.

Then, in the same process, for the last round's survivors with leaves of the round's width:
the server builds the projected sum tree once (:class:`~fedlatent.engine.secagg.sumtree.
SumTree`, reported alone: server CPU), and every site checks its own leaf and path
(:func:`~fedlatent.engine.secagg.sumtree.verify_leaf`) and replays the FedEM update and the
M-step (:func:`~fedlatent.engine.node.replay.replay` and
:func:`~fedlatent.engine.node.replay.params_refusal`); the median CPU of one site's check and
replay, and the bytes a site would get in addition (its path, the aggregate and its carries,
the digest; the carries are below n, 2 bytes each), are printed beside the unverified
round's, as ratios. The aggregate is counted in full, although a site that took part in the
round before could replay ``S_hat`` from it, which the message then need not carry.

Not measured here: the exchange does not yet carry the tree (the consistency statements do
not yet carry the digest), so this is the cost of the checks a verifying site runs, not of a
wired protocol. The machine is shared: the ratio is within one run.

Run: ``python benchmarks/bench_verified_round.py [--clients 1000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np
from _common import blas_limit  # noqa: E402 (this folder is on sys.path)
from bench_secure_fit import data, quorum_seed  # noqa: E402

import fedlatent as fl
from fedlatent.engine.contract import registry
from fedlatent.engine.fedem.update import FedEMState
from fedlatent.engine.node.replay import params_refusal, replay
from fedlatent.engine.secagg.sumtree import PROJECTIONS, SumTree, verify_leaf
from fedlatent.engine.stats import Stats


class TimedRuntime(fl.InProcessRuntime):
    """The in-process runtime, with the CPU seconds spent answering clients kept per call."""

    def __init__(self, fd):
        super().__init__(fd, batched=False)
        self.cpu = 0.0

    def call(self, client_ids, method, messages):
        t = time.process_time()
        try:
            return super().call(client_ids, method, messages)
        finally:
            self.cpu += time.process_time() - t


def secure_round(fd, rounds: int):
    """``(site CPU s per participant of a round, bytes down per participant, the estimator)``:
    medians over rounds 2.. of the secure fit (the key set-up, in round 1, left out)."""
    rt = TimedRuntime(fd)
    fed = fl.Federation(participation=0.7, quantizer=fl.Quantizer(8), secure_aggregation=True)
    est = fl.FederatedGaussianMixture(3, init_params="random", federation=fed, max_rounds=rounds,
                                      tol=0.0, random_state=quorum_seed(fd.n_clients, rounds),
                                      verbose=False)
    marks = [0.0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est.fit(fd, runtime=rt, callbacks=[lambda *a: marks.append(rt.cpu)])
    h = est.history_.to_frame()
    cpu = np.diff(marks)[1:] / h["participants"].to_numpy()[1:]
    down = (h["bytes_down"] / h["participants"]).to_numpy()[1:]
    return float(np.median(cpu)), float(np.median(down)), est


def verified_checks(est, n: int, width: int, seed: int = 0):
    """``(server s to build the tree, median site s to check and replay, extra bytes down a
    site)`` for ``n`` survivors with leaves of ``width`` words."""
    rng = np.random.default_rng(seed)
    leaves = rng.integers(0, 2**64, size=(n, width), dtype=np.uint64)
    ids = [f"c{i:05d}" for i in range(n)]
    label = b"bench/round 3/estep"
    t = time.process_time()
    tree = SumTree(label, ids, leaves)
    server = time.process_time() - t
    model = registry.model_from_config("gmm", {"n_components": 3})
    params = {**{k: np.asarray(v) for k, v in est._fitted_params().items()},
              "center": np.zeros(4)}
    S = Stats({"nk": np.full(3, 1 / 3), "sx": np.zeros((3, 4)),
               "sxx": np.tile(np.eye(4), (3, 1, 1)) / 3})
    state = FedEMState(S, S.zeros_like())
    site, extra = [], []
    for i in range(n):
        t = time.process_time()
        path = tree.path(i)  # (the server's, but cheap: counted against us)
        verify_leaf(label, i, n, ids[i], leaves[i], tree.A, tree.c, tree.root, path)
        _, want = replay(model, state, S.zeros_like(), params, 1.0, init_round=False,
                         gamma=1.0, p=0.7, alpha=1.0, use_cv=True)
        assert params_refusal(want, want, 3, ids[i]) is None
        site.append(time.process_time() - t)
        # the path, the aggregate (8 bytes a word), its carries (< n: 2 bytes), the digest
        extra.append(len(path[0]) + 8 * path[1].size + 10 * width + 32)
    return server, float(np.median(site)), float(np.median(extra))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    with blas_limit(1):
        fd = data(a.clients)
        cpu, down, est = secure_round(fd, a.rounds)
        width = 66  # the masked reply's words (d = 4, K = 3 full: statistics, n, objective)
        server, site, extra = verified_checks(est, int(0.7 * a.clients), width)
    print(f"clients {a.clients}, survivors {int(0.7 * a.clients)}, leaf width {width} words, "
          f"{PROJECTIONS} projections (machine shared; ratios within this run)")
    print(f"unverified secure round, per site:  CPU {cpu * 1e3:8.3f} ms   bytes down "
          f"{down:9.0f}")
    print(f"verification added, per site:       CPU {site * 1e3:8.3f} ms   bytes down "
          f"{extra:9.0f}")
    print(f"verified / unverified:              CPU {(cpu + site) / cpu:8.3f} x   bytes down "
          f"{(down + extra) / down:8.3f} x")
    print(f"server: building the tree once      CPU {server * 1e3:8.3f} ms")


if __name__ == "__main__":
    main()
