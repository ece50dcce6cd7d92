"""SEC, the estimator: Select and Exchange with the learners, then Cluster on the server."""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np

from ...data.dataset import DataValidationError, FederatedDataset
from ...engine.estimator import NotFittedError, resolve_seed
from ...engine.exchange import setup_clients
from ...engine.registry import register_estimator
from ...engine.runtime import Runtime
from .candidates import _MEMORIZING, _final, make_candidates, select_model
from .clustering import (
    affinity,
    auto_affinity_scale,
    dissimilarity,
    gap_statistic,
    penalty_selection,
    selection_embedding,
    spectral_clustering,
    weighted_prediction,
)
from .model import SECModel, check_learner
from .serialize import dumps_model, loads_model, predict_many

__all__ = ["SEC"]


def _parallel_calls(runtime: Runtime, jobs: list[tuple[str, dict[str, Any]]], n_jobs):
    """The replies to (client, message) jobs: serially in waves of one message per client
    (one ``runtime.call`` each), or one call per job in joblib threads when ``n_jobs`` != 1.

    Returns the replies in the order of ``jobs``; a client that does not answer raises.
    """
    def one(cid, msg):
        rep = runtime.call([cid], "query", {cid: msg})
        if cid not in rep:
            raise RuntimeError(f"client {cid!r} did not answer the SEC {msg['query']!r} query")
        return rep[cid]

    if n_jobs in (None, 1) or len(jobs) <= 1:
        # waves of one message per client: one runtime call (one network exchange on Flower,
        # where the learners work in parallel) per wave
        out: list[Any] = [None] * len(jobs)
        todo = list(range(len(jobs)))
        while todo:
            wave: dict[str, int] = {}
            for i in todo:
                wave.setdefault(jobs[i][0], i)
            rep = runtime.call(list(wave), "query", {c: jobs[i][1] for c, i in wave.items()})
            for c, i in wave.items():
                if c not in rep:
                    raise RuntimeError(
                        f"client {c!r} did not answer the SEC {jobs[i][1]['query']!r} query")
                out[i] = rep[c]
            done = set(wave.values())
            todo = [i for i in todo if i not in done]
        return out
    from joblib import Parallel, delayed

    return Parallel(n_jobs=n_jobs, prefer="threads")(delayed(one)(c, m) for c, m in jobs)


@register_estimator(
    "sec", target=True,
    description="SEC: meta clustering of learners by select-exchange-cluster (Ye et al.)",
)
class SEC:
    """Meta clustering of learners by Select-Exchange-Cluster.

    Parameters
    ----------
    candidates : None, str, list or dict
        Candidate regressors of the Select step. None: LassoCV (half-half CV for its penalty,
        30 penalties) and a random forest of 50 trees of depth 3 (Simulation 1). A name of
        :data:`CANDIDATE_SETS` or :data:`BUILTIN_CANDIDATES`, a list of names and/or
        scikit-learn regressors (pipelines too), a dict ``{name: regressor}``, or a dict
        ``{client_id: any of the above}`` when learners differ (clients not listed use the
        default). Unfitted candidates travel to the learners as skops bytes. Instance-based
        regressors (KNN, SVR, kernel ridge, GP) carry training samples inside the fitted model;
        a warning says so when they are used.
    n_clusters : int or None
        K. None: chosen by ``k_selection``.
    k_selection : {"gap", "penalty"}
        Gap statistic (default; Tibshirani's rule) or the penalty ``W_K + K * lambda_n`` of
        Remark 2, both on the eigenvalue-weighted spectral embedding
        (:func:`selection_embedding`). The gap statistic misses three or more equidistant
        clusters (see :func:`gap_statistic`); the penalty finds them.
    max_clusters : int
        Largest K considered when K is chosen (also at most ``max(2, L // 2)``).
    affinity_scale : "auto" or float
        ``a`` in ``S = exp(-a V)``. "auto": ``1 / median`` of the off-diagonal dissimilarities
        (:func:`auto_affinity_scale`).
    standardize : bool
        Standardize X and y within each learner (Section 5). Turn off when the learners'
        response levels are the signal (the fairness example: standardizing y removes the
        learner-level intercept ``b R_i``).
    penalty : float or None
        ``lambda_n`` for ``k_selection="penalty"``. None: ``L / mean(n_i)`` (Remark 2 suggests
        ``lambda_n = O(max(1/n, u_n^4))`` per learner; the dispersion sums over L learners).
    n_init : int
        k-means restarts.
    n_refs : int
        Reference data sets of the gap statistic.
    gap_rule : {"tibshirani", "global"}
        Rule of the gap statistic (:func:`gap_statistic`). "global" suits learners spread along
        a continuum (the fairness example), where Tibshirani's rule often stops at K = 1.
    n_jobs : int or None
        Threads for the Select and Exchange queries (joblib, one runtime call per learner);
        None or 1: serial. In process the work is mostly GIL-bound (benchmarks/bench_sec.py
        measures threads 1.3-2.3x slower); a runtime whose learners are remote gains from it.
    exchange_batch : int
        Models per exchange message.
    random_state : int, Generator or None

    Attributes
    ----------
    learner_ids_ : list of str
    labels_ : ndarray of shape (L,)
    n_clusters_ : int
    dissimilarity_ : ndarray of shape (L, L)
        V, eq. (2).
    similarity_ : ndarray of shape (L, L)
        S = exp(-a V).
    affinity_scale_ : float
    eigenvalues_ : ndarray of shape (L,)
        Eigenvalues of the normalized affinity, largest first.
    embedding_ : ndarray of shape (L, n_clusters_)
        Row-normalized top eigenvectors (Algorithm 1, step 2c).
    exchange_losses_ : ndarray of shape (L, L)
        ``E[i, j] = e_{i->j}``.
    errors_ : ndarray of shape (L,)
        In-sample MSE ``e_i`` of each learner's selected model.
    n_samples_ : ndarray of shape (L,)
    selected_ : list of str
        Name of the candidate each learner selected.
    cv_mse_ : ndarray of shape (L, n_candidates) (NaN-padded when learners differ)
    models_ : list of ndarray (uint8)
        Each learner's fitted model as skops bytes.
    k_selection_info_ : dict
        Per-K dispersion and gap (or penalized objective), when K was chosen.

    References
    ----------
    Ye, Ghanadan and Ding, "Meta Clustering for Collaborative Learning" (2023), Section 3:
    Select eq. (1), Exchange eq. (2), Cluster Algorithm 1, K by Remark 2, prediction eq. (4).
    """

    def __init__(
        self,
        candidates: Any = None,
        n_clusters: int | None = None,
        k_selection: str = "gap",
        max_clusters: int = 10,
        affinity_scale: str | float = "auto",
        standardize: bool = True,
        penalty: float | None = None,
        n_init: int = 10,
        n_refs: int = 20,
        gap_rule: str = "tibshirani",
        n_jobs: int | None = None,
        exchange_batch: int = 64,
        random_state: Any = None,
    ):
        self.candidates = candidates
        self.n_clusters = n_clusters
        self.k_selection = k_selection
        self.max_clusters = max_clusters
        self.affinity_scale = affinity_scale
        self.standardize = standardize
        self.penalty = penalty
        self.n_init = n_init
        self.n_refs = n_refs
        self.gap_rule = gap_rule
        self.n_jobs = n_jobs
        self.exchange_batch = exchange_batch
        self.random_state = random_state

    # ---- validation --------------------------------------------------------------------------
    def _validate_params(self) -> None:
        if self.gap_rule not in ("tibshirani", "global"):
            raise ValueError(f"gap_rule must be 'tibshirani' or 'global', got {self.gap_rule!r}")
        if self.k_selection not in ("gap", "penalty"):
            raise ValueError(f"k_selection must be 'gap' or 'penalty', got {self.k_selection!r}")
        if self.n_clusters is not None and (
            not isinstance(self.n_clusters, int | np.integer) or self.n_clusters < 1
        ):
            raise ValueError(
                f"n_clusters must be a positive integer or None, got {self.n_clusters!r}"
            )
        if not isinstance(self.max_clusters, int | np.integer) or self.max_clusters < 1:
            raise ValueError(f"max_clusters must be a positive integer, got {self.max_clusters!r}")
        if isinstance(self.affinity_scale, str):
            if self.affinity_scale != "auto":
                raise ValueError(
                    "affinity_scale must be 'auto' or a positive number, "
                    f"got {self.affinity_scale!r}"
                )
        elif not (float(self.affinity_scale) > 0):
            raise ValueError(f"affinity_scale must be positive, got {self.affinity_scale!r}")
        if self.penalty is not None and not float(self.penalty) >= 0:
            raise ValueError(f"penalty must be non-negative, got {self.penalty!r}")
        for nm in ("n_init", "n_refs", "exchange_batch"):
            v = getattr(self, nm)
            if not isinstance(v, int | np.integer) or v < 1:
                raise ValueError(f"{nm} must be a positive integer, got {v!r}")

    def _is_per_learner(self, cids: list[str]) -> bool:
        spec = self.candidates
        return isinstance(spec, Mapping) and bool(spec) and all(str(k) in set(cids) for k in spec)

    def _common_spec(self, cids: list[str]) -> Any:
        """The candidate spec of learners without their own (the default when per-learner)."""
        return None if self._is_per_learner(cids) else self.candidates

    def _per_learner(self, cids: list[str]) -> dict[str, list[tuple[str, Any]]]:
        per: dict[str, Any] = {}
        if self._is_per_learner(cids):
            per = {str(k): v for k, v in self.candidates.items()}
        common = make_candidates(self._common_spec(cids))
        out = {c: (make_candidates(per[c]) if c in per else common) for c in cids}
        mem = sorted({type(_final(e)).__name__ for lst in out.values() for _, e in lst
                      if type(_final(e)).__name__ in _MEMORIZING})
        if mem:
            warnings.warn(
                f"candidates {mem} store training samples inside the fitted model; shipping "
                "such a model in the Exchange step ships samples", UserWarning, stacklevel=3,
            )
        return out

    def _describe_local(self, fd: FederatedDataset) -> dict:
        """A node's checks of its own learner data (a deployment)."""
        self._validate_params()
        for cid, cd in fd.items():
            check_learner(cid, cd.X, cd.y, fd.target_name or "y")
        return {}

    def _validate_data(self, fd: FederatedDataset) -> None:
        remote = getattr(fd, "is_remote", False)
        if not isinstance(fd, FederatedDataset) and not remote:
            raise TypeError(
                f"fit expects a fl.FederatedDataset, got {type(fd).__name__}; build one with "
                "FederatedDataset.from_pandas or from_arrays"
            )
        if not remote:  # on a RemoteDataset every node ran check_learner (_describe_local)
            for cid, cd in fd.items():
                check_learner(cid, cd.X, cd.y, fd.target_name or "y")
        L = fd.n_clients
        if L < 2:
            raise DataValidationError(f"SEC clusters learners and needs at least 2, got {L}")
        if self.n_clusters is not None and self.n_clusters > L:
            raise ValueError(
                f"n_clusters={self.n_clusters} is larger than the number of learners ({L}); "
                f"give n_clusters <= {L} or None to choose K from the data"
            )

    # ---- protocol steps ----------------------------------------------------------------------
    def _setup(self, runtime: Runtime, cids: list[str]) -> SECModel:
        model = SECModel(standardize=bool(self.standardize))
        setup_clients(runtime, model)
        return model

    def _run_select(self, runtime, cids, cands, seed) -> dict[str, dict[str, Any]]:
        encoded: dict[int, dict[str, Any]] = {}
        jobs = []
        for c in cids:
            lst = cands[c]
            key = id(lst)
            if key not in encoded:
                msg: dict[str, Any] = {"query": "select", "seed": int(seed),
                                       "candidate_names": json.dumps([n for n, _ in lst])}
                for k, (_, est) in enumerate(lst):
                    msg[f"candidate/{k}"] = dumps_model(est)
                encoded[key] = msg
            jobs.append((c, encoded[key]))
        replies = _parallel_calls(runtime, jobs, self.n_jobs)
        out = {}
        for c, rep in zip(cids, replies):
            for key in ("model", "e", "n", "selected", "cv_mse"):
                if key not in rep:
                    raise RuntimeError(f"client {c!r}: select reply misses {key!r}")
            if not np.isfinite(float(rep["e"])):
                raise RuntimeError(f"client {c!r}: in-sample MSE is not finite")
            out[c] = rep
        return out

    def _run_exchange(self, runtime, receivers, blobs, seed) -> np.ndarray:
        """``E[i, j]``: loss of model i on receiver j (one message per receiver and batch)."""
        m = len(blobs)
        bsz = int(self.exchange_batch)
        jobs, where = [], []
        for j, c in enumerate(receivers):
            for s in range(0, m, bsz):
                msg = {"query": "exchange", "seed": int(seed), "offset": s}
                for k in range(s, min(s + bsz, m)):
                    msg[f"model/{k - s}"] = blobs[k]
                jobs.append((c, msg))
                where.append((j, s))
        replies = _parallel_calls(runtime, jobs, self.n_jobs)
        E = np.empty((m, len(receivers)))
        for (j, s), (c, _), rep in zip(where, jobs, replies):
            loss = np.asarray(rep.get("loss"), dtype=np.float64).reshape(-1)
            want = min(s + bsz, m) - s
            if loss.shape[0] != want or not np.all(np.isfinite(loss)):
                raise RuntimeError(
                    f"client {c!r}: exchange reply has {loss.shape[0]} losses (expected {want}) "
                    "or non-finite values"
                )
            E[s : s + want, j] = loss
        return E

    # ---- fit ---------------------------------------------------------------------------------
    def fit(self, fd: FederatedDataset, *, runtime: Runtime | None = None) -> SEC:
        """Run Select, Exchange and Cluster on the learners of ``fd``.

        Parameters
        ----------
        fd : FederatedDataset
            One client per learner, with a target.
        runtime : Runtime or None
            Transport to the learners; default: in-process learners built from ``fd``.

        Returns
        -------
        self
        """
        from ...engine.inprocess import InProcessRuntime

        self._validate_params()
        self._validate_data(fd)
        seed = resolve_seed(self.random_state)
        cids = fd.client_ids
        cands = self._per_learner(cids)
        runtime = runtime if runtime is not None else InProcessRuntime(fd)
        self._setup(runtime, cids)
        sel = self._run_select(runtime, cids, cands, seed)
        blobs = [np.asarray(sel[c]["model"], dtype=np.uint8) for c in cids]
        E = self._run_exchange(runtime, cids, blobs, seed)
        e = np.array([float(sel[c]["e"]) for c in cids])

        self.seed_ = seed
        self.learner_ids_ = list(cids)
        self.feature_names_in_ = list(fd.feature_names)
        self.n_features_in_ = fd.n_features
        self.models_ = blobs
        self.errors_ = e
        self.n_samples_ = np.array([int(sel[c]["n"]) for c in cids])
        self.selected_ = [cands[c][int(sel[c]["selected"])][0] for c in cids]
        width = max(len(cands[c]) for c in cids)
        self.cv_mse_ = np.full((len(cids), width), np.nan)
        for i, c in enumerate(cids):
            cv = np.asarray(sel[c]["cv_mse"], dtype=np.float64)
            self.cv_mse_[i, : cv.size] = cv
        self.candidate_names_ = [n for n, _ in cands[cids[0]]]
        if self.standardize:
            self.scalers_ = {c: (np.asarray(sel[c]["x_mean"], dtype=np.float64),
                                 np.asarray(sel[c]["x_scale"], dtype=np.float64),
                                 float(sel[c]["y_mean"]), float(sel[c]["y_scale"])) for c in cids}
        else:
            self.scalers_ = {}
        self.exchange_losses_ = E
        self._cluster(E, e, seed)
        return self

    def _cluster(self, E: np.ndarray, e: np.ndarray, seed: int) -> None:
        V = dissimilarity(E, e)
        a = auto_affinity_scale(V) if self.affinity_scale == "auto" else float(self.affinity_scale)
        S = affinity(V, a)
        L = S.shape[0]
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x5EC,)))
        info: dict[str, Any] = {}
        if self.n_clusters is not None:
            k = int(self.n_clusters)
        else:
            # at most L/2 clusters: beyond, clusters are mostly singletons and the dispersion
            # of k-means on L points carries no information (W_L = 0 for data and references)
            kmax = min(int(self.max_clusters), max(2, L // 2))
            Y = selection_embedding(S, kmax)
            if self.k_selection == "gap":
                k, info = gap_statistic(Y, kmax, self.n_refs, self.n_init, rng, self.gap_rule)
            else:
                lam = (L / float(np.mean(self.n_samples_)) if self.penalty is None
                       else float(self.penalty))
                k, info = penalty_selection(Y, kmax, lam, self.n_init, rng)
        labels, U, w = spectral_clustering(S, k, self.n_init, rng)
        self.dissimilarity_ = V
        self.affinity_scale_ = float(a)
        self.similarity_ = S
        self.eigenvalues_ = w
        self.embedding_ = U
        self.labels_ = labels
        self.n_clusters_ = int(np.unique(labels).size)
        self.k_selection_info_ = info

    # ---- persistence (no pickle) ---------------------------------------------------------------
    _array_attrs = ("errors_", "n_samples_", "cv_mse_", "exchange_losses_", "dissimilarity_",
                    "similarity_", "eigenvalues_", "embedding_", "labels_")

    def save(self, path) -> None:
        """Write ``<path>.npz`` (arrays, the learners' skops bytes) and ``<path>.json``."""
        from ...engine.checkpoint import save_arrays_json
        from ...engine.registry import estimator_config

        self._check_fitted()
        arrays = {k: np.asarray(getattr(self, k)) for k in self._array_attrs}
        for i, b in enumerate(self.models_):
            arrays[f"models/{i}"] = np.asarray(b, dtype=np.uint8)
        for c, (m, sc, ym, ys) in self.scalers_.items():
            arrays[f"scalers/{c}/x_mean"] = m
            arrays[f"scalers/{c}/x_scale"] = sc
            arrays[f"scalers/{c}/y"] = np.array([ym, ys])
        info = {}
        for k, v in self.k_selection_info_.items():
            if isinstance(v, np.ndarray):
                arrays[f"kinfo/{k}"] = v
            else:
                info[k] = v.item() if hasattr(v, "item") else v
        try:
            params = estimator_config(self)[1]
        except ValueError:  # candidates given as objects: keep the names only
            params = {"candidates": None}
        meta = {
            "class": "SEC", "params": params, "k_selection_info": info,
            "fitted": {"seed_": int(self.seed_), "learner_ids_": list(self.learner_ids_),
                       "feature_names_in_": list(self.feature_names_in_),
                       "selected_": list(self.selected_),
                       "candidate_names_": list(self.candidate_names_),
                       "affinity_scale_": float(self.affinity_scale_),
                       "n_clusters_": int(self.n_clusters_)},
        }
        save_arrays_json(path, arrays, meta)

    @classmethod
    def load(cls, path) -> SEC:
        """Read what :meth:`save` wrote."""
        from ...engine.checkpoint import load_arrays_json

        arrays, meta = load_arrays_json(path)
        if meta.get("class") != "SEC":
            raise ValueError(f"{path} holds a {meta.get('class')}, not a SEC")
        est = cls(**{k: v for k, v in meta["params"].items() if k != "federation"})
        for k in cls._array_attrs:
            setattr(est, k, arrays[k])
        for k, v in meta["fitted"].items():
            setattr(est, k, v)
        est.n_features_in_ = len(est.feature_names_in_)
        n = len(est.learner_ids_)
        est.models_ = [arrays[f"models/{i}"] for i in range(n)]
        est.scalers_ = {}
        for c in est.learner_ids_:
            if f"scalers/{c}/y" in arrays:
                y = arrays[f"scalers/{c}/y"]
                est.scalers_[c] = (arrays[f"scalers/{c}/x_mean"], arrays[f"scalers/{c}/x_scale"],
                                   float(y[0]), float(y[1]))
        info = dict(meta["k_selection_info"])
        info.update({k[6:]: v for k, v in arrays.items() if k.startswith("kinfo/")})
        est.k_selection_info_ = info
        return est

    # ---- use ---------------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "labels_"):
            raise NotFittedError("this SEC is not fitted yet; call fit(fd) before using it")

    @property
    def selected_models_(self) -> dict[str, Any]:
        """Each learner's fitted model (loaded from its skops bytes), by learner id."""
        self._check_fitted()
        return {c: loads_model(b) for c, b in zip(self.learner_ids_, self.models_)}

    def clusters(self) -> dict[int, list[str]]:
        """Cluster label -> learner ids."""
        self._check_fitted()
        return {int(k): [c for c, lab in zip(self.learner_ids_, self.labels_) if lab == k]
                for k in np.unique(self.labels_)}

    def _raw_predictions(self, X: np.ndarray, members: list[int], scale_of: str | None):
        """Predictions of the members' models on the raw scale: each model with its own
        learner's scaling, or all with learner ``scale_of``'s scaling."""
        models = [loads_model(self.models_[i]) for i in members]
        if not self.standardize:
            return predict_many(models, X)
        if scale_of is not None:
            xm, xs, ym, ys = self.scalers_[scale_of]
            return ym + ys * predict_many(models, (X - xm) / xs)
        out = np.empty((len(members), X.shape[0]))
        for r, (i, m) in enumerate(zip(members, models)):
            xm, xs, ym, ys = self.scalers_[self.learner_ids_[i]]
            out[r] = ym + ys * predict_many([m], (X - xm) / xs)[0]
        return out

    def predict(self, X, learner: str | None = None, cluster: int | None = None,
                pooled: bool = False) -> np.ndarray:
        """Collaborative prediction within a cluster.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        learner : str, optional
            Predict for this learner: its cluster's models, applied the way the learner applies
            received models (on X standardized with its own constants, back on its y scale).
        cluster : int, optional
            Predict with this cluster's models, each on its own learner's raw scale.
        pooled : bool
            Use the cluster's model refitted on pooled data (:meth:`fit_pooled`) instead of
            eq. (4); only where pooling the learners' data is allowed.

        Returns
        -------
        ndarray of shape (n_samples,)
            Eq. (4): the sample-size weighted average of the cluster's models.
        """
        self._check_fitted()
        if (learner is None) == (cluster is None):
            raise ValueError("give exactly one of learner=... or cluster=...")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X must have shape (n_samples, {self.n_features_in_}), got {X.shape}"
            )
        if learner is not None:
            learner = str(learner)
            if learner not in self.learner_ids_:
                raise ValueError(f"unknown learner {learner!r}; known: {self.learner_ids_[:5]}...")
            cluster = int(self.labels_[self.learner_ids_.index(learner)])
        cluster = int(cluster)
        if cluster not in set(int(k) for k in self.labels_):
            raise ValueError(f"unknown cluster {cluster}; clusters are 0..{self.n_clusters_ - 1}")
        if pooled:
            if not hasattr(self, "pooled_models_"):
                raise NotFittedError("pooled=True needs fit_pooled(fd) first")
            return np.asarray(self.pooled_models_[cluster].predict(X), dtype=np.float64)
        members = [i for i, lab in enumerate(self.labels_) if lab == cluster]
        P = self._raw_predictions(X, members, learner if self.standardize else None)
        return weighted_prediction(P, self.n_samples_[members])

    def fit_pooled(self, fd: FederatedDataset, estimator: Any = None) -> SEC:
        """Fit one model per cluster on the pooled data of its learners (Remark 3, case 2).

        This moves samples to one place: use it only where pooling is allowed. ``estimator``
        None selects among the candidates by half-half cross-validation on the pooled data.
        """
        from sklearn.base import clone

        self._check_fitted()
        rng = np.random.default_rng(np.random.SeedSequence(self.seed_, spawn_key=(0x9001,)))
        self.pooled_models_ = {}
        for k, members in self.clusters().items():
            X = np.vstack([fd[c].X for c in members])
            y = np.concatenate([np.asarray(fd[c].y, dtype=np.float64) for c in members])
            if estimator is None:
                cands = make_candidates(self._common_spec(self.learner_ids_))
                _, model, _, _ = select_model(X, y, cands, rng)
            else:
                model = clone(estimator).fit(X, y)
            self.pooled_models_[k] = model
        return self

    def assign(self, new_fd: FederatedDataset, runtime: Runtime | None = None) -> np.ndarray:
        """Place new learners in the fitted clusters (largest summed similarity, Section 4).

        The new learners run Select with the common candidates and evaluate every fitted
        learner's model on their data (``e_{i->t}``). If ``runtime`` reaches the fitted learners
        (for example ``InProcessRuntime(fd)`` or the runtime given to :meth:`fit`), the new
        models are also sent to them (``e_{t->i}``) and ``v_ti`` is eq. (2); otherwise the
        missing direction is replaced by the available one, ``v_ti = 2 |e_{i->t} - e_t|``.

        Parameters
        ----------
        new_fd : FederatedDataset
        runtime : Runtime or None

        Returns
        -------
        labels : ndarray of shape (n_new_learners,)
            In ``new_fd.client_ids`` order. ``assign_similarity_`` holds the (n_new, L)
            similarities to the fitted learners.
        """
        from ...engine.inprocess import InProcessRuntime

        self._check_fitted()
        if not isinstance(new_fd, FederatedDataset):
            raise TypeError(f"assign expects a fl.FederatedDataset, got {type(new_fd).__name__}")
        if new_fd.n_features != self.n_features_in_:
            raise DataValidationError(
                f"new learners have {new_fd.n_features} features; the fitted learners had "
                f"{self.n_features_in_}"
            )
        for cid, cd in new_fd.items():
            check_learner(cid, cd.X, cd.y, new_fd.target_name or "y")
        new_ids = new_fd.client_ids
        rt_new = InProcessRuntime(new_fd)
        self._setup(rt_new, new_ids)
        common = make_candidates(self._common_spec(self.learner_ids_))
        sel = self._run_select(rt_new, new_ids, {c: common for c in new_ids}, self.seed_ + 1)
        e_new = np.array([float(sel[c]["e"]) for c in new_ids])
        E_to_new = self._run_exchange(rt_new, new_ids, self.models_, self.seed_)  # (L, T)
        D1 = np.abs(E_to_new - e_new[None, :]).T  # (T, L): |e_{i->t} - e_t|
        if runtime is not None:
            blobs = [np.asarray(sel[c]["model"], dtype=np.uint8) for c in new_ids]
            self._setup(runtime, self.learner_ids_)
            E_from_new = self._run_exchange(runtime, self.learner_ids_, blobs, self.seed_)  # (T, L)
            V = D1 + np.abs(E_from_new - self.errors_[None, :])
        else:
            V = 2.0 * D1
        S = affinity(V, self.affinity_scale_)
        ks = np.unique(self.labels_)
        score = np.stack([S[:, self.labels_ == k].sum(1) for k in ks], axis=1)
        self.assign_similarity_ = S
        return ks[score.argmax(1)]

