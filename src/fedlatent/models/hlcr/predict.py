"""HLCR's predictions: the posterior predictive mean (Rao-Blackwellized over the retained
draws), one posterior draw, or the point estimate; cluster probabilities of known and new
(agent, entity) pairs. A mixin of the estimator; every step is vectorized over rows and pairs
(loops run over draws and over the clients of a context, never over events).

References
----------
Yang, Carette, Jimbo, Maruyama, "Federated Latent Class Regression for Hierarchical Data",
2022: eq. (2) (cluster proportions of a new entity), Theorem 1 (its context likelihood),
Theorem 2 / eq. (10) (prediction given a cluster).
"""

from __future__ import annotations

import warnings

import numpy as np

from ...data.dataset import DataValidationError, FederatedDataset
from ...data.validation import to_float_target
from ...engine.estimation.estimator import check_features, check_is_fitted
from ...engine.protocol.numerics import add_intercept
from .math import entity_log_marginal, entity_statistics, posterior_means
from .random_intercept import adjust_statistics

__all__ = ["METHODS", "UNKNOWN", "HLCRPrediction"]

METHODS = ("mean", "sample", "map")
UNKNOWN = ("warn", "prior", "error")
_SEP = "\x1f"


class HLCRPrediction:
    """Prediction methods of :class:`~fedlatent.models.hlcr.HLCR` (see its docstring)."""

    # ---- cluster probabilities ------------------------------------------------------------------
    def global_proportions(self, counts: np.ndarray | None = None) -> np.ndarray:
        """Cluster proportions for a new agent: ``(N^(k) + alpha/K) / (N + alpha)``; (K,)."""
        check_is_fitted(self)
        Nk = self.cluster_counts_ if counts is None else np.asarray(counts, dtype=float)
        K = len(Nk)
        return (Nk + self.alpha / K) / (Nk.sum() + self.alpha)

    def _pairs(self, agents, entities):
        """The rows' distinct (agent, entity) keys, each row's key, where each key sits among
        the fit's pairs (-1: a new pair) and each key's agent. Independent of the labels:
        computed once for every draw or stage."""
        agents = np.asarray(agents).astype(str)
        entities = np.asarray(entities).astype(str)
        key = np.char.add(np.char.add(agents, _SEP), entities)
        ukey, inv = np.unique(key, return_inverse=True)
        uagent = np.char.partition(ukey, _SEP)[:, 0] if len(ukey) else ukey
        known_key = np.char.add(np.char.add(self.pair_agents_, _SEP), self.pair_entities_)
        order = np.argsort(known_key)
        if not len(order):  # a fit on a RemoteDataset knows no pair
            return ukey, inv.reshape(-1), np.full(len(ukey), -1), uagent
        pos = np.minimum(np.searchsorted(known_key[order], ukey), len(order) - 1)
        where = np.where(known_key[order][pos] == ukey, order[pos], -1)
        return ukey, inv.reshape(-1), where, uagent

    def _context_stats(self, context: FederatedDataset | None):
        """Keys and entity statistics of the context's (agent, entity) pairs, or None."""
        if context is None:
            return None
        keys, parts = [], []
        for cid, cd in context.items():
            names, XtX, Xty, yty, nn = entity_statistics(
                add_intercept(cd.X, self.fit_intercept),
                _target(cid, cd, context, "context: "), np.asarray(cd.entity), client=cid)
            keys.append(np.char.add(f"{cid}{_SEP}", names.astype(str)))
            parts.append((XtX, Xty, yty, nn))
        if not keys:
            return None
        return (np.concatenate(keys),
                *(np.concatenate([p[i] for p in parts]) for i in range(4)))

    def _rho(self, sigma, tau=None) -> float:
        """``tau^2 / sigma^2`` of a draw (0 without the random intercept)."""
        if not getattr(self, "random_intercept_", False):
            return 0.0
        tau = self.tau_ if tau is None else float(tau)
        return tau**2 / float(sigma) ** 2

    def _entity_level(self, pairs, ctx_stats, D, c, rho: float) -> np.ndarray:
        """(n_rows, K): each row's entity intercept under each cluster. A known pair: its
        posterior mean ``random_effects_``; a new pair with events in the context: the BLUP
        from them at the cluster's coefficients; otherwise 0 (the prior mean)."""
        ukey, inv, where, _ = pairs
        K = D.shape[0]
        level = np.zeros((len(ukey), K))
        if ctx_stats is not None and len(ukey):
            ckeys, XtX, Xty, _, nn = ctx_stats
            at = np.minimum(np.searchsorted(ukey, ckeys), len(ukey) - 1)
            hit = ukey[at] == ckeys
            W = posterior_means(D, c)  # (K, F)
            g = rho / (1.0 + nn * rho)
            level[at[hit]] = (g[:, None] * (Xty[:, -1][:, None] - XtX[:, :, -1] @ W.T))[hit]
        known = where >= 0
        level[known] = np.asarray(self.random_effects_)[where[known]][:, None]
        return level[inv]

    def _entity_var(self, pairs, ctx_stats, sigma: float, rho: float) -> np.ndarray:
        """(n_rows,): the posterior variance of each row's entity intercept. A known pair: its
        ``random_effects_var_``; a new pair with events in the context: ``sigma^2 g_e``,
        ``g_e = rho / (1 + n_e rho)`` (:mod:`.random_intercept`); otherwise the prior's
        ``tau^2 = rho sigma^2`` (an entity never seen)."""
        ukey, inv, where, _ = pairs
        var = np.full(len(ukey), rho * float(sigma) ** 2)
        if ctx_stats is not None and len(ukey):
            ckeys, nn = ctx_stats[0], ctx_stats[4]
            at = np.minimum(np.searchsorted(ukey, ckeys), len(ukey) - 1)
            hit = ukey[at] == ckeys
            var[at[hit]] = (float(sigma) ** 2 * rho / (1.0 + nn * rho))[hit]
        known = where >= 0
        var[known] = np.asarray(self.random_effects_var_)[where[known]]
        return var[inv]

    def _cluster_proba(self, pairs, ctx_stats, D, c, counts, labels, sigma, rho=0.0):
        """(n_rows, K) cluster probabilities at one draw (or the point estimate); ``rho``:
        the random intercept's ``tau^2 / sigma^2`` (the context's statistics adjusted)."""
        K = D.shape[0]
        ukey, inv, where, uagent = pairs
        lab = np.where(where >= 0, np.asarray(labels)[np.maximum(where, 0)], -1)
        psi = self.global_proportions(counts)
        prior = np.tile(psi, (len(ukey), 1))
        known_agents, ainv = np.unique(self.pair_agents_, return_inverse=True)
        if len(known_agents):
            ok = np.asarray(labels) >= 0
            Ni = np.zeros((len(known_agents), K))
            np.add.at(Ni, (ainv.reshape(-1)[ok], np.asarray(labels)[ok]), 1.0)
            pos = np.minimum(np.searchsorted(known_agents, uagent), len(known_agents) - 1)
            has = known_agents[pos] == uagent
            prior[has] = ((Ni[pos[has]] + self.beta * psi)
                          / (Ni[pos[has]].sum(axis=1, keepdims=True) + self.beta))
        lp = np.log(prior)
        if ctx_stats is not None:
            ckeys, XtX, Xty, yty, nn = ctx_stats
            if rho:
                XtX, Xty, yty = adjust_statistics(XtX, Xty, yty, nn, rho)
            ll = entity_log_marginal(XtX, Xty, yty, nn, D, c, sigma)
            at = np.minimum(np.searchsorted(ukey, ckeys), max(len(ukey) - 1, 0))
            hit = ukey[at] == ckeys if len(ukey) else np.zeros(len(ckeys), bool)
            lp[at[hit]] += ll[hit]
        P = np.exp(lp - lp.max(axis=1, keepdims=True))
        P /= P.sum(axis=1, keepdims=True)
        P[lab >= 0] = np.eye(K)[lab[lab >= 0]]
        return P[inv]

    def predict_proba(self, agents, entities, context: FederatedDataset | None = None):
        """Cluster probabilities of each row's (agent, entity) pair at the point estimate;
        (n, K).

        Known pairs: a point mass on their label. A new entity of a known agent: the agent's
        proportions ``(N_i^(k) + beta psi)/(N_i + beta)`` times the marginal likelihood
        (Theorem 1) of the entity's observed events in ``context`` (if any). A new agent: the
        global proportions ``psi`` (times the context likelihood).
        """
        check_is_fitted(self)
        return self._cluster_proba(self._pairs(agents, entities), self._context_stats(context),
                                   self.precisions_, self.c_, self.cluster_counts_,
                                   self.labels_, self.sigma_, self._rho(self.sigma_))

    # ---- predictions ----------------------------------------------------------------------------
    def _prepare(self, X, agents, entities, method, unknown, context=None):
        """The checked design matrix, the rows' pairs and the context's statistics."""
        if method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {method!r}")
        if unknown not in UNKNOWN:
            raise ValueError(f"unknown must be one of {UNKNOWN}, got {unknown!r}")
        X = check_features(self, X)
        if not len(agents) == len(entities) == len(X):
            raise ValueError(f"X has {len(X)} rows but agents has {len(agents)} and entities "
                             f"{len(entities)}; give one agent and one entity id per row")
        pairs = self._pairs(agents, entities)
        ctx = self._context_stats(context)
        self._check_unknown(pairs, ctx, unknown)
        return add_intercept(X, self.fit_intercept), pairs, ctx

    def _check_unknown(self, pairs, ctx, unknown):
        ukey, inv, where, _ = pairs
        new = where < 0
        if ctx is not None:
            new &= ~np.isin(ukey, ctx[0])
        if unknown == "prior" or not new.any():
            return
        n_rows = int(new[inv].sum())
        shown = ", ".join(f"{k.split(_SEP, 1)[0]!r}/{k.split(_SEP, 1)[1]!r}"
                          for k in ukey[new][:5])
        more = f" and {int(new.sum()) - 5} more" if new.sum() > 5 else ""
        what = (f"{n_rows} rows belong to {int(new.sum())} (agent, entity) pairs the fit did "
                f"not see ({shown}{more})")
        if unknown == "error":
            raise ValueError(f"{what}; give their observed events as context=, or predict with "
                             "unknown='prior' to use the prior cluster proportions")
        warnings.warn(f"{what}: their predictions use the prior cluster proportions (the agent's "
                      "if it is known); pass context= with their events, or unknown='prior' to "
                      "silence this", UserWarning, stacklevel=4)

    def _one(self, prepared, D, c, counts, labels, sigma, hard: bool, tau=None):
        """Predictions at one draw: ``sum_k p(k) x^T H_k c_k`` (``hard``: the likeliest k),
        plus the entity's intercept under each cluster with the random intercept."""
        Xa, pairs, ctx = prepared
        rho = self._rho(sigma, tau)
        P = self._cluster_proba(pairs, ctx, D, c, counts, labels, sigma, rho)
        per = Xa @ posterior_means(D, c).T  # (n, K): Theorem 2 under each cluster
        if rho:
            per = per + self._entity_level(pairs, ctx, D, c, rho)
        if hard:
            return per[np.arange(len(Xa)), P.argmax(axis=1)]
        return (P * per).sum(axis=1)

    def _predict_with(self, prepared, method: str):
        if method == "map":
            return self._one(prepared, self.precisions_, self.c_, self.cluster_counts_,
                             self.labels_, self.sigma_, hard=True, tau=self.tau_)
        draws = range(len(self.draws_sigma_))
        if method == "sample":
            draws = draws[-1:]
        total = 0.0
        for t in draws:
            total = total + self._one(prepared, self.draws_precisions_[t], self.draws_c_[t],
                                      self.draws_counts_[t], self.draws_labels_[t],
                                      self.draws_sigma_[t], hard=False,
                                      tau=self.draws_tau_[t])
        return total / len(draws)

    def predict(self, X, agents, entities, context: FederatedDataset | None = None,
                method: str = "mean", unknown: str = "warn") -> np.ndarray:
        """Predict targets, in the user's units.

        Parameters
        ----------
        X : array-like or DataFrame of shape (n, n_features)
            A DataFrame must have the fit's columns in the fit's order.
        agents, entities : array-like of shape (n,)
            Agent (client) and entity id of each row.
        context : FederatedDataset or None
            Observed events (with targets) of new pairs, used for their cluster posterior.
        method : {"mean", "sample", "map"}, default "mean"
            "mean": the posterior predictive mean, Rao-Blackwellized over the retained draws
            (``mean_t sum_k p_t(k) x^T H_k,t c_k,t``: coefficients integrated out exactly, labels
            and sigma averaged over the draws). "sample": the same at the last retained draw
            only (one posterior sample of the labels). "map": the point estimate (``labels_``,
            ``coef_``) and, for new pairs, the most probable cluster.
        unknown : {"warn", "prior", "error"}, default "warn"
            Rows of (agent, entity) pairs the fit did not see and ``context`` does not cover:
            predicted from the prior cluster proportions with a warning naming how many rows
            and which pairs ("warn"), silently ("prior"), or refused ("error").

        Returns
        -------
        ndarray of shape (n,)
        """
        check_is_fitted(self)
        return self._predict_with(self._prepare(X, agents, entities, method, unknown, context),
                                  method)

    def _predict_clients(self, fd, context, method, unknown) -> np.ndarray:
        """Predictions for every event of ``fd`` in client order; (n_events,)."""
        X, agents, ents = _flatten(fd)
        return self.predict(X, agents, ents, context=context, method=method, unknown=unknown)

    def predict_dataset(self, fd: FederatedDataset, context: FederatedDataset | None = None,
                        method: str = "mean", unknown: str = "warn"):
        """Predictions for every event of ``fd`` (``method``, ``unknown``: see :meth:`predict`).

        Returns
        -------
        pandas Series of shape (n_events,)
            Indexed like the DataFrame ``fd`` was made from, in its row order
            (:meth:`FederatedDataset.to_source_order`; from arrays: clients in order, each
            client's rows in order).
        """
        self._note_left_out(fd)
        return fd.to_source_order(self._predict_clients(fd, context, method, unknown),
                                  name="prediction")

    def staged_predict(self, fd: FederatedDataset, method: str = "sample",
                       unknown: str = "warn"):
        """Predictions for ``fd`` after every iteration of the last fit (not kept by save), each
        a Series in the source's row order as :meth:`predict_dataset`.

        ``method="sample"`` (default): the state after that iteration; ``"map"``: the same
        with the likeliest cluster of new pairs; ``"mean"``: the running posterior predictive
        mean over the retained iterations so far (the state itself during burn-in).
        """
        check_is_fitted(self)
        prepared = self._prepare(*_flatten(fd), method, unknown)
        total, count = 0.0, 0
        for p in self._path:
            labels = p["labels"] if p["labels"] is not None else self.labels_
            pred = self._one(prepared, p["D"], p["c"], p["counts"], labels, p["sigma"],
                             hard=method == "map", tau=p.get("tau"))
            if method == "mean" and p["kept"]:
                total, count = total + pred, count + 1
            yield fd.to_source_order(total / count if method == "mean" and count else pred,
                                     name="prediction")

    def mse(self, fd: FederatedDataset, context: FederatedDataset | None = None,
            method: str = "mean", unknown: str = "warn") -> float:
        """Mean squared error on the events of ``fd``."""
        y = np.concatenate([_target(cid, cd, fd) for cid, cd in fd.items()])
        pred = self._predict_clients(fd, context, method, unknown)  # client order, as y
        return float(np.mean((pred - y) ** 2))

    def score_dataset(self, fd: FederatedDataset) -> float:
        """Mean squared error of :meth:`predict_dataset` on the events of ``fd``."""
        return self.mse(fd)


def _target(cid: str, cd, fd: FederatedDataset, where: str = "") -> np.ndarray:
    """A client's target as floats; text, complex, NaN/inf or |y| > 1e150 are refused."""
    name = fd.target_name or "y"
    if cd.y is None:
        raise DataValidationError(f"{where}client {cid!r} has no target; scoring HLCR needs the "
                                  "observed y: build the dataset with target='COLUMN'")
    return to_float_target(cd.y, name, where=f"{where}client {cid!r}: ")


def _flatten(fd: FederatedDataset):
    Xs, agents, ents = [], [], []
    for cid, cd in fd.items():
        Xs.append(cd.X)
        agents.append(np.full(cd.n_samples, cid, dtype=object))
        if cd.entity is None:
            raise DataValidationError(f"client {cid!r} has no entity column")
        ents.append(np.asarray(cd.entity).astype(str))
    return np.vstack(Xs), np.concatenate(agents).astype(str), np.concatenate(ents)
