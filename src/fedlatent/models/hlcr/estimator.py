"""The HLCR estimator: hooks of the base estimator (it never overrides ``fit``) and prediction.

The base estimator's ``fit`` validates the parameters (the declarative table below, then
``_check_params``), checks the data (``_validate_data``), sets the agents up, calls
``_initialize`` (the checked ``"sizes"`` exchange, then Algorithm 3's prior start) and ``_run``
(one of the two solvers of :mod:`.solvers`), and stores the result (``_store``).

References
----------
Yang, Carette, Jimbo, Maruyama, "Federated Latent Class Regression for Hierarchical Data",
2022: Algorithms 2 and 3, eqs. (1)-(10).
"""

from __future__ import annotations

import logging

import numpy as np

from ...data.dataset import DataValidationError, FederatedDataset
from ...data.validation import to_float_target
from ...engine.estimator import FederatedEstimator, FitContext, check_features, check_is_fitted
from ...engine.exchange import number
from ...engine.federation import Federation
from ...engine.history import History
from ...engine.loop import FederatedFitError, LoopOptions
from ...engine.model import Params
from ...engine.numerics import add_intercept
from ...engine.params import ROUND_LOOP, Integer, Options, Real
from ...engine.registry import register_estimator
from .math import check_entities, entity_log_marginal, entity_statistics, posterior_means
from .model import SIZES_QUERY, HLCRModel
from .solvers import HLCRFit, run_federated, run_gibbs

__all__ = ["HLCR"]

logger = logging.getLogger(__name__)

SOLVERS = ("gibbs", "federated")
_POSITIVE = Real(0, closed="neither", desc="a finite number > 0")


@register_estimator(
    "hlcr", target=True, entity=True,
    description="HLCR / FedHLCR: hierarchical latent class regression by Gibbs (Yang et al.)",
)
class HLCR(FederatedEstimator):
    """Hierarchical latent class regression (HLCR) and its federated version (FedHLCR).

    Parameters
    ----------
    n_clusters : int, default 4
        Number of linear models K (>= 1).
    alpha, beta : float, default 1.0
        Concentrations of the global and per-agent label priors (eq. (2)).
    delta : float, default 1.0
        Prior standard deviation of the coefficients, ``w_k ~ N(0, delta^2 I)``.
    sigma : float, default 1.0
        Noise standard deviation (> 0), fixed as in the paper.
    solver : {"federated", "gibbs"}, default "federated"
        "federated": FedHLCR (Algorithm 3) on the engine with ``federation``. "gibbs": the
        exact centralized collapsed Gibbs sampler (Algorithm 2) on the pooled data, a reference.
    max_rounds : int, default 20
        Rounds (federated, the initialization round included) or sweeps (gibbs).
    burn_in : int or None
        Gibbs only: labels_ are the most frequent labels over the sweeps after ``burn_in``
        (None: the last sweep). The federated solver keeps the last sampled labels.
    tol : float, default 1e-6
        Stop when the mean per-entity log joint changes by less than ``tol`` between two
        iterations (with a sampler this happens when no label moves).
    federation : fl.Federation or None
        Federated solver settings; the paper's smoothing is
        ``Federation(step_size=gamma, participation=f, control_variates=False)``.
    fit_intercept : bool, default True
        Append a constant feature (its coefficient has the same prior).
    random_state : int, Generator or None
    verbose : bool or None
        Progress bar.

    Attributes
    ----------
    coef_ : ndarray of shape (K, n_features)
        Posterior means of the cluster coefficients, ``H_k c_k``.
    intercept_ : ndarray of shape (K,)
    covariances_ : ndarray of shape (K, F, F)
        Posterior covariances ``H_k = D_k^-1`` (F counts the intercept last).
    precisions_, c_ : ndarrays (K, F, F), (K, F)
        ``D_k`` and ``c_k`` of the paper.
    cluster_counts_ : ndarray of shape (K,)
        Entities per cluster ``N^(k)`` (smoothed in the federated solver).
    labels_ : ndarray of int, shape (n_pairs,)
        Cluster of every known (agent, entity) pair listed in ``pair_agents_``,
        ``pair_entities_``. For the federated solver the labels live on the agents; they are read
        from the runtime's client states (possible in-process), never from a message.
    n_entities_, n_events_ : int
        Entities (agent-entity pairs) and events in the federation, as the agents reported
        them in the checked initialization exchange.
    history_ : History
        One row per iteration; ``history_.to_frame()`` adds ``log_joint`` and ``train_mse``
        (per entity / per event). Gibbs: the log joint of the labelling after the sweep
        (:func:`hlcr_log_joint`) and the training MSE under the posterior means. Federated: the
        mean over the participating entities of ``log p(y_e | z_e)`` against the broadcast
        statistics plus the log prior factor (2) of the drawn label (a Monte Carlo surrogate),
        and the training MSE implied by the smoothed server statistic (exact with all agents
        and gamma = 1).
    n_iter_, converged_ : int, bool
        Rounds (federated) or sweeps (gibbs) run, and whether ``tol`` stopped them.

    References
    ----------
    Yang, Carette, Jimbo, Maruyama, "Federated Latent Class Regression for Hierarchical Data",
    2022: Algorithms 2 and 3, eqs. (1)-(10).
    """

    _save_arrays = ("coef_", "intercept_", "precisions_", "c_", "covariances_",
                    "cluster_counts_", "labels_", "pair_agents_", "pair_entities_",
                    "history_log_joint_", "history_train_mse_")
    _score_name = "mse"
    _load_nonfinite = ("history_log_joint_", "history_train_mse_")

    _parameter_constraints = {
        **ROUND_LOOP,
        "n_clusters": [Integer(1, desc="an integer K >= 1")],
        "alpha": [_POSITIVE],
        "beta": [_POSITIVE],
        "delta": [_POSITIVE],
        "sigma": [_POSITIVE],
        "solver": [Options(*SOLVERS)],
        "burn_in": [None, Integer(0)],
        "fit_intercept": ["boolean"],
    }

    def __init__(self, n_clusters: int = 4, alpha: float = 1.0, beta: float = 1.0,
                 delta: float = 1.0, sigma: float = 1.0, solver: str = "federated",
                 max_rounds: int = 20, burn_in: int | None = None, tol: float = 1e-6,
                 federation: Federation | None = None, fit_intercept: bool = True,
                 random_state=None, verbose: bool | None = None):
        self.n_clusters = n_clusters
        self.alpha = alpha
        self.beta = beta
        self.delta = delta
        self.sigma = sigma
        self.solver = solver
        self.max_rounds = max_rounds
        self.burn_in = burn_in
        self.tol = tol
        self.federation = federation
        self.fit_intercept = fit_intercept
        self.random_state = random_state
        self.verbose = verbose

    # ---- validation -------------------------------------------------------------------------
    def _check_params(self) -> None:
        if self.burn_in is not None and not self.burn_in < self.max_rounds:
            raise ValueError(
                f"burn_in must be None or in [0, max_rounds={self.max_rounds}), got "
                f"{self.burn_in!r}"
            )

    def _describe_local(self, fd: FederatedDataset) -> dict:
        self._validate_params()
        self._validate_data(fd)
        return {}

    def _validate_data(self, fd: FederatedDataset) -> None:
        if getattr(fd, "is_remote", False):  # every node ran the checks below on its own data
            if self.solver == "gibbs":
                raise ValueError("solver='gibbs' pools the data and cannot run on a "
                                 "RemoteDataset; use solver='federated'")
            return
        for cid, cd in fd.items():
            if cd.entity is None:
                raise DataValidationError(
                    f"client {cid!r} has no entity column; HLCR needs agent-entity-event data: "
                    "build the dataset with entity='COLUMN' (FederatedDataset.from_pandas)"
                )
            if cd.y is None:
                raise DataValidationError(
                    f"client {cid!r} has no target; HLCR is a regression: give target='COLUMN'"
                )
            y = np.asarray(cd.y)
            if not (np.issubdtype(y.dtype, np.number) or y.dtype == bool):
                raise DataValidationError(
                    f"client {cid!r}: target {fd.target_name or 'y'!r} is not numeric (dtype "
                    f"{y.dtype}); HLCR regresses a number: encode the target as numbers"
                )
            if not np.all(np.isfinite(y.astype(np.float64))):
                raise DataValidationError(
                    f"client {cid!r}: target {fd.target_name or 'y'!r} has NaN or infinite "
                    "values; drop those rows before fitting"
                )
            check_entities(cd.entity, cid)

    def _make_model(self, fd: FederatedDataset) -> HLCRModel:
        return HLCRModel(self.n_clusters, self.alpha, self.beta, self.delta, self.sigma,
                         self.fit_intercept, fd.n_features)

    # ---- the fit's hooks --------------------------------------------------------------------
    def _initialize(self, ctx: FitContext) -> Params:
        """Every agent reports its entity and event counts and its feature width (the checked
        ``"sizes"`` exchange: finite, >= 1, entities as at setup, the fit's width); then the
        start of Algorithm 3 (line 2): the prior, ``D_k = I/delta^2``, ``c_k = 0``, zero counts.
        Round 1 draws the first labels. The reply changes no fitted number."""
        if self.solver == "gibbs" and ctx.runtime_given:
            raise ValueError("solver='gibbs' pools the data: runtime/checkpoint options apply "
                             "to solver='federated' only")
        what = "initialization (agent sizes)"
        sizes = ctx.ask(SIZES_QUERY, expect={"n_entities": number(low=1),
                                             "n_events": number(low=1),
                                             "n_features": number(low=1)}, what=what)
        n_ent = n_ev = 0
        for c in ctx.client_ids:
            r = {k: float(sizes[c][k]) for k in ("n_entities", "n_events", "n_features")}
            problem = None
            if r["n_entities"] != ctx.n_units[c]:
                problem = (f"reported {r['n_entities']:g} entities, {ctx.n_units[c]} at setup")
            elif r["n_events"] < r["n_entities"]:
                problem = (f"reported {r['n_events']:g} events for {r['n_entities']:g} "
                           "entities (every entity has an event)")
            elif r["n_features"] != ctx.n_features:
                problem = (f"has {r['n_features']:g} features, the fit has {ctx.n_features}")
            if problem:
                raise FederatedFitError(f"{what}: client {c!r} {problem}; nothing of this "
                                        "exchange was used")
            n_ent += int(r["n_entities"])
            n_ev += int(r["n_events"])
        self._sizes = (n_ent, n_ev)
        return ctx.model.initial_params()

    def _run(self, ctx: FitContext, params0: Params, options: LoopOptions) -> HLCRFit:
        """``"gibbs"``: the centralized sampler on ``ctx.data``; ``"federated"``: the engine's
        round loop, its runtime wrapped in the tap that records every round's parameters."""
        if self.solver == "gibbs":
            return run_gibbs(self, ctx, options)
        return run_federated(ctx, params0, options, super()._run)

    def _store(self, result: HLCRFit, model: HLCRModel) -> None:
        self.pair_agents_, self.pair_entities_ = result.pair_agents, result.pair_entities
        self.labels_ = np.asarray(result.labels, dtype=np.int64)
        p = result.params
        self._set_cluster_params(p["D"], p["c"], p["counts"])
        self.n_entities_, self.n_events_ = self._sizes
        self._path = result.path
        self.history_log_joint_ = np.asarray(result.log_joint, dtype=float)
        self.history_train_mse_ = np.asarray(result.train_mse, dtype=float)
        self.history_ = _HLCRHistory(result.history, self)

    def _set_cluster_params(self, D, c, counts) -> None:
        D = np.asarray(D, dtype=np.float64)
        self.precisions_ = D
        self.c_ = np.asarray(c, dtype=np.float64)
        self.covariances_ = np.linalg.inv(D)
        W = posterior_means(D, self.c_)
        F = self.n_features_in_
        self.coef_ = W[:, :F]
        self.intercept_ = W[:, F] if self.fit_intercept else np.zeros(len(W))
        self.cluster_counts_ = np.asarray(counts, dtype=np.float64)

    # ---- persistence ------------------------------------------------------------------------
    def save(self, path) -> None:
        """As the base's; the history is written without its derived columns (``log_joint``
        and ``train_mse`` are saved as arrays and added back at load)."""
        full = self.history_
        self.history_ = History(full)
        try:
            super().save(path)
        finally:
            self.history_ = full

    def _save_extra(self) -> dict:
        return {"sizes": {"n_entities_": int(self.n_entities_),
                          "n_events_": int(self.n_events_)}}

    def _load_extra(self, meta: dict) -> None:
        for k, v in meta.get("sizes", {}).items():
            setattr(self, k, int(v))

    def _check_loaded(self) -> None:
        from ...engine import loadcheck as lc

        K, F = int(self.n_clusters), int(self.n_features_in_)
        p = F + bool(self.fit_intercept)
        for name, shape in (("coef_", (K, F)), ("intercept_", (K,)), ("precisions_", (K, p, p)),
                            ("covariances_", (K, p, p)), ("c_", (K, p)),
                            ("cluster_counts_", (K,)), ("labels_", self.pair_agents_.shape),
                            ("pair_entities_", self.pair_agents_.shape)):
            lc.expect_shape(self, name, shape)
        lc.expect_pd(self, "precisions_")
        lc.expect_pd(self, "covariances_")
        lc.expect_positive(self, "cluster_counts_", strict=False)
        lc.expect_labels(self, "labels_", K, low=-1)  # -1: a label the server never saw

    def _after_load(self) -> None:
        self.labels_ = np.asarray(self.labels_, dtype=np.int64)
        self.pair_agents_ = np.asarray(self.pair_agents_).astype(str)
        self.pair_entities_ = np.asarray(self.pair_entities_).astype(str)
        self.history_ = _HLCRHistory(self.history_, self)
        self._path = []

    # ---- prediction -------------------------------------------------------------------------
    def _agent_counts(self, labels: np.ndarray) -> dict[str, np.ndarray]:
        K = int(self.n_clusters)
        ok = labels >= 0
        agents, inv = np.unique(self.pair_agents_, return_inverse=True)
        if not len(agents):  # a fit on a RemoteDataset knows no pair
            return {}
        counts = np.bincount(inv.reshape(-1)[ok] * K + labels[ok],
                             minlength=len(agents) * K).reshape(len(agents), K).astype(float)
        return {str(a): counts[i] for i, a in enumerate(agents)}

    def global_proportions(self, counts: np.ndarray | None = None) -> np.ndarray:
        """Cluster proportions for a new agent: ``(N^(k) + alpha/K) / (N + alpha)``; (K,)."""
        check_is_fitted(self)
        Nk = self.cluster_counts_ if counts is None else counts
        K = len(Nk)
        return (Nk + self.alpha / K) / (Nk.sum() + self.alpha)

    def _pairs(self, agents, entities):
        """The rows' distinct (agent, entity) keys, each row's key, and where each key sits
        among the fit's pairs (-1: a new pair). Independent of the labels: staged_predict
        computes it once for every stage."""
        agents = np.asarray(agents).astype(str)
        entities = np.asarray(entities).astype(str)
        key = np.char.add(np.char.add(agents, "\x1f"), entities)
        ukey, inv = np.unique(key, return_inverse=True)
        known_key = np.char.add(np.char.add(self.pair_agents_, "\x1f"), self.pair_entities_)
        order = np.argsort(known_key)
        if not len(order):  # a fit on a RemoteDataset knows no pair
            return ukey, inv, None
        pos = np.minimum(np.searchsorted(known_key[order], ukey), len(order) - 1)
        return ukey, inv, np.where(known_key[order][pos] == ukey, order[pos], -1)

    def _cluster_proba(self, pairs, context, D, c, counts, labels):
        K = int(self.n_clusters)
        ukey, inv, where = pairs
        if where is None:
            lab_pair = np.full(len(ukey), -1)
        else:
            lab_pair = np.where(where >= 0, labels[where], -1)
        psi = self.global_proportions(counts)
        acounts = self._agent_counts(labels)
        ctx = {}
        if context is not None:
            for cid, cd in context.items():
                names, XtX, Xty, yty, nn = entity_statistics(
                    add_intercept(cd.X, self.fit_intercept),
                    _target(cid, cd, context, "context: "), np.asarray(cd.entity), client=cid)
                ll = entity_log_marginal(XtX, Xty, yty, nn, D, c, self.sigma)
                for j, e in enumerate(names):
                    ctx[f"{cid}\x1f{e}"] = ll[j]
        P = np.empty((len(ukey), K))
        for u, kk in enumerate(ukey):  # loop over distinct pairs, not events
            if lab_pair[u] >= 0:
                P[u] = np.eye(K)[lab_pair[u]]
                continue
            a = kk.split("\x1f", 1)[0]
            if a in acounts:
                Ni = acounts[a]
                prior = (Ni + self.beta * psi) / (Ni.sum() + self.beta)
            else:
                prior = psi
            lp = np.log(prior) + ctx.get(kk, 0.0)
            lp = np.exp(lp - lp.max())
            P[u] = lp / lp.sum()
        return P[inv]

    def predict_proba(self, agents, entities, context: FederatedDataset | None = None):
        """Posterior cluster probabilities of each row's (agent, entity) pair; (n, K).

        Known pairs: a point mass on their label. A new entity of a known agent: the agent's
        proportions ``(N_i^(k) + beta psi)/(N_i + beta)`` times the marginal likelihood
        (Theorem 1) of the entity's observed events in ``context`` (if any). A new agent: the
        global proportions ``psi`` (times the context likelihood).
        """
        check_is_fitted(self)
        return self._cluster_proba(self._pairs(agents, entities), context, self.precisions_,
                                   self.c_, self.cluster_counts_, self.labels_)

    def _prepare(self, X, agents, entities, method):
        """The checked design matrix and the rows' pairs (what every stage shares)."""
        if method not in ("map", "mean"):
            raise ValueError(f"method must be 'map' or 'mean', got {method!r}")
        X = check_features(self, X)
        if not len(agents) == len(entities) == len(X):
            raise ValueError(f"X has {len(X)} rows but agents has {len(agents)} and entities "
                             f"{len(entities)}; give one agent and one entity id per row")
        return add_intercept(X, self.fit_intercept), self._pairs(agents, entities)

    def _predict_with(self, prepared, context, method, D, c, counts, labels):
        Xa, pairs = prepared
        P = self._cluster_proba(pairs, context, D, c, counts, labels)
        W = posterior_means(D, c)
        per = Xa @ W.T  # (n, K): Theorem 2 under each cluster
        if method == "map":
            return per[np.arange(len(Xa)), P.argmax(axis=1)]
        return (P * per).sum(axis=1)

    def predict(self, X, agents, entities, context: FederatedDataset | None = None,
                method: str = "map") -> np.ndarray:
        """Predict targets (Theorem 2, ``c_k^T H_k x``).

        Parameters
        ----------
        X : array-like or DataFrame of shape (n, n_features)
            A DataFrame must have the fit's columns in the fit's order.
        agents, entities : array-like of shape (n,)
            Agent (client) and entity id of each row.
        context : FederatedDataset or None
            Observed events (with targets) of new pairs, used for their cluster posterior.
        method : {"map", "mean"}
            "map": the model of the most probable cluster; "mean": the posterior-mean prediction
            ``sum_k p(k) c_k^T H_k x``.

        Returns
        -------
        ndarray of shape (n,)
        """
        check_is_fitted(self)
        return self._predict_with(self._prepare(X, agents, entities, method), context, method,
                                  self.precisions_, self.c_, self.cluster_counts_, self.labels_)

    def predict_dataset(self, fd: FederatedDataset, context: FederatedDataset | None = None,
                        method: str = "map") -> np.ndarray:
        """Predictions for every event of ``fd`` (client order, rows in order); (n_events,)."""
        X, agents, ents = _flatten(fd)
        return self.predict(X, agents, ents, context=context, method=method)

    def staged_predict(self, fd: FederatedDataset, method: str = "map"):
        """Predictions for ``fd`` after every iteration of the last fit (not kept by save)."""
        check_is_fitted(self)
        prepared = self._prepare(*_flatten(fd), method)
        for p in self._path:
            labels = p["labels"] if p["labels"] is not None else self.labels_
            yield self._predict_with(prepared, None, method, p["D"], p["c"], p["counts"], labels)

    def mse(self, fd: FederatedDataset, context: FederatedDataset | None = None,
            method: str = "map") -> float:
        """Mean squared error on the events of ``fd``."""
        y = np.concatenate([_target(cid, cd, fd) for cid, cd in fd.items()])
        return float(np.mean((self.predict_dataset(fd, context, method) - y) ** 2))

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


class _HLCRHistory(History):
    """The engine's round records plus the per-iteration log joint and training MSE."""

    def __init__(self, records, est: HLCR):
        super().__init__(records)
        self.log_joint = list(np.asarray(est.history_log_joint_, dtype=float))
        self.train_mse = list(np.asarray(est.history_train_mse_, dtype=float))

    def to_frame(self):
        df = super().to_frame()
        n = len(df)
        df["log_joint"] = (self.log_joint + [np.nan] * n)[:n]
        df["train_mse"] = (self.train_mse + [np.nan] * n)[:n]
        return df
