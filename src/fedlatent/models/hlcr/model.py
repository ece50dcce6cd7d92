"""HLCR on the engine: FedHLCR (Algorithm 3), the model every agent rebuilds by name.

All a client process imports for HLCR: this module, :mod:`.math`, :mod:`.kernels` and the
agent's part of :mod:`.waic` (no scikit-learn, no estimator).

References
----------
Yang, Carette, Jimbo, Maruyama. "Federated Latent Class Regression for Hierarchical Data"
(2022): Algorithm 3, eqs. (1)-(2), Theorem 1.
"""

from __future__ import annotations

import logging

import numpy as np

from ...data.dataset import ClientData
from ...engine.contract.model import (
    ClientStep,
    FederatedModel,
    Params,
    payload_params,
    register_model,
)
from ...engine.contract.params import Integer, Real
from ...engine.protocol.messages import bordered, count_problem, equal_problem, psd_problem
from ...engine.protocol.numerics import add_intercept
from ...engine.stats import Stats
from .kernels import entity_sums
from .math import (
    entity_log_marginal,
    entity_sse,
    entity_statistics,
    posterior_means,
    project_gram_psd,
)
from .privacy import (
    DP_SIGMA_FLOOR,
    dp_clip_events,
    hlcr_query_sensitivity,
    hlcr_sensitivity,
    private_moments,
    sse_from_sums,
)
from .random_intercept import adjust_statistics, intercept_second_moment, log_det_correction
from .sampler import sample_local_labels, sample_public_prior_labels
from .scaling import draw_hyper, transform_statistics
from .waic import WAIC_PAIRS_QUERY, WAIC_QUERY, entity_waic_pairs, entity_waic_terms

__all__ = ["HELDOUT_QUERY", "MOMENTS_QUERY", "RESTART_QUERY", "SIZES_QUERY", "HLCRModel",
           "holdout_mask"]

logger = logging.getLogger(__name__)

_STAT_NAMES = ("XtX", "Xty", "yty", "n_events", "n_entities", "sse")

#: the initialization query: each agent's entity and event counts and its feature width
SIZES_QUERY = "sizes"
#: sums of x, x^2, y, y^2 and the event count over the agent's (training) events
MOMENTS_QUERY = "moments"
#: the held-out log predictive density of the agent's held-out events and their count
HELDOUT_QUERY = "heldout"
#: forget the labels (a new chain on the same agents, e.g. another K)
RESTART_QUERY = "restart"


#: smallest tau^2 (fit units) of the EM-style update: an entity's intercept never vanishes
#: exactly (at 0 the update would stay there)
TAU2_FLOOR = 1e-8


def _intercept_entry_problem(stats, ev, tol, e) -> str | None:
    """The adjusted intercept entry of a cluster's ``XtX`` lies in ``[0, n_events]``."""
    ii = np.asarray(stats["XtX"])[:, -1, -1]
    slack = 0.0 if e("XtX") is None else np.abs(e("XtX")[:, -1, -1]) + np.abs(e("n_events"))
    bad = (ii < -tol - slack) | (ii > ev + tol + slack)
    if np.any(bad):
        k = int(np.flatnonzero(bad)[0])
        return (f"cluster {k}: the intercept entry of 'XtX' ({ii[k]:.6g}) is outside [0, "
                f"{ev[k]:.6g}] (the event count)")
    return None


def _num(v) -> float:
    """A scalar parameter as a float (a transport may carry it as an array of one value)."""
    return float(np.asarray(v, dtype=np.float64).reshape(-1)[0])


def _last_mse(params) -> float:
    """The broadcast ``train_mse`` when it is finite, else 0: the figure of a round in which
    every agent's blocks were suppressed (no event reported), so the M-step stays finite."""
    v = _num(params.get("train_mse", np.nan))
    return v if np.isfinite(v) else 0.0


def _entity_records(names: np.ndarray, ent, weight: np.ndarray, keep) -> np.ndarray:
    """Events of positive weight of each entity (``names`` order; ``keep``: the training
    events, or None for all): what disclosure control counts."""
    ent = np.asarray(ent).astype(str)
    pos = weight > 0
    if keep is not None:
        pos = pos & keep
    idx = np.searchsorted(names, ent)
    return np.bincount(idx, weights=pos.astype(np.float64), minlength=len(names))


def holdout_mask(entity_index: np.ndarray, y: np.ndarray, fraction: float, seed: int):
    """Events an agent holds out: a ``fraction`` of each entity's events (one fold of
    ``round(1/fraction)``, as :func:`fedlatent.datasets.split_events` makes them), drawn from the
    agent's own data and ``seed`` only; an entity keeps at least one training event.

    Parameters
    ----------
    entity_index : ndarray of int, shape (n,)
    y : ndarray of shape (n,)
    fraction : float in (0, 1)
    seed : int

    Returns
    -------
    ndarray of bool, shape (n,): True for held-out events.
    """
    import zlib

    n = len(entity_index)
    n_folds = max(int(round(1.0 / fraction)), 2)
    key = zlib.crc32(np.ascontiguousarray(y, dtype=np.float64).tobytes())
    rng = np.random.default_rng([int(seed), n, key])
    order = np.lexsort((rng.random(n), entity_index))  # events of each entity, shuffled
    ent = entity_index[order]
    first = np.r_[0, np.flatnonzero(np.diff(ent)) + 1]
    rank = np.arange(n) - np.repeat(first, np.diff(np.r_[first, n]))
    start = rng.integers(n_folds, size=len(first))
    fold = (np.repeat(start, np.diff(np.r_[first, n])) + rank) % n_folds
    size = np.bincount(ent)[ent]
    out = np.zeros(n, dtype=bool)
    out[order] = (fold == 0) & (size >= 2)
    return out


@register_model
class HLCRModel(FederatedModel):
    """FedHLCR on the engine. A unit is an entity; an agent sends per-cluster sums.

    Statistics an agent sends (sums over its entities labelled k): ``XtX`` (K, F, F), ``Xty``
    (K, F), ``yty`` (K,), ``n_events`` (K,), ``n_entities`` (K,), ``sse`` (K,) (squared error
    of the events under the broadcast posterior means, for the training MSE). Labels and the
    agent's counts ``N_i^(k)`` stay in its state (``labels``) and are never sent.

    Parameters sent down: ``D`` (K, F, F), ``c`` (K, F), ``counts`` (K,) (global ``N^(k)``),
    ``coef`` (K, F) posterior means, ``train_mse`` (scalar).

    Differences with Algorithm 3, all documented in the README:

    - The engine aggregates mean statistics and rescales by the participation probability:
      ``S <- S + gamma/p * sum_{c in A} w_c (S_c - S)`` (unbiased for the full-participation
      update). The paper adds the raw sums of the sampled agents, ``S <- (1 - gamma) S + gamma
      sum_{c in A} s_c``, whose fixed point is ``f * S_full`` (a fraction f of the data against
      the same prior). With ``p = 1`` both are ``(1 - gamma) S + gamma S_full``.
    - When ``gamma/p * sum_A w_c > 1`` the engine's update can leave a smoothed ``X^T X`` that
      is not positive semi-definite; the server step then projects it on the PSD cone (and
      counts on [0, inf)) so that ``D_k`` stays a precision. This is logged.
    - Agents sample labels in turn with their own counts ``N_i^(k)`` (the entity itself
      excluded) and the broadcast global counts ``N^(k)``; the entity's data are not removed
      from the broadcast statistics before sampling (as the paper says for FedHLCR).

    ``dp_max_events`` (set by the estimator under ``Federation(privacy=...)`` only): the
    private variant of :mod:`.privacy`: an entity is the unit, with at most that many events;
    labels are drawn under the global prior only, ``sse`` is not sent (the server rebuilds the
    training MSE from the sums), the standardizing moments are centred where the rows were
    clipped.
    """

    name = "hlcr"
    config_constraints = {"n_clusters": [Integer(1)], **dict.fromkeys(
        ("alpha", "beta", "delta", "sigma", "tau"), [Real(0, closed="neither")])}
    #: in-process agents step together (:mod:`.batched`): one pass over their entities
    batched_step = True
    batched_units = True
    acceleration_refusal = ("its round is a Gibbs sweep (random labels), not the EM map, and "
                            "its objective is the joint density at the drawn labels, which may "
                            "go down; extrapolating draws has no fixed point to reach")

    def __init__(self, n_clusters: int, alpha: float, beta: float, delta: float, sigma: float,
                 fit_intercept: bool = True, n_features: int = 1, estimate_sigma: bool = False,
                 estimate_delta: bool = False, standardize: bool = False, holdout: float = 0.0,
                 holdout_seed: int = 0, dp_max_events: int | None = None,
                 random_intercept: bool = False, tau: float = 0.5, estimate_tau: bool = False):
        extra = {}
        if estimate_sigma or estimate_delta or standardize or holdout:  # old configs unchanged
            extra = {"estimate_sigma": bool(estimate_sigma),
                     "estimate_delta": bool(estimate_delta), "standardize": bool(standardize),
                     "holdout": float(holdout), "holdout_seed": int(holdout_seed)}
        if dp_max_events is not None:  # only private fits carry it
            extra["dp_max_events"] = int(dp_max_events)
        if random_intercept:  # only fits with the random intercept carry it
            extra.update(random_intercept=True, tau=float(tau), estimate_tau=bool(estimate_tau))
        super().__init__(n_clusters=int(n_clusters), alpha=float(alpha), beta=float(beta),
                         delta=float(delta), sigma=float(sigma), fit_intercept=bool(fit_intercept),
                         n_features=int(n_features), **extra)
        self.estimate_sigma, self.estimate_delta = bool(estimate_sigma), bool(estimate_delta)
        self.standardize = bool(standardize)
        self.holdout, self.holdout_seed = float(holdout), int(holdout_seed)
        self.K = int(n_clusters)
        self.alpha, self.beta = float(alpha), float(beta)
        self.delta, self.sigma = float(delta), float(sigma)
        self.fit_intercept = bool(fit_intercept)
        self.F = int(n_features) + int(self.fit_intercept)
        self.dp_max_events = None if dp_max_events is None else int(dp_max_events)
        self._records = None  # with frequency weights: each entity's records (client side)
        self.random_intercept = bool(random_intercept)
        self.tau, self.estimate_tau = float(tau), bool(estimate_tau)

    # ---- client side ----------------------------------------------------------------------
    def _entity_stats(self, data: ClientData):
        # an agent's entity statistics do not change between rounds: computed once per data
        cache = getattr(self, "_cache", None)
        if cache is not None and cache[0] is data:
            return cache[1]
        cats = getattr(data.entity, "categories", None)
        ent = data.entity if cats is None else np.asarray(data.entity)
        Xa = add_intercept(data.X, self.fit_intercept)
        fw, train = data.weight, None  # frequency weights of the events; training events
        if not self.holdout:
            out = entity_statistics(Xa, data.y, ent, categories=cats, weight=fw)
            held = None
        else:
            names, inv = np.unique(np.asarray(ent).astype(str), return_inverse=True)
            inv = inv.reshape(-1)
            m = holdout_mask(inv, np.asarray(data.y, dtype=np.float64), self.holdout,
                             self.holdout_seed)
            train = ~m
            out = entity_statistics(Xa[~m], np.asarray(data.y)[~m], np.asarray(ent)[~m],
                                    categories=names, weight=None if fw is None else fw[~m])
            idx, hinv = np.unique(inv[m], return_inverse=True)
            r = np.ones(int(m.sum())) if fw is None else np.sqrt(fw[m])
            ysub = np.ascontiguousarray(np.asarray(data.y, dtype=np.float64)[m] * r)
            hn = np.bincount(hinv.reshape(-1), weights=r * r, minlength=len(idx))
            held = (idx, *entity_sums(np.ascontiguousarray(Xa[m] * r[:, None]), ysub,
                                      np.ascontiguousarray(hinv.reshape(-1), dtype=np.int64),
                                      len(idx)), hn)
        self._cache = (data, out, held)
        self._records = None if fw is None else _entity_records(out[0], ent, fw, train)
        return out

    def _heldout_stats(self, data: ClientData):
        """``(entity index, XtX, Xty, yty, n)`` of the held-out events grouped by entity (index
        into the sorted entities), or None without a holdout."""
        self._entity_stats(data)
        return self._cache[2]

    def _fit_stats(self, data: ClientData, params: Params):
        """The entity statistics the sampler uses: :meth:`_plain_stats`, adjusted for the
        random intercept at ``rho = tau^2 / sigma^2`` of ``params`` when the model has one
        (:func:`.random_intercept.adjust_statistics`)."""
        XtX, Xty, yty, n = self._plain_stats(data, params)
        if not self.random_intercept:
            return XtX, Xty, yty, n
        rho = self.rho_of(params)
        cache = getattr(self, "_rcache", None)
        if cache is None or cache[0] is not XtX or cache[1] != rho:
            self._rcache = cache = (XtX, rho, (*adjust_statistics(XtX, Xty, yty, n, rho), n))
        return cache[2]

    def tau_of(self, params: Params) -> float:
        """The random intercept's sd the sampler uses at ``params`` (fit units)."""
        return _num(params["tau"]) if "tau" in params else self.tau

    def rho_of(self, params: Params) -> float:
        """``tau^2 / sigma^2`` at ``params`` (0 without the random intercept)."""
        if not self.random_intercept:
            return 0.0
        return self.tau_of(params) ** 2 / self.sigma_of(params) ** 2

    def _plain_stats(self, data: ClientData, params: Params):
        """The entity statistics in the fit's units: standardized when ``params`` carry a
        scaling (``T``, ``y_shift``, ``y_scale``), else the raw ones (the cached arrays)."""
        _, XtX, Xty, yty, n = self._entity_stats(data)
        if "T" not in params:
            return XtX, Xty, yty, n
        key = (id(data), np.asarray(params["T"]).tobytes(), _num(params["y_shift"]),
               _num(params["y_scale"]))
        cache = getattr(self, "_tcache", None)
        if cache is None or cache[0] != key:
            t = transform_statistics(XtX, Xty, yty, n, np.asarray(params["T"]),
                                     _num(params["y_shift"]), _num(params["y_scale"]))
            self._tcache = cache = (key, (*t, n))
        return cache[1]

    def sigma_of(self, params: Params) -> float:
        """The noise sd the sampler uses at ``params`` (drawn when estimated)."""
        return _num(params["sigma"]) if "sigma" in params else self.sigma

    def fit_data(self, data: ClientData) -> ClientData:
        """The events with a target (an event whose target is NaN is left out; issue 25)."""
        return data.with_target()

    def n_units(self, data: ClientData) -> int:
        return len(self._entity_stats(data)[0])

    def n_records(self, data: ClientData, rows=None) -> int:
        """Events (the records; with frequency weights, those of positive weight) of the
        entities ``rows`` (all when None)."""
        n = self._entity_stats(data)[4]
        n = n if self._records is None else self._records
        return int(n.sum() if rows is None else n[np.asarray(rows, dtype=np.int64)].sum())

    def disclosure_blocks(self, stats):
        """A cluster block of an agent is a sum over the events of the entities it labels k:
        one block per cluster, over ``n_events[k]`` records. A block over too few events is
        sent as zeros (the round's cluster statistics then lack those entities; their labels
        stay on the agent and they count again once their block is large enough). With
        frequency weights the blocks' records are counted, not their weights."""
        blocks = getattr(self, "_block_records", None)
        names = (*_STAT_NAMES, "u2") if self.random_intercept else _STAT_NAMES
        return (np.asarray(stats["n_events"]) if blocks is None else blocks), tuple(names)

    def disclosure_members(self, stats):
        """The entities of each cluster block of the last step (``n_events`` of an entity:
        its records; with frequency weights, its rows of positive weight)."""
        members = getattr(self, "_members", None)
        if members is None:
            return None
        E, rows, zr, records = members
        out = np.zeros((self.K, E), dtype=bool)
        out[zr, rows] = True
        return out, records

    def reply_numbers(self, data: ClientData) -> int:
        """Per non-empty cluster block (at most one per entity): ``XtX`` (symmetric), ``Xty``,
        ``yty``, ``n_events``, ``n_entities``, ``sse`` (and ``u2``)."""
        from fedlatent.engine.privacy.disclosure import free_numbers

        per_block = free_numbers({"XtX": (self.F, self.F), "Xty": (self.F,)}, ("XtX",))
        per_block += 4 + int(self.random_intercept)
        return min(self.K, max(self.n_units(data), 1)) * per_block

    def record_width(self, data: ClientData) -> int:
        """An event's features and its target."""
        return int(data.n_features) + 1

    def init_client_state(self, data: ClientData) -> dict[str, np.ndarray]:
        return {"labels": np.full(self.n_units(data), -1, dtype=np.int64)}

    def client_stats(self, params, data, state, rng, rows=None) -> ClientStep:
        XtX, Xty, yty, n = self._fit_stats(data, params)
        E = len(n)
        labels = np.asarray(state.get("labels", np.full(E, -1)), dtype=np.int64)
        if rows is None:  # every entity: the cached statistics as they are, no copy
            rows = np.arange(E)
        else:  # a mini-batch: its entities' statistics gathered once
            rows = np.asarray(rows, dtype=np.int64)
            XtX, Xty, yty, n = XtX[rows], Xty[rows], yty[rows], n[rows]
        loglik = entity_log_marginal(XtX, Xty, yty, n, params["D"], params["c"],
                                     self.sigma_of(params))
        full = np.zeros((E, self.K))
        full[rows] = loglik
        if self.dp_max_events is None:
            z, logprior = sample_local_labels(full, labels, params["counts"], self.alpha,
                                              self.beta, rng, rows)
        else:  # private: no entity's label depends on another's (see .privacy)
            z, logprior = sample_public_prior_labels(full, labels, params["counts"], self.alpha,
                                                     rng, rows)
        zr = z[rows]
        onehot = np.zeros((len(rows), self.K))
        onehot[np.arange(len(rows)), zr] = 1.0
        sse = entity_sse(XtX, Xty, yty, params["coef"], zr)
        if self.dp_max_events is not None:  # not sent: its sensitivity is unbounded
            sse = np.zeros_like(sse)
        sums = {
            "XtX": np.einsum("ek,eij->kij", onehot, XtX),
            "Xty": onehot.T @ Xty,
            "yty": onehot.T @ yty,
            "n_events": onehot.T @ n,
            "n_entities": onehot.sum(axis=0),
            "sse": onehot.T @ sse,
        }
        if self.random_intercept:
            sums["u2"] = onehot.T @ self._intercept_moments(data, params, rows, zr)
        stats = Stats(sums, copy=False)
        objective = float(loglik[np.arange(len(rows)), zr].sum() + logprior.sum())
        if self.random_intercept:  # what the adjusted statistics leave out (as the gibbs log joint)
            objective += log_det_correction(n, self.rho_of(params))
        self._block_records = (None if self._records is None  # weighted: records per block
                               else onehot.T @ self._records[rows])
        records = self._entity_stats(data)[4] if self._records is None else self._records
        self._members = (E, rows, zr, np.asarray(records, dtype=np.float64))
        return ClientStep(stats, len(rows), objective, {"labels": z})

    def batch_units(self, datas):
        from .batched import AgentBatch

        return AgentBatch(self, datas)

    def batch_declines(self, batch, policy) -> bool:
        """An agent whose entity holds fewer than ``min_records_per_block`` events suppresses
        blocks by the span of those it released before (kept per agent): one by one then."""
        from .batched import differencing_applies

        return differencing_applies(policy, batch.plain[3])

    def client_stats_units(self, params, batch, idx, state, rngs, policy):
        from .batched import agents_step

        return agents_step(self, params, batch, idx, state, rngs, policy)

    def _intercept_moments(self, data: ClientData, params: Params, rows, labels) -> np.ndarray:
        """``E[u_e^2 | y_e]`` of the entities ``rows`` with their new ``labels``, at the
        broadcast posterior means ``coef`` and ``sigma``, ``tau`` (the EM-style terms of
        :mod:`.random_intercept`; fit units)."""
        XtX, Xty, _, n = self._plain_stats(data, params)
        W = np.asarray(params["coef"], dtype=np.float64)[labels]
        return intercept_second_moment(XtX[rows], Xty[rows], n[rows], W, self.rho_of(params),
                                       self.sigma_of(params))

    # ---- initialization exchange (counts only) ---------------------------------------------
    def client_query(self, name, payload, data, state, rng):
        """``"sizes"``: the agent's number of entities and events and its feature width (floats,
        so that a corrupted reply is caught as non-finite); nothing else is read or changed."""
        if name == SIZES_QUERY:
            n = self._entity_stats(data)[4]
            return {"n_entities": float(len(n)), "n_events": float(n.sum()),
                    "n_features": float(np.shape(data.X)[1])}, state
        if name == MOMENTS_QUERY:
            return self._moments(data), state
        if name == RESTART_QUERY:
            return {"n_entities": float(self.n_units(data))}, {
                **state, "labels": np.full(self.n_units(data), -1, dtype=np.int64)}
        if name == HELDOUT_QUERY:
            return self._heldout(payload, data, state), state
        if name == WAIC_QUERY:  # the sums of the entities' WAIC terms (.waic)
            p = payload_params(payload)
            return entity_waic_terms(*self._entity_stats(data)[1:5], p["W"], p["logpi"],
                                     p["sigma"], p["tau"]), state
        if name == WAIC_PAIRS_QUERY:
            return entity_waic_pairs(*self._entity_stats(data)[1:5],
                                     payload_params(payload)), state
        return super().client_query(name, payload, data, state, rng)

    def _moments(self, data: ClientData) -> dict[str, object]:
        X = np.asarray(data.X, dtype=np.float64)
        y = np.asarray(data.y, dtype=np.float64)
        if self.privacy is not None:  # about the clipping centre (no holdout: 'auto' refused)
            return private_moments(X, y, self.privacy)
        w = data.weight
        if self.holdout:
            keep = ~holdout_mask(np.unique(np.asarray(data.entity).astype(str),
                                           return_inverse=True)[1].reshape(-1), y,
                                 self.holdout, self.holdout_seed)
            X, y, w = X[keep], y[keep], (None if w is None else w[keep])
        if w is not None:  # frequency weights: a row of weight w is w rows
            return {"n": float(w.sum()), "sx": w @ X, "sxx": w @ (X * X),
                    "sy": float(w @ y), "syy": float(w @ (y * y))}
        return {"n": float(len(y)), "sx": X.sum(axis=0), "sxx": (X * X).sum(axis=0),
                "sy": float(y.sum()), "syy": float(y @ y)}

    def _heldout(self, payload, data: ClientData, state) -> dict[str, float]:
        """Sum over the agent's held-out events of their log predictive density given the
        entity's label (Theorem 1 against the broadcast ``D``, ``c``: the joint predictive of
        each entity's held-out events), in the units the fit works in, and their count."""
        held = self._heldout_stats(data)
        labels = np.asarray(state.get("labels", []), dtype=np.int64)
        if held is None or not len(held[0]) or not len(labels):
            return {"loglik": 0.0, "n": 0.0}
        params = payload_params(payload)
        idx, XtX, Xty, yty, n = held
        if "T" in params:
            XtX, Xty, yty = transform_statistics(XtX, Xty, yty, n, params["T"],
                                                 _num(params["y_shift"]),
                                                 _num(params["y_scale"]))
        ll = entity_log_marginal(XtX, Xty, yty, n, params["D"], params["c"],
                                 self.sigma_of(params))
        lab = labels[idx]
        ok = lab >= 0
        return {"loglik": float(ll[np.flatnonzero(ok), lab[ok]].sum()),
                "n": float(n[ok].sum())}

    # ---- differential privacy (see .privacy) ---------------------------------------------
    def dp_clip(self, data: ClientData, dp) -> ClientData:
        """Rows clipped to the ball, targets to ``dp.target_range``, the first
        ``dp_max_events`` events of every entity kept."""
        return dp_clip_events(data, dp, self.dp_max_events)

    def dp_sensitivity(self, params: Params, dp) -> dict[str, float]:
        """Per-entity bounds of the cluster sums in the fit's units (:mod:`.privacy`), widened
        for the per-block disclosure rule in force on this agent."""
        if self.dp_max_events is None:
            raise ValueError("HLCRModel: differential privacy needs dp_max_events (events kept "
                             "per entity); give HLCR(dp_max_events=M)")
        pol = self.disclosure
        t = pol.min_records_per_block if pol.count_scope == "client" else 1
        return hlcr_sensitivity(dp, params, n_features=self.F - int(self.fit_intercept),
                                fit_intercept=self.fit_intercept, max_events=self.dp_max_events,
                                min_block=t)

    def dp_query_sensitivity(self, name, payload, dp):
        """Only the standardizing moments are answered under differential privacy; the sizes,
        held-out scores and restarts are refused."""
        if name == MOMENTS_QUERY and self.dp_max_events is not None:
            return hlcr_query_sensitivity(dp, self.dp_max_events)
        return None

    def evaluated_shapes(self, data: ClientData) -> dict[str, tuple[int, ...]]:
        """Per cluster ``D`` (K, F, F), ``c`` (K, F), ``coef`` (K, F), ``counts`` (K,); the
        standardization ``T`` (F, F), ``x_shift`` and ``x_scale`` (d,); the rest scalars."""
        K, F, d = self.K, self.F, int(data.n_features)
        return {"D": (K, F, F), "c": (K, F), "coef": (K, F), "counts": (K,), "T": (F, F),
                "x_shift": (d,), "x_scale": (d,)}

    # ---- server side ----------------------------------------------------------------------
    def stat_shapes(self, params):
        K, F = self.K, self.F
        shapes = {"XtX": (K, F, F), "Xty": (K, F), "yty": (K,), "n_events": (K,),
                  "n_entities": (K,), "sse": (K,)}
        if self.random_intercept:
            shapes["u2"] = (K,)
        return shapes

    def check(self, stats, n_units, slack=None):
        """Entity counts in ``[0, n]`` summing to at most ``n`` (the agent's entities; blocks
        the disclosure policy suppressed are zeros); event counts
        ``>= 0`` and at least the entity counts (every entity has an event); with an
        intercept, the intercept's entry of ``XtX`` equal to the event count (with the random
        intercept, in ``[0, n_events]``: the adjusted entry); ``sse >= 0`` (and ``u2``);
        and per cluster ``[[XtX, Xty], [Xty^T, yty]]`` positive semi-definite (so ``XtX`` is
        and ``yty >= 0``)."""
        e = (lambda k: None) if slack is None else (lambda k: np.abs(slack[k]))
        reason = count_problem("n_entities", stats["n_entities"], n_units, e("n_entities"),
                               total=False)
        if reason:
            return reason
        ent, ev = np.asarray(stats["n_entities"]), np.asarray(stats["n_events"])
        tol = 1e-8 * max(float(n_units), 1.0)
        short = ev + tol < ent - (0.0 if slack is None else e("n_events") + e("n_entities"))
        if np.any(short):
            k = int(np.flatnonzero(short)[0])
            return (f"cluster {k} has {ev[k]:.6g} events for {ent[k]:.6g} entities (every "
                    "entity has at least one event)")
        if self.random_intercept:  # the adjusted intercept entry is sum n_e / (1 + n_e rho)
            reason = _intercept_entry_problem(stats, ev, tol, e)
            if reason:
                return reason
        elif self.fit_intercept:
            ei = None if slack is None else e("XtX")[:, -1, -1]
            reason = equal_problem("the intercept entries of 'XtX' and the event counts",
                                   stats["XtX"][:, -1, -1], ev, ei, e("n_events"))
            if reason:
                return reason
        for name in ("sse", "u2") if self.random_intercept else ("sse",):
            v = np.asarray(stats[name])
            neg = v < -(1e-8 * np.abs(v).max(initial=0.0)
                        + (0.0 if slack is None else e(name)))
            if np.any(neg):
                what = "squared error" if name == "sse" else "intercept second moment"
                return f"{what} {name!r} of cluster {int(np.flatnonzero(neg)[0])} is negative"
        E = None if slack is None else bordered(e("XtX"), e("Xty"), e("yty"))
        return psd_problem("the moment matrix [[XtX, Xty], [Xty^T, yty]]",
                           bordered(stats["XtX"], stats["Xty"], stats["yty"]), E, "cluster")

    def check_many(self, stats, n_units, slack=None):
        from .batched import hlcr_suspects

        return hlcr_suspects(self, stats, n_units, slack)

    def initial_params(self) -> Params:
        """Algorithm 3, line 2: ``H = delta^2 I``, ``c = 0`` (no data), zero counts."""
        K, F = self.K, self.F
        params = {"D": np.tile(np.eye(F) / self.delta**2, (K, 1, 1)), "c": np.zeros((K, F)),
                  "counts": np.zeros(K), "coef": np.zeros((K, F)),
                  "train_mse": np.array(np.nan)}
        if self.random_intercept:
            params["tau"] = np.array(self.tau)
        return params

    @property
    def estimates_hyper(self) -> bool:
        return self.estimate_sigma or self.estimate_delta

    def server_step(self, S: Stats, params: Params, n_total: float) -> Params:
        private = self.dp_max_events is not None
        XtX0 = S["XtX"] * n_total
        if private:  # independent noise per entry: symmetrize (post-processing)
            XtX0 = 0.5 * (XtX0 + np.swapaxes(XtX0, 1, 2))
        XtX, Xty, yty, bad = project_gram_psd(XtX0, S["Xty"] * n_total, S["yty"] * n_total)
        if bad.any():
            logger.debug("hlcr: smoothed statistics of clusters %s not a Gram matrix; "
                         "projected", np.flatnonzero(bad).tolist())
        F = self.F
        counts = np.maximum(S["n_entities"] * n_total, 0.0)
        n_ev = float(np.maximum(S["n_events"], 0.0).sum())
        if private:  # the squared error of the broadcast coefficients, from the noisy sums
            sse = sse_from_sums(XtX, Xty, yty, params["coef"]).sum()
            mse = float(sse / max(n_ev * n_total, 1.0))  # noisy counts can all be <= 0
            # AdaSSP's adaptive ridge (Wang 2018): a cluster whose X^T X has a direction
            # weaker than the noise's own scale is lifted to it; strong clusters are unchanged
            lift = np.maximum(_num(params.get("dp_ridge", 0.0))
                              - np.linalg.eigvalsh(XtX)[:, 0], 0.0)
            XtX = XtX + lift[:, None, None] * np.eye(F)[None]
        elif n_ev > 0:
            mse = float(np.maximum(S["sse"], 0.0).sum() / n_ev)
        else:  # every block suppressed (disclosure): no event reported, the last figure stands
            mse = _last_mse(params)
        if not ("sigma" in params or "T" in params or self.random_intercept):  # the paper's
            D = np.eye(F)[None] / self.delta**2 + XtX / self.sigma**2
            c = Xty / self.sigma**2
            out = {"D": D, "c": c, "counts": counts, "coef": posterior_means(D, c),
                   "train_mse": np.array(mse)}
            for k in ("dp_ridge", "tau"):
                if k in params:
                    out[k] = params[k]
            return out
        extra = {k: params[k] for k in ("T", "y_shift", "y_scale", "x_shift", "x_scale", "seed",
                                        "step", "dp_ridge", "tau") if k in params}
        if self.random_intercept and self.estimate_tau:  # EM-style (see .random_intercept)
            n_ent = float(np.maximum(S["n_entities"], 0.0).sum())
            if n_ent > 0:
                tau2 = float(np.maximum(S["u2"], 0.0).sum()) / n_ent
                extra["tau"] = np.array(float(np.sqrt(max(tau2, TAU2_FLOOR))))
        sigma, delta = self.sigma_of(params), _num(params.get("delta", self.delta))
        if self.estimates_hyper:  # server-side Gibbs step, its stream keyed by (seed, step)
            step = int(_num(params["step"])) + 1
            rng = np.random.default_rng([int(_num(params["seed"])), step, 7])
            sigma, delta = draw_hyper(XtX, Xty, yty if private else S["yty"] * n_total,
                                      n_ev * n_total, sigma, delta, rng, self.estimate_sigma,
                                      self.estimate_delta)
            extra["step"] = np.array(float(step))
            if private and "T" in params:  # noise can empty the residual: R^2 <= 1 - floor^2
                sigma = max(sigma, DP_SIGMA_FLOOR)
        D = np.eye(F)[None] / delta**2 + XtX / sigma**2
        c = Xty / sigma**2
        return {"D": D, "c": c, "counts": counts, "coef": posterior_means(D, c),
                "train_mse": np.array(mse), "sigma": np.array(sigma),
                "delta": np.array(delta), **extra}
