"""FedHLCR's batched agent step: Algorithm 3's step of every in-process agent in one pass.

The in-process runtime (:mod:`fedlatent.engine.node.batched`) holds the agents a node runs; for
HLCR it asks the model to stack their entities once (:class:`AgentBatch`: the entity statistics
of all agents concatenated, agent ``a``'s entities at rows ``offs[a]:offs[a+1]``) and then,
every round, :func:`agents_step` computes what :meth:`HLCRModel.client_stats
<fedlatent.models.hlcr.model.HLCRModel.client_stats>` computes for each agent:

1. the entities' marginal likelihoods against the broadcast clusters (one compiled call over
   the entities of all the round's agents: each entity's numbers are those of its agent's own
   call);
2. each agent's labels, drawn in turn with its own counts and the broadcast ones
   (:func:`sample_agents_kernel` runs the agents' own kernel,
   :func:`~fedlatent.models.hlcr.kernels.sample_local_kernel`, agent after agent), from the
   uniforms of the agent's own generator: the same draws, in the same order;
3. the per-cluster sums of every agent (:func:`agent_cluster_sums`, one compiled pass), the
   blocks over too few events suppressed as the agent's node suppresses them.

No Python runs per agent: the uniforms of all the agents' generators are drawn in one compiled
pass too (:func:`~fedlatent.engine.fedem.pcg.client_uniforms`, NumPy's numbers bit for bit).
The sums are added in entity order, where an agent alone uses NumPy's products: the two differ
by rounding only (the labels drawn are the same).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...engine.node.batched import BatchStep
from .kernels import sample_local_kernel
from .math import entity_log_marginal, entity_sse
from .random_intercept import adjust_statistics, intercept_second_moment
from .scaling import transform_statistics

__all__ = ["AgentBatch", "agent_cluster_sums", "agents_step", "hlcr_suspects",
           "sample_agents_kernel"]


@njit(cache=True)
def sample_agents_kernel(loglik, z, offs, Nk, alpha, beta, uniforms, logprior):
    """The labels of every agent's entities (agent ``a``: rows ``offs[a]:offs[a+1]``), each
    agent's drawn by :func:`~fedlatent.models.hlcr.kernels.sample_local_kernel` as the agent
    itself draws them (in place in ``z`` and ``logprior``)."""
    for a in range(offs.shape[0] - 1):
        lo, hi = offs[a], offs[a + 1]
        sample_local_kernel(loglik[lo:hi], z[lo:hi], np.arange(hi - lo), Nk, alpha, beta,
                            uniforms[lo:hi], logprior[lo:hi])
    return z


@njit(cache=True)
def agent_cluster_sums(XtX, Xty, vals, z, offs, K):
    """Per agent and cluster, the sums over the agent's entities labelled k of ``XtX`` (E, F,
    F), ``Xty`` (E, F) and the columns of ``vals`` (E, m), in entity order; shapes (A, K, F,
    F), (A, K, F), (A, K, m)."""
    A, F, m = offs.shape[0] - 1, XtX.shape[1], vals.shape[1]
    SXX = np.zeros((A, K, F, F))
    SXy = np.zeros((A, K, F))
    SV = np.zeros((A, K, m))
    for a in range(A):
        for e in range(offs[a], offs[a + 1]):
            k = z[e]
            for i in range(F):
                SXy[a, k, i] += Xty[e, i]
                for j in range(F):
                    SXX[a, k, i, j] += XtX[e, i, j]
            for j in range(m):
                SV[a, k, j] += vals[e, j]
    return SXX, SXy, SV


def _num(v) -> float:
    """A scalar parameter as a float (as :mod:`.model` reads it)."""
    return float(np.asarray(v, dtype=np.float64).reshape(-1)[0])


class AgentBatch:
    """The entity statistics of many agents, concatenated (batch order).

    Parameters
    ----------
    model : HLCRModel
    datas : list of ClientData
        The agents' events (their training events, with a holdout).

    Attributes
    ----------
    offs : ndarray of int, shape (A + 1,)
        Agent ``a``'s entities are rows ``offs[a]:offs[a+1]`` of the statistics.
    plain : tuple of XtX (E, F, F), Xty (E, F), yty (E,), n (E,)
        The entities' statistics in the user's units (the agents' cached ones).
    """

    def __init__(self, model, datas):
        parts = [model._entity_stats(cd)[1:] for cd in datas]
        sizes = np.array([len(p[3]) for p in parts], dtype=np.int64)
        self.offs = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.plain = tuple(np.ascontiguousarray(np.concatenate([p[i] for p in parts]))
                           for i in range(4))
        self._tcache = self._rcache = None

    def plain_stats(self, params):
        """The statistics in the fit's units (standardized when ``params`` carry ``T``), as
        :meth:`HLCRModel._plain_stats` makes them for one agent."""
        if "T" not in params:
            return self.plain
        key = (np.asarray(params["T"]).tobytes(), _num(params["y_shift"]),
               _num(params["y_scale"]))
        if self._tcache is None or self._tcache[0] != key:
            XtX, Xty, yty, n = self.plain
            t = transform_statistics(XtX, Xty, yty, n, np.asarray(params["T"]),
                                     _num(params["y_shift"]), _num(params["y_scale"]))
            self._tcache = (key, tuple(np.ascontiguousarray(v) for v in (*t, n)))
        return self._tcache[1]

    def fit_stats(self, model, params):
        """The statistics the sampler uses (:meth:`HLCRModel._fit_stats`)."""
        XtX, Xty, yty, n = self.plain_stats(params)
        if not model.random_intercept:
            return XtX, Xty, yty, n
        rho = model.rho_of(params)
        if self._rcache is None or self._rcache[0] is not XtX or self._rcache[1] != rho:
            self._rcache = (XtX, rho, (*adjust_statistics(XtX, Xty, yty, n, rho), n))
        return self._rcache[2]

    def rows_of(self, idx: np.ndarray) -> tuple[np.ndarray | slice, np.ndarray]:
        """The entity rows of the agents ``idx`` (ascending) and their offsets among them."""
        lo, hi = self.offs[idx], self.offs[idx + 1]
        offs = np.concatenate([[0], np.cumsum(hi - lo)]).astype(np.int64)
        if idx.size == len(self.offs) - 1:
            return slice(None), offs
        start = np.repeat(lo - offs[:-1], hi - lo)
        return start + np.arange(offs[-1]), offs


def _labels_in(state, idx: np.ndarray, offs: np.ndarray) -> np.ndarray:
    """The agents' current labels concatenated (-1: not yet drawn)."""
    lab = state.get("labels")
    if lab is None:
        return np.full(offs[-1], -1, dtype=np.int64)
    return np.concatenate([np.asarray(v, dtype=np.int64).reshape(-1) for v in lab]) \
        if len(lab) else np.zeros(0, dtype=np.int64)


def _uniforms(rngs, offs: np.ndarray) -> np.ndarray:
    """Each agent's uniforms, one per entity, from its own generator (its step's only draw):
    all at once where the generators offer it (the same numbers), else agent by agent."""
    if hasattr(rngs, "uniforms"):
        return rngs.uniforms(np.diff(offs))
    u = np.empty(offs[-1])
    for i in range(len(offs) - 1):
        if offs[i + 1] > offs[i]:
            rngs[i].random(out=u[offs[i]:offs[i + 1]])
    return u


def _suppress(stats: dict[str, np.ndarray], policy) -> None:
    """Every agent's cluster blocks over ``0 < n_events < min_records_per_block`` events set
    to zero, in place (:func:`~fedlatent.engine.privacy.enforce.suppress_blocks`, per agent)."""
    if policy.count_scope != "client":
        return
    ev = stats["n_events"]
    small = (ev > 0) & (ev < policy.min_records_per_block)
    if small.any():
        for v in stats.values():
            v[small] = 0.0


def differencing_applies(policy, n_events: np.ndarray) -> bool:
    """Whether an agent's differencing rule (:func:`~fedlatent.engine.privacy.enforce.
    suppress_differences`, kept per agent over the rounds) can act: some entity holds fewer
    than ``min_records_per_block`` events, under a client-scoped policy."""
    if policy.is_off or policy.count_scope != "client":
        return False
    n = np.asarray(n_events, dtype=np.float64)
    return bool(np.any((n > 0) & (n < policy.min_records_per_block)))


def agents_step(model, params, batch: AgentBatch, idx: np.ndarray, state, rngs,
                policy) -> BatchStep | None:
    """:meth:`HLCRModel.client_stats` (every entity) of the agents ``idx`` of ``batch``, at
    once (module docstring); None under differential privacy (agents step one by one)."""
    if model.dp_max_events is not None:
        return None
    XtX, Xty, yty, n = batch.fit_stats(model, params)
    rows, offs = batch.rows_of(np.asarray(idx, dtype=np.int64))
    XtX, Xty, yty, n = (v[rows] for v in (XtX, Xty, yty, n))
    loglik = entity_log_marginal(XtX, Xty, yty, n, params["D"], params["c"],
                                 model.sigma_of(params))
    z = _labels_in(state, idx, offs)
    logprior = np.empty(len(z))
    sample_agents_kernel(loglik, z, offs, np.asarray(params["counts"], np.float64),
                         float(model.alpha), float(model.beta), _uniforms(rngs, offs), logprior)
    cols = [yty, n, np.ones(len(n)), entity_sse(XtX, Xty, yty, params["coef"], z)]
    if model.random_intercept:
        pX, pXy, _, pn = (v[rows] for v in batch.plain_stats(params))
        W = np.asarray(params["coef"], dtype=np.float64)[z]
        cols.append(intercept_second_moment(pX, pXy, pn, W, model.rho_of(params),
                                            model.sigma_of(params)))
    SXX, SXy, SV = agent_cluster_sums(XtX, Xty, np.ascontiguousarray(np.stack(cols, axis=1)),
                                      z, offs, model.K)
    stats = {"XtX": SXX, "Xty": SXy, "yty": SV[:, :, 0], "n_events": SV[:, :, 1],
             "n_entities": SV[:, :, 2], "sse": SV[:, :, 3]}
    if model.random_intercept:
        stats["u2"] = SV[:, :, 4]
    stats = {k: np.ascontiguousarray(v) for k, v in stats.items()}
    _suppress(stats, policy)
    sizes = np.diff(offs)
    objective = np.zeros(len(sizes))
    has = np.flatnonzero(sizes > 0)  # (reduceat of an empty segment is not 0)
    if has.size:
        objective[has] = (np.add.reduceat(loglik[np.arange(len(z)), z], offs[has])
                          + np.add.reduceat(logprior, offs[has]))
        if model.random_intercept:  # what the adjusted statistics leave out (as one by one)
            ld = -0.5 * np.log1p(np.asarray(n, dtype=np.float64) * float(model.rho_of(params)))
            objective[has] += np.add.reduceat(ld, offs[has])
    labels = np.empty(len(sizes), dtype=object)
    for i in range(len(sizes)):  # views of this round's labels (the engine copies them out)
        labels[i] = z[offs[i]:offs[i + 1]]
    return BatchStep(stats, sizes.astype(np.float64), objective, {"labels": labels})


def hlcr_suspects(model, stats: dict[str, np.ndarray], n_units: np.ndarray,
                  slack=None) -> np.ndarray:
    """:meth:`HLCRModel.check` of many agents at once: True where an agent's statistics
    (blocks stacked, (C, K, ...)) may break an invariant (each test as ``check`` makes it,
    with tolerances a hair tighter, so that every row ``check`` refuses is flagged; the engine
    then asks ``check`` about the flagged rows). ``slack`` as in ``check_many``."""
    from ...engine.protocol.messages import bordered, psd_failures

    n = np.asarray(n_units, dtype=np.float64)
    C = n.shape[0]
    if C == 0:
        return np.zeros(0, dtype=bool)
    sl = None if slack is None else {k: np.abs(v) for k, v in slack(np.arange(C)).items()}

    def e(k):
        return 0.0 if sl is None else sl[k]

    hair = 1.0 - 1e-9
    ent, ev, XtX = stats["n_entities"], stats["n_events"], stats["XtX"]
    tol = (1e-8 * np.maximum(n, 1.0) * hair)[:, None]
    bad = ((ent < -(e("n_entities") + tol) * hair)
           | (ent > n[:, None] + (e("n_entities") + tol) * hair)
           | (ev + tol < ent - (e("n_events") + e("n_entities")) * hair)).any(axis=1)
    ii = XtX[:, :, -1, -1]
    if model.random_intercept:
        s = 0.0 if sl is None else sl["XtX"][:, :, -1, -1] + sl["n_events"]
        bad |= ((ii < -(tol + s) * hair) | (ii > ev + (tol + s) * hair)).any(axis=1)
    elif model.fit_intercept:
        s = 0.0 if sl is None else sl["XtX"][:, :, -1, -1] + sl["n_events"]
        bad |= (np.abs(ii - ev) > (1e-8 * np.maximum(np.abs(ii), np.abs(ev)) + 1e-8 + s)
                * hair).any(axis=1)
    for name in ("sse", "u2") if model.random_intercept else ("sse",):
        v = stats[name]
        big = np.abs(v).max(axis=1, initial=0.0)[:, None]
        bad |= (v < -(1e-8 * big + e(name)) * hair).any(axis=1)
    K, F = XtX.shape[1], XtX.shape[2]
    M = bordered(XtX.reshape(C * K, F, F), stats["Xty"].reshape(C * K, F),
                 stats["yty"].reshape(C * K))
    E = None if sl is None else bordered(sl["XtX"].reshape(C * K, F, F),
                                         sl["Xty"].reshape(C * K, F), sl["yty"].reshape(C * K))
    bad[psd_failures(M, None if E is None else E * hair) // K] = True
    return bad

