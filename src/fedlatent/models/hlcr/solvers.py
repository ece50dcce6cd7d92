"""HLCR's two solvers, both run from the estimator's ``_run`` hook and both returning the
engine's :class:`~fedlatent.engine.loop.FitResult` (with HLCR's extras, :class:`HLCRFit`).

``solver="federated"``
    FedHLCR (Algorithm 3) is the engine's round loop; :func:`run_federated` only wraps the
    runtime in a :class:`RoundTap` that records, server side, the parameters of every round
    (the path ``staged_predict`` replays) and, where the runtime can see them (in-process), the
    agents' labels after the fit.
``solver="gibbs"``
    Algorithm 2, the exact collapsed Gibbs sampler on the pooled data (a reference for
    research): :func:`run_gibbs` sweeps all agents and entities with one numba kernel. It
    reads the in-process data on purpose and refuses to run anywhere else.

References
----------
Yang, Carette, Jimbo, Maruyama. "Federated Latent Class Regression for Hierarchical Data"
(2022): Algorithms 2 and 3.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...data.dataset import FederatedDataset
from ...engine.estimator import FitContext
from ...engine.history import History, RoundRecord
from ...engine.loop import FitResult, LoopOptions, progress_bar
from ...engine.messages import unpack
from ...engine.model import Params
from ...engine.runtime import Runtime
from ...engine.stats import Stats
from .math import cluster_statistics, entity_sse, hlcr_log_joint, posterior_means
from .sampler import gibbs_init, gibbs_sweep

__all__ = ["HLCRFit", "RoundTap", "entity_pairs", "run_federated", "run_gibbs"]

logger = logging.getLogger(__name__)


@dataclass
class HLCRFit(FitResult):
    """The engine's result plus what HLCR keeps of a fit.

    Attributes
    ----------
    labels : ndarray of int, shape (n_pairs,)
        Final label of every known (agent, entity) pair (-1 where the runtime cannot see the
        agents' states).
    pair_agents, pair_entities : ndarrays of str, shape (n_pairs,)
        The pairs, agents in client order and each agent's entities sorted.
    path : list of dict
        ``D``, ``c``, ``counts`` and ``labels`` (None when unknown) after every iteration.
    log_joint, train_mse : ndarrays of shape (n_rounds,)
        Per iteration (NaN where unknown, e.g. rounds run before a resume).
    """

    labels: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    pair_agents: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=str))
    pair_entities: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=str))
    path: list[dict[str, Any]] = field(default_factory=list)
    log_joint: np.ndarray = field(default_factory=lambda: np.zeros(0))
    train_mse: np.ndarray = field(default_factory=lambda: np.zeros(0))


def entity_pairs(fd: FederatedDataset | None) -> tuple[np.ndarray, np.ndarray]:
    """The (agent, entity) pairs of in-process data, in the order of the agents' labels; empty
    for a RemoteDataset (entity ids stay with their agents)."""
    if fd is None or getattr(fd, "is_remote", False):
        return np.array([], dtype=str), np.array([], dtype=str)
    agents, ents = [], []
    for cid, cd in fd.items():
        names = np.unique(np.asarray(cd.entity).astype(str))
        agents.append(np.full(len(names), cid, dtype=object))
        ents.append(names)
    return np.concatenate(agents).astype(str), np.concatenate(ents).astype(str)


def _path_entry(params: Params, labels: dict[str, np.ndarray] | None) -> dict[str, Any]:
    lab = None
    if labels is not None:
        lab = np.concatenate([labels[c] for c in sorted(labels)])
    return {"D": params["D"], "c": params["c"], "counts": params["counts"], "labels": lab}


# ---- the federated solver ---------------------------------------------------------------------
class RoundTap(Runtime):
    """Wraps a runtime to record, server side, the parameters of every round and (in-process
    simulations only) the agents' labels after it: the path ``staged_predict`` replays."""

    def __init__(self, inner: Runtime):
        self.inner = inner
        self.path: dict[int, dict[str, Any]] = {}  # round -> params after it, labels
        self._last_round = 0  # the last round whose E-step was sent

    @property
    def client_ids(self):
        return self.inner.client_ids

    def _snapshot(self, params, first: int, last: int):
        states = self.inner.get_client_states()
        labels = None
        if states is not None:
            labels = {c: np.array(st["model/labels"]) for c, st in states.items()
                      if "model/labels" in st}
        entry = {"params": {k: np.array(v) for k, v in params.items()}, "labels": labels}
        # rounds in which no agent took part leave the statistic, hence the params, unchanged
        for r in range(first, last + 1):
            self.path[r] = entry

    def call(self, client_ids, method, messages):
        if method == "estep" and messages:
            msg = next(iter(messages.values()))
            rnd = int(msg["round"])
            if self._last_round:
                self._snapshot(unpack(msg, "params"), self._last_round, rnd - 1)
            self._last_round = rnd
        return self.inner.call(client_ids, method, messages)

    def finish(self, params, n_rounds: int):
        if self._last_round:
            self._snapshot(params, self._last_round, n_rounds)

    def get_client_states(self):
        return self.inner.get_client_states()

    def set_client_states(self, states):
        self.inner.set_client_states(states)


def run_federated(
    ctx: FitContext,
    params0: Params,
    options: LoopOptions,
    round_loop: Callable[[FitContext, Params, LoopOptions], FitResult],
) -> HLCRFit:
    """FedHLCR: ``round_loop`` (the base estimator's ``_run``, the engine's round loop) over
    ``ctx.runtime`` wrapped in a :class:`RoundTap`."""
    tap = RoundTap(ctx.runtime)
    result = round_loop(replace(ctx, runtime=tap), params0, options)
    tap.finish(result.params, result.n_rounds)
    agents, ents = entity_pairs(ctx.data)
    states = tap.get_client_states()
    if states is not None:
        labels = np.concatenate([np.asarray(states[c]["model/labels"], dtype=np.int64)
                                 for c in ctx.client_ids])
    else:
        labels = np.full(len(agents), -1, dtype=np.int64)
    # rounds run before a resume are not in the tap: their training MSE is unknown
    path = [_path_entry(tap.path[r]["params"], tap.path[r]["labels"]) for r in sorted(tap.path)]
    train_mse = [float(tap.path[r.round]["params"]["train_mse"]) if r.round in tap.path
                 else np.nan for r in result.history]
    return HLCRFit(result.params, result.S_hat, result.history, result.converged,
                   result.n_rounds, labels=labels, pair_agents=agents, pair_entities=ents,
                   path=path,
                   log_joint=np.array([r.objective for r in result.history], dtype=float),
                   train_mse=np.array(train_mse, dtype=float))


# ---- the centralized Gibbs sampler ------------------------------------------------------------
def run_gibbs(est, ctx: FitContext, options: LoopOptions) -> HLCRFit:
    """Algorithm 2 on the pooled in-process data ``ctx.data``, ``options.max_rounds`` sweeps at
    most; stops when the mean per-entity log joint changes by less than ``options.tol``.

    ``est`` gives the model's settings (``n_clusters``, ``alpha``, ``beta``, ``delta``,
    ``sigma``, ``burn_in``). With ``burn_in``, the labels are the most frequent ones over the
    sweeps after it, and the cluster statistics are recomputed for them.
    """
    if options.checkpoint is not None or options.resume or options.callbacks:
        raise ValueError("solver='gibbs' pools the data: checkpoint, resume and callbacks "
                         "apply to solver='federated' only")
    fd = ctx.data
    rng = np.random.default_rng(ctx.seed)
    K = int(est.n_clusters)
    stats = [ctx.model._entity_stats(cd) for _, cd in fd.items()]
    state = gibbs_init([s[1:] for s in stats], K, est.delta, est.sigma, rng)
    n, z, A = state["n"], state["z"], len(stats)
    history = History()
    lj, mses, path = [], [], []
    freq = np.zeros((len(n), K))
    converged = False
    bar = progress_bar(options.max_rounds, options.progress, options.description)
    try:
        for t in range(1, int(options.max_rounds) + 1):
            t0 = time.perf_counter()
            changed = gibbs_sweep(state, est.alpha, est.beta, est.sigma, rng.random(len(n)))
            D, c, Nk = state["D"], state["c"], state["Nk"]
            cur = {"D": D, "c": c, "yty": state["Y"], "n_events": state["Nev"],
                   "n_entities": Nk}
            lj.append(hlcr_log_joint(cur, state["Nik"], est.alpha, est.beta, est.delta,
                                     est.sigma) / len(n))
            W = posterior_means(D, c)
            mses.append(float(entity_sse(state["XtX"], state["Xty"], state["yty"], W, z).sum()
                              / n.sum()))
            path.append({"D": D.copy(), "c": c.copy(), "counts": Nk.copy(), "labels": z.copy()})
            if est.burn_in is not None and t > est.burn_in:
                freq[np.arange(len(z)), z] += 1.0
            history.append(RoundRecord(round=t, objective=lj[-1], h_norm2=None,
                                       bytes_up=0, bytes_down=0, participants=A, step_size=1.0,
                                       seconds=time.perf_counter() - t0))
            bar.update(1)
            logger.debug("hlcr gibbs sweep %d: %d labels changed", t, changed)
            if len(history) >= 2 and abs(lj[-1] - lj[-2]) < options.tol:
                converged = True
                break
    finally:
        bar.close()
    cl = {"D": state["D"], "c": state["c"], "yty": state["Y"], "n_events": state["Nev"],
          "n_entities": state["Nk"]}
    if est.burn_in is not None and freq.sum() > 0:
        z = freq.argmax(axis=1).astype(np.int64)
        cl = cluster_statistics(state["XtX"], state["Xty"], state["yty"], n, z, K,
                                est.delta, est.sigma)
    agents, ents = entity_pairs(fd)
    params = {"D": cl["D"], "c": cl["c"], "counts": cl["n_entities"]}
    return HLCRFit(params, Stats(cl), history, converged, len(history), labels=z.copy(),
                   pair_agents=agents, pair_entities=ents, path=path, log_joint=np.array(lj),
                   train_mse=np.array(mses))
