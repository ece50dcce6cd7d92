"""HLCR's two solvers, both run from the estimator's ``_run`` hook and both returning the
engine's :class:`~fedlatent.engine.rounds.loop.FitResult` (with HLCR's extras, :class:`HLCRFit`).

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
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ...data.dataset import FederatedDataset
from ...engine.contract.model import Params
from ...engine.estimation.estimator import FitContext
from ...engine.fedem.history import History, RoundRecord
from ...engine.protocol.messages import unpack
from ...engine.protocol.runtime import Runtime
from ...engine.rounds.loop import FitResult, LoopOptions, progress_bar
from ...engine.stats import Stats
from .math import cluster_statistics, entity_sse, hlcr_log_joint, posterior_means
from .model import _num
from .random_intercept import adjust_statistics, intercept_second_moment, log_det_correction
from .sampler import gibbs_init, gibbs_sweep
from .scaling import draw_hyper

__all__ = ["ChainSettings", "HLCRFit", "RoundTap", "chain_diagnostic", "entity_pairs",
           "run_federated", "run_gibbs"]


@dataclass(frozen=True)
class ChainSettings:
    """What both solvers need beyond the engine's options: the retained draws are the
    iterations ``t > burn_in`` with ``(t - burn_in - 1) % thin == 0``; ``sigma``, ``delta`` are
    the (starting) values in the units the sampler works in."""

    burn_in: int
    thin: int
    sigma: float
    delta: float
    estimate_sigma: bool = False
    estimate_delta: bool = False
    tau: float = float("nan")
    estimate_tau: bool = False

    def keep(self, t: int) -> bool:
        return t > self.burn_in and (t - self.burn_in - 1) % self.thin == 0


def chain_diagnostic(XtX, Xty, yty, n, draws, sd_y: float):
    """How much the posterior predictive mean of the training events still moves.

    Parameters
    ----------
    XtX, Xty, yty, n : entity statistics (fit units), shapes (E, F, F), (E, F), (E,), (E,)
    draws : list of dict with ``D`` (K, F, F), ``c`` (K, F), ``labels`` (E,)
    sd_y : float
        Standard deviation of the training targets (fit units).

    Returns
    -------
    change : ndarray of shape (n_draws,)
        RMS over the events of the change of the running Rao-Blackwellized predictive mean when
        draw t is added, over ``sd_y`` (NaN for the first draw).
    split : float
        RMS difference between the predictive means of the first and the second half of the
        draws, over ``sd_y`` (NaN with fewer than 2 draws or unknown labels).
    """
    T = len(draws)
    if T == 0 or any(d["labels"] is None or (np.asarray(d["labels"]) < 0).any()
                     for d in draws):
        return np.full(T, np.nan), float("nan")
    W = np.stack([posterior_means(d["D"], d["c"])[np.asarray(d["labels"])] for d in draws])
    run = np.cumsum(W, axis=0) / np.arange(1, T + 1)[:, None, None]
    N = float(n.sum())

    def rms(diff):  # diff (..., E, F): sqrt(sum_e d^T XtX_e d / N) / sd_y
        return np.sqrt(np.maximum(np.einsum("...ef,efg,...eg->...", diff, XtX, diff), 0.0)
                       / N) / sd_y

    change = np.r_[np.nan, rms(np.diff(run, axis=0))] if T > 1 else np.full(1, np.nan)
    split = float(rms(W[: T // 2].mean(0) - W[T // 2:].mean(0))) if T >= 2 else float("nan")
    return change, split

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
    draws: list[dict[str, Any]] = field(default_factory=list)
    sigma: float = float("nan")
    delta: float = float("nan")
    tau: float = float("nan")
    random_effects: np.ndarray | None = None
    random_effects_var: np.ndarray | None = None


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
    return {"D": params["D"], "c": params["c"], "counts": params["counts"], "labels": lab,
            "sigma": params.get("sigma"), "delta": params.get("delta"),
            "tau": params.get("tau")}


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
        one = getattr(self.inner, "client_state", None)  # the labels only, where it can
        states = None if one is not None else self.inner.get_client_states()
        labels = one("model/labels") if one is not None else None
        if states is not None:
            labels = {c: np.array(st["model/labels"]) for c, st in states.items()
                      if "model/labels" in st}
        entry = {"params": {k: np.array(v) for k, v in params.items()}, "labels": labels}
        # rounds in which no agent took part leave the statistic, hence the params, unchanged
        for r in range(first, last + 1):
            self.path[r] = entry

    def _before_estep(self, msg) -> None:
        rnd = int(msg["round"])
        if self._last_round:
            self._snapshot(unpack(msg, "params"), self._last_round, rnd - 1)
        self._last_round = rnd

    def call(self, client_ids, method, messages):
        if method == "estep" and messages:
            self._before_estep(next(iter(messages.values())))
        return self.inner.call(client_ids, method, messages)

    def batched(self, model):
        """The inner runtime's batched client step (the in-process agents step together,
        :mod:`.batched`), tapped as the calls one by one are; None without one."""
        inner = getattr(self.inner, "batched", None)
        return None if inner is None or inner(model) is None else self

    def call_batched(self, method, idx, msg, resets=None):
        if method == "estep":
            self._before_estep(msg)
        return self.inner.call_batched(method, idx, msg, resets)

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
    chain: ChainSettings | None = None,
) -> HLCRFit:
    """FedHLCR: ``round_loop`` (the base estimator's ``_run``, the engine's round loop) over
    ``ctx.runtime`` wrapped in a :class:`RoundTap`. With ``options.tol == 0`` every round runs
    and the engine's objective-based ConvergenceWarning does not apply (the estimator judges
    the chain by :func:`chain_diagnostic`)."""
    tap = RoundTap(ctx.runtime)
    with warnings.catch_warnings():
        if options.tol == 0:
            from ...engine.errors import ConvergenceWarning

            warnings.simplefilter("ignore", ConvergenceWarning)
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
    rounds = sorted(tap.path)
    draws = []
    if chain is not None:
        draws = [p for r, p in zip(rounds, path) if chain.keep(r)]
        if not draws and path:  # stopped by tol before burn_in ended: the last round only
            logger.warning("hlcr: the fit stopped at round %d, before burn_in=%d ended; the "
                           "predictive uses the last round only (set tol=0 to run every "
                           "round)", rounds[-1], chain.burn_in)
            draws = [path[-1]]
    objective = {r.round: r.objective for r in result.history}
    for r, entry in zip(rounds, path):  # label-invariant summaries of every draw
        entry["log_joint"] = objective.get(r, np.nan)
        entry["train_mse"] = float(tap.path[r]["params"]["train_mse"])
    p = result.params
    return HLCRFit(result.params, result.S_hat, result.history, result.converged,
                   result.n_rounds, labels=labels, pair_agents=agents, pair_entities=ents,
                   path=path,
                   log_joint=np.array([r.objective for r in result.history], dtype=float),
                   train_mse=np.array(train_mse, dtype=float), draws=draws,
                   sigma=_num(p.get("sigma", np.nan)), delta=_num(p.get("delta", np.nan)),
                   tau=_num(p.get("tau", np.nan)))


# ---- the centralized Gibbs sampler ------------------------------------------------------------
def intercept_step(state: dict, K: int, sigma: float, delta: float, tau: float,
                   estimate: bool) -> float:
    """The random intercept's part of a sweep (:mod:`.random_intercept`): with ``estimate``,
    the EM-style ``tau^2 = mean_e E[u_e^2 | y_e]`` at the clusters' posterior means; then the
    entities' statistics adjusted at ``rho = tau^2 / sigma^2`` and the cluster statistics
    rebuilt from them (in place in ``state``). Returns tau."""
    from .model import TAU2_FLOOR

    XtX, Xty, yty = state["raw"]
    n, z = state["n"], state["z"]
    if estimate:
        W = posterior_means(state["D"], state["c"])[z]
        m2 = intercept_second_moment(XtX, Xty, n, W, (tau / sigma) ** 2, sigma)
        tau = float(np.sqrt(max(float(m2.mean()), TAU2_FLOOR)))
    adj = adjust_statistics(XtX, Xty, yty, n, (tau / sigma) ** 2)
    state["XtX"][...], state["Xty"][...], state["yty"][...] = adj
    cl = cluster_statistics(*adj, n, z, K, delta, sigma)
    state["D"][...], state["c"][...], state["Y"][...] = cl["D"], cl["c"], cl["yty"]
    return tau


def _redraw_hyper(state, K: int, sigma: float, delta: float, rng, chain: ChainSettings):
    """Redraw sigma and delta after a sweep from the clusters' pooled entity statistics, and
    rebuild the cluster statistics for them; returns the new (sigma, delta)."""
    onehot = np.eye(K)[state["z"]]
    sums = (np.einsum("ek,eij->kij", onehot, state["XtX"]),
            onehot.T @ state["Xty"], onehot.T @ state["yty"])
    sigma, delta = draw_hyper(*sums, float(state["n"].sum()), sigma, delta, rng,
                              chain.estimate_sigma, chain.estimate_delta)
    F = sums[1].shape[1]
    state["D"][...] = np.eye(F)[None] / delta**2 + sums[0] / sigma**2
    state["c"][...] = sums[1] / sigma**2
    return sigma, delta


def _sweep_entry(state, est, sigma: float, delta: float, tau: float | None) -> dict:
    """One sweep's draw: the cluster statistics, labels and scales, with the label-invariant
    summaries (mean per-entity log joint, training MSE) the chains are judged by."""
    D, c, Nk, n, z = state["D"], state["c"], state["Nk"], state["n"], state["z"]
    cur = {"D": D, "c": c, "yty": state["Y"], "n_events": state["Nev"], "n_entities": Nk}
    lj = (hlcr_log_joint(cur, state["Nik"], est.alpha, est.beta, delta, sigma)
          + (0.0 if tau is None else log_det_correction(n, (tau / sigma) ** 2))) / len(n)
    W = posterior_means(D, c)
    mse = float(entity_sse(state["XtX"], state["Xty"], state["yty"], W, z).sum() / n.sum())
    return {"D": D.copy(), "c": c.copy(), "counts": Nk.copy(), "labels": z.copy(),
            "sigma": sigma, "delta": delta, "tau": tau, "log_joint": lj, "train_mse": mse}


def run_gibbs(est, ctx: FitContext, options: LoopOptions, params0: Params,
              chain: ChainSettings) -> HLCRFit:
    """Algorithm 2 on the pooled in-process data ``ctx.data``: ``options.max_rounds`` sweeps
    (with ``options.tol > 0``, the old rule: stop after ``burn_in`` once the mean per-entity log
    joint changes by less than ``tol``).

    ``est`` gives ``n_clusters``, ``alpha``, ``beta``; ``chain`` the burn-in, thinning and
    (starting) ``sigma``, ``delta``. When estimated, sigma and delta are redrawn after every
    sweep (:func:`~fedlatent.models.hlcr.scaling.draw_hyper`) and the cluster statistics
    rebuilt for them. The labels are the most frequent ones over the retained sweeps, with
    their cluster statistics at the retained draws' mean sigma^2 and delta^2.
    """
    if options.checkpoint is not None or options.resume or options.callbacks:
        raise ValueError("solver='gibbs' pools the data: checkpoint, resume and callbacks "
                         "apply to solver='federated' only")
    fd = ctx.data
    rng = np.random.default_rng(ctx.seed)
    K = int(ctx.model.K)
    stats = [ctx.model._fit_stats(cd, params0) for _, cd in fd.items()]
    sigma, delta = chain.sigma, chain.delta
    estimate = chain.estimate_sigma or chain.estimate_delta
    state = gibbs_init(stats, K, delta, sigma, rng)
    tau = ctx.model.tau_of(params0) if ctx.model.random_intercept else None
    if tau is not None:
        raw = [ctx.model._plain_stats(cd, params0) for _, cd in fd.items()]
        state["raw"] = tuple(np.concatenate([p[i] for p in raw]) for i in range(3))
    n, z, A = state["n"], state["z"], len(stats)
    history = History()
    lj, mses, path, draws = [], [], [], []
    freq = np.zeros((len(n), K))
    converged = False
    bar = progress_bar(options.max_rounds, options.progress, options.description)
    try:
        for t in range(1, int(options.max_rounds) + 1):
            t0 = time.perf_counter()
            changed = gibbs_sweep(state, est.alpha, est.beta, sigma, rng.random(len(n)))
            if estimate:
                sigma, delta = _redraw_hyper(state, K, sigma, delta, rng, chain)
            if tau is not None:
                tau = intercept_step(state, K, sigma, delta, tau, chain.estimate_tau)
            entry = _sweep_entry(state, est, sigma, delta, tau)
            lj.append(entry["log_joint"])
            mses.append(entry["train_mse"])
            path.append(entry)
            if chain.keep(t):
                freq[np.arange(len(z)), z] += 1.0
                draws.append(entry)
            history.append(RoundRecord(round=t, objective=lj[-1], h_norm2=None,
                                       bytes_up=0, bytes_down=0, participants=A, step_size=1.0,
                                       seconds=time.perf_counter() - t0))
            bar.update(1)
            logger.debug("hlcr gibbs sweep %d: %d labels changed", t, changed)
            if (options.tol > 0 and t > chain.burn_in + 1
                    and abs(lj[-1] - lj[-2]) < options.tol):
                converged = True
                break
    finally:
        bar.close()
    if not draws:  # only when max_rounds <= burn_in, which the estimator refuses
        draws, freq[np.arange(len(z)), z] = [path[-1]], 1.0
    z = freq.argmax(axis=1).astype(np.int64)
    if estimate:
        sigma = float(np.sqrt(np.mean([d["sigma"] ** 2 for d in draws])))
        delta = float(np.sqrt(np.mean([d["delta"] ** 2 for d in draws])))
    ent = (state["XtX"], state["Xty"], state["yty"])
    if tau is not None:
        tau = float(np.sqrt(np.mean([d["tau"] ** 2 for d in draws])))
        ent = adjust_statistics(*state["raw"], n, (tau / sigma) ** 2)
    cl = cluster_statistics(*ent, n, z, K, delta, sigma)
    agents, ents = entity_pairs(fd)
    params = {"D": cl["D"], "c": cl["c"], "counts": cl["n_entities"]}
    return HLCRFit(params, Stats(cl), history, converged, len(history), labels=z.copy(),
                   pair_agents=agents, pair_entities=ents, path=path, log_joint=np.array(lj),
                   train_mse=np.array(mses), draws=draws, sigma=sigma, delta=delta,
                   tau=float("nan") if tau is None else tau)
