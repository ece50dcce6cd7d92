"""SEC, the estimator: Select and Exchange with the learners, then Cluster on the server.

On the base estimator's hooks (it never overrides ``fit``): ``_validate_data`` checks every
learner and resolves the candidates before any message, ``_make_model`` gives the learners'
:class:`~.model.SECModel`, ``_initialize`` has nothing to ask, ``_run`` runs the protocol
(:mod:`.protocol`: Select and Exchange through ``ctx.ask``, every reply checked; then
:meth:`SEC._cluster`), ``_store`` / ``_after_load`` / ``_save_extra`` hold the fitted learners'
models as skops bytes in one uint8 array (no pickle). Prediction, pooled models and new learners
(``assign``) are in :mod:`.predict`.
"""

from __future__ import annotations

import secrets
import time
import warnings
from typing import Any

import numpy as np

from ...data.dataset import DataValidationError, FederatedDataset
from ...engine.contract.model import Capabilities, Params
from ...engine.contract.params import ROUND_LOOP, Integer, Options, Real, store_params
from ...engine.contract.registry import register_estimator
from ...engine.estimation.estimator import FederatedEstimator, FitContext
from ...engine.fedem.history import History, RoundRecord
from ...engine.rounds.loop import FitResult, LoopOptions, progress_bar
from ...engine.stats import Stats, units_number
from .candidates import per_learner_candidates
from .clustering import (
    affinity,
    auto_affinity_scale,
    default_max_clusters,
    dissimilarity,
    gap_statistic,
    penalty_selection,
    selection_embedding,
    spectral_clustering,
)
from .model import SECModel, check_learner
from .predict import ClusterUseMixin
from .protocol import Traffic, exchange_step, select_step, sender, validate_step
from .serialize import UntrustedModelError, check_extra_types, check_model, dumps_model
from .summary import SECSummary

__all__ = ["SEC", "warn_target_scales"]

#: a learner predicts with its cluster when the cluster's out-of-fold MSE is below its own by
#: more than this many standard errors of their difference over the validation folds
#: (``collaboration="validated"``; cross-validation's one-standard-error rule, Hastie et al.
#: section 7.10: :func:`~.model.fold_se`). On Produc's training years alone (windows 1978-80
#: and 1981-83, each predicted from the years before; ``sec_produc(end_year=1980 | 1983)``)
#: it predicted 1.083x and 0.915x the states' own models, the rows' standard error before it
#: 1.087x and 0.900x; 1984-86 held out: 0.974x (17 of 48 states in their cluster) against
#: 1.014x (19). No rule tried (0-2 standard errors, random, systematic, leave-one-out,
#: repeated or forward folds, a stacked blend) was no worse than alone on both windows
COLLABORATE_SE = 1.0
#: learners' target standard deviations this many times apart, unstandardized: a warning
SCALE_RATIO_WARNING = 10.0


def warn_target_scales(ids: list[str], scales: list[float], target: str | None = None,
                       ratio: float = SCALE_RATIO_WARNING) -> bool:
    """Warn when the learners' target standard deviations differ by ``ratio`` or more.

    Without standardization, V (eq. 2) compares raw MSEs, so it is set by the learners whose
    response varies most, and a model received from a learner of another scale predicts badly
    (on ``Cigar``, collaborative prediction up to 12 times worse than a learner alone).

    Parameters
    ----------
    ids : list of str
        The learners.
    scales : list of float
        Standard deviation of each learner's target.
    target : str, optional
        The target column's name, for the message.

    Returns
    -------
    bool
        Whether it warned.
    """
    sd = np.asarray(scales, dtype=np.float64)
    lo, hi = int(np.argmin(sd)), int(np.argmax(sd))
    if not sd[lo] > 0 or sd[hi] / sd[lo] < ratio:
        return False
    order = np.argsort(sd)
    small = ", ".join(f"{ids[i]!r} {sd[i]:.3g}" for i in order[:3])
    large = ", ".join(f"{ids[i]!r} {sd[i]:.3g}" for i in order[::-1][:3])
    warnings.warn(
        f"the learners' target {target or 'y'!r} scales differ by a factor of "
        f"{sd[hi] / sd[lo]:.3g} (standard deviation, smallest: {small}; largest: {large}) and "
        "standardize=False: the dissimilarities compare raw MSEs, so the learners of large "
        "variance decide the clusters and models cross between scales; use standardize=True "
        "unless the response levels are the signal", UserWarning, stacklevel=3)
    return True


@register_estimator(
    "sec", target=True,
    description="SEC: meta clustering of learners by select-exchange-cluster (Ye et al.)",
)
class SEC(SECSummary, ClusterUseMixin, FederatedEstimator):
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
    split : {"systematic", "random"}
        The Select step's half split on each learner (:func:`select_model`). "systematic"
        (default): rows 0, 2, 4, ... fit and rows 1, 3, 5, ... validate, and candidates
        without their own ``random_state`` get a fixed one, so a learner's selected model, and
        V, are functions of its data: the seed then moves nothing but the k-means restarts.
        The split only estimates each candidate's prediction error; on the ``Cigar`` panel
        (:func:`fedlatent.experiments.sec_real`) a random split made about a third of the
        learners select another candidate from one seed to the next, enough to move learners
        between clusters: with the penalty, three seeds gave K = 2, 1, 2 (pairwise ARI 0.0 to
        0.47). "random": the paper's random half split, the candidates seeded from
        ``random_state`` (the default before issue 14).
    n_clusters : int or None
        K. None: chosen by ``k_selection``.
    k_selection : {"penalty", "gap"}
        The penalty ``W_K + K * lambda_n`` of Remark 2 (default) or the gap statistic, both on
        the eigenvalue-weighted spectral embedding (:func:`selection_embedding`). The penalty
        is the paper's own criterion (Remark 2, with its consistency result) and, unlike the
        gap statistic, draws nothing: K depends on the seed only through V. On a real panel
        without clear groups (46 US states' cigarette demand in levels, Ecdat's ``Cigar``) the
        gap statistic chose K from 4 to 9 for one fixed V as its seed changed (ARI with the
        first seed down to 0.32); the penalty chose K = 2 for every seed and V (ARI 1.0). The gap
        statistic (Tibshirani's rule) misses
        three or more equidistant clusters (see :func:`gap_statistic`); the paper's simulations
        use it (``k_selection="gap"``, the default before issue 14).
    max_clusters : int or None
        Largest K considered when K is chosen, at most ``max(2, L // 2)``. None:
        :func:`default_max_clusters` (``round(sqrt(2 L))``: 6 for 20 learners, 10 for 46). When
        the chosen K equals this cap, a warning says so (the criterion may want more).
    affinity_scale : "auto" or float
        ``a`` in ``S = exp(-a V)``. "auto": ``1 / mean`` of the off-diagonal dissimilarities
        (:func:`auto_affinity_scale`, which says why the mean rather than the median).
    standardize : bool
        Standardize X and y within each learner (Section 5). Turn off when the learners'
        response levels are the signal (the fairness example: standardizing y removes the
        learner-level intercept ``b R_i``). Without it, V compares raw MSEs, so learners with
        a large response variance dominate it: a UserWarning names the learners when their
        targets' standard deviations differ by a factor of 10 or more.
    penalty : float or None
        ``lambda_n`` for ``k_selection="penalty"``. None: ``L / mean(n_i)`` (Remark 2 suggests
        ``lambda_n = O(max(1/n, u_n^4))`` per learner; the dispersion sums over L learners).
    n_init : int
        k-means restarts (k-means++ seeding; the best inertia wins).
    n_refs : int
        Reference data sets of the gap statistic.
    gap_rule : {"tibshirani", "global"}
        Rule of the gap statistic (:func:`gap_statistic`). "global" suits learners spread along
        a continuum (the fairness example), where Tibshirani's rule often stops at K = 1.
    n_jobs : int or None
        Threads for the Select and Exchange queries (joblib threads, one checked ``ask`` per
        message); None or 1: waves of one message per learner, one ``ask`` each. In process
        the work is mostly GIL-bound (benchmarks/bench_sec.py measures threads 1.3-2.3x
        slower); a runtime whose learners are remote gains from it.
    exchange_batch : int
        Models per exchange message.
    random_state : int, Generator or None
    extra_trusted_types : list of str or None
        Your own candidate estimator classes, by the full name skops writes
        (``type(est).__module__ + "." + type(est).__qualname__``), added to the exact allow-list
        of types a model file may contain (:data:`~.serialize.TRUSTED_TYPES`: the built-in
        candidates, NumPy arrays, plain containers). Only :class:`sklearn.base.BaseEstimator`
        subclasses can be added (no function, nothing of the standard library). Every learner
        (each node of a deployment, which gets this list with the model) and every load of a
        saved model check the types of a model before building it; a model naming any other
        type is refused with an ``UntrustedModelError`` naming the learner and the type.
    collaboration : {"validated", "always"}, default "validated"
        "validated": after clustering, every learner of a cluster of two or more compares,
        out of fold on its own rows (5 folds, :func:`~.candidates.out_of_fold`), its own
        selected model with its cluster's prediction (eq. 4 with that refit in place of its
        model; the other members' models never saw its rows), and ``predict(learner=...)``
        uses the cluster only where it did better by more than one standard error of the
        difference over the folds (cross-validation's one-standard-error rule;
        ``collaborates_``, :data:`COLLABORATE_SE`); a learner keeps its own model otherwise,
        so the defaults are no worse than each learner alone on its validation rows. One
        more step of messages (each learner receives its cluster's models again). On US
        states' production panel (plm's Produc, 1984-86 held out) the paper's rule
        ("always") predicted 1.32x worse than each state's own model, this one 0.974x (0.81x
        each state's own OLS; :func:`fedlatent.experiments.sec_produc`).
        "always": every learner predicts with its cluster (the paper's eq. 4).
    federation : fl.Federation or None
        Only its ``disclosure`` policy applies (SEC is one-shot: no rounds to configure). By
        default tree candidates are fitted with ``min_samples_leaf >= tree_min_leaf`` (3) and
        candidates whose fitted models store training rows (``knn``, ``svr``) are refused by
        every learner; ``fl.Federation(disclosure=fl.DisclosurePolicy(
        allow_row_storing_learners=True))`` allows them.

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
    collaborates_ : ndarray of bool, shape (L,)
        Whether each learner predicts with its cluster (``collaboration="validated"``: its
        cluster did better on its validation rows; True for a learner alone in its cluster,
        whose cluster is its own model, and for every learner under "always").
    validation_mse_ : ndarray of shape (L, 3)
        Per learner, the out-of-fold MSE of its own model and of its cluster's prediction,
        and the standard error of their difference over the folds (standardized scale when
        ``standardize``; NaN where nothing was compared).
    n_iter_ : int
        Protocol steps that exchanged messages with the learners: 3 (Select, Exchange,
        Validate; 2 with ``collaboration="always"``); ``history_`` has one record per step
        (bytes, seconds, mean MSE), ``converged_`` is True.
    feature_names_in_ : ndarray of str
    n_features_in_ : int

    Notes
    -----
    Where the seed enters: the learners' Select step (the half split of eq. 1 and the
    ``random_state`` of candidates that leave it unset, e.g. the random forest) and, on the
    server, the k-means restarts and the gap statistic's reference draws. With the former
    defaults (random split, gap statistic, K <= 10) three seeds agreed at ARI 0.41-0.60 on
    ``Cigar`` (:func:`fedlatent.experiments.sec_real`'s panel): the gap statistic moved K and
    the partition with the seed even for a fixed V, and the random split changed about a third
    of the learners' selected candidates, hence V. The defaults remove
    both: the systematic split makes V a function of the data, and the penalty (Remark 2)
    draws nothing; only the k-means restarts (``n_init``, k-means++) still use the seed, and
    they agree on the optimum for the small K the penalty picks: five seeds give the same
    clusters (ARI 1.0) on ``Cigar``.

    SEC is a one-shot protocol, not EM: the base estimator's ``fit`` calls :meth:`_run` (Select
    and Exchange through the engine's checked exchange, then Cluster on the server) instead of
    the round loop. A learner that does not answer, or answers a non-finite loss, an empty
    model..., stops the fit with a ``FederatedFitError`` naming it.

    References
    ----------
    Ye, Ghanadan and Ding, "Meta Clustering for Collaborative Learning" (2023), Section 3:
    Select eq. (1), Exchange eq. (2), Cluster Algorithm 1, K by Remark 2, prediction eq. (4).
    """

    _parameter_constraints = {
        **ROUND_LOOP,
        # candidates: resolved by make_candidates at fit, whose errors name the candidate
        "split": [Options("systematic", "random")],
        "n_clusters": [None, Integer(1)],
        "k_selection": [Options("gap", "penalty")],
        "max_clusters": [None, Integer(1)],
        "affinity_scale": [Real(0, closed="neither", desc="positive"), Options("auto")],
        "standardize": ["boolean"],
        "penalty": [None, Real(0)],
        "n_init": [Integer(1)],
        "n_refs": [Integer(1)],
        "gap_rule": [Options("tibshirani", "global")],
        "n_jobs": [None, Integer()],
        "exchange_batch": [Integer(1)],
        "extra_trusted_types": [None, list, tuple],
        "collaboration": [Options("validated", "always")],
    }

    def __init__(
        self,
        candidates: Any = None,
        split: str = "systematic",
        n_clusters: int | None = None,
        k_selection: str = "penalty",
        max_clusters: int | None = None,
        affinity_scale: str | float = "auto",
        standardize: bool = True,
        penalty: float | None = None,
        n_init: int = 10,
        n_refs: int = 20,
        gap_rule: str = "tibshirani",
        n_jobs: int | None = None,
        exchange_batch: int = 64,
        random_state: Any = None,
        extra_trusted_types: list[str] | None = None,
        federation: Any = None,
        collaboration: str = "validated",
    ):
        store_params(self, locals())

    _save_arrays = ("errors_", "n_samples_", "cv_mse_", "exchange_losses_", "dissimilarity_",
                    "similarity_", "eigenvalues_", "embedding_", "labels_", "_model_bytes",
                    "_model_sizes", "_scaler_x", "_scaler_y")
    _score_name = "mean squared error"
    capabilities = Capabilities(secure_refusal=(
        "SEC's replies are fitted local models and per-pair losses, not "
        "sums, so there is nothing for secure aggregation to add up"), privacy_refusal=(
        "SEC ships each learner's fitted model (any scikit-learn estimator: trees, kernels, "
        "lasso...) and its losses on the other learners' models, not sums of bounded records, "
        "so no clipping bounds their sensitivity and Gaussian noise has nothing to calibrate "
        "to; private SEC would need differentially private learners (DP-SGD, objective "
        "perturbation) and a private selection step, which fedlatent does not provide"))
    _load_nonfinite = ("cv_mse_",)  # NaN: fewer candidates; inf: a candidate that failed

    def _per_learner(self, cids: list[str], warn: bool = False) -> dict[str, list[tuple[str, Any]]]:
        """Each learner's candidates (:func:`~.candidates.per_learner_candidates`)."""
        return per_learner_candidates(self.candidates, cids, warn=warn)

    # ---- hooks of the base estimator -----------------------------------------------------------
    def _describe_local(self, fd: FederatedDataset) -> dict:
        """A node's checks of its own learner data (a deployment)."""
        self._validate_params()
        for cid, cd in fd.items():
            check_learner(cid, cd.X, cd.y, fd.target_name or "y")
        return {}

    def _validate_data(self, fd: FederatedDataset) -> None:
        if not getattr(fd, "is_remote", False):  # each node of a deployment ran check_learner
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
        per = self._per_learner(fd.client_ids, warn=True)  # bad candidates fail before any message
        extra = check_extra_types(self.extra_trusted_types)
        seen: set[int] = set()
        for lst in per.values():
            for nm, est in lst if id(lst) not in seen else ():
                check_model(dumps_model(est), source=f"candidate {nm!r}", extra_types=extra)
            seen.add(id(lst))

    def _make_model(self, fd) -> SECModel:
        return SECModel(standardize=bool(self.standardize),
                        extra_trusted_types=list(check_extra_types(self.extra_trusted_types)))

    def _check_models(self, ids: list[str], blobs: list[np.ndarray], where: str) -> None:
        """Refuse any learner's model naming a type outside the allow-list (nothing is built)."""
        extra = check_extra_types(self.extra_trusted_types)
        for c, b in zip(ids, blobs):
            check_model(b, source=f"learner {c!r}'s model{where}", extra_types=extra)

    def _initialize(self, ctx: FitContext) -> Params:
        """SEC starts from nothing: its exchanges are the protocol itself (:meth:`_run`)."""
        return {}

    def _run(self, ctx: FitContext, params0: Params, options: LoopOptions) -> FitResult:
        """Select and Exchange with the learners (through ``ctx.ask``), then Cluster.

        Two protocol steps, one history record each (``n_iter_ == 2``): the records' objective
        is the sample-weighted mean in-sample MSE of the selected models (Select) and the mean
        MSE of every model on every other learner's data (Exchange), both on the learners'
        standardized scale when ``standardize``. A one-shot protocol: nothing to checkpoint or
        resume (``checkpoint`` is ignored, ``resume=True`` refused).
        """
        if options.resume:
            raise ValueError("SEC is a one-shot protocol with nothing to resume; fit it again")
        cids = ctx.client_ids
        cands = self._per_learner(cids)
        send = sender(ctx)
        history = History()
        bar = progress_bar(3 if self.collaboration == "validated" else 2, options.progress,
                           options.description)

        def step(k: int, objective: float, traffic: Traffic, t0: float) -> None:
            rec = RoundRecord(k, float(objective), None, traffic.bytes_up, traffic.bytes_down,
                              len(cids), 1.0, time.perf_counter() - t0)
            history.append(rec)
            for cb in options.callbacks or ():
                cb(k, {}, Stats({}), rec)
            bar.update(1)

        try:
            t0, traffic = time.perf_counter(), Traffic()
            run = secrets.token_hex(16)  # the models are signed for this run only
            sel = select_step(send, cids, cands, ctx.seed, n_features=ctx.n_features,
                              standardize=bool(self.standardize), n_jobs=self.n_jobs,
                              traffic=traffic, split=self.split, run=run)
            e = np.array([float(sel[c]["e"]) for c in cids])
            n = np.array([units_number(sel[c]["n"]) for c in cids])  # weighted: weight sums
            if not self.standardize:
                warn_target_scales(cids, [float(sel[c]["y_scale"]) for c in cids],
                                   getattr(ctx.data, "target_name", None))
            step(1, float(n @ e / n.sum()), traffic, t0)
            t0, traffic = time.perf_counter(), Traffic()
            blobs = [np.asarray(sel[c]["model"], dtype=np.uint8) for c in cids]
            self._check_models(cids, blobs, " (sent in the select step)")
            signed = [(c, sel[c].get("signature")) for c in cids]
            E = exchange_step(send, cids, blobs, ctx.seed, batch=int(self.exchange_batch),
                              n_jobs=self.n_jobs, traffic=traffic, run=run, signed=signed)
            step(2, float(E[~np.eye(len(cids), dtype=bool)].mean()), traffic, t0)
            clusters = self._cluster(E, e, n, ctx.seed)
            val = self._validated(send, cids, clusters["labels"], blobs, n, ctx.seed, run,
                                  signed, step)
        finally:
            bar.close()
        width = max(len(cands[c]) for c in cids)
        cv = np.full((len(cids), width), np.nan)
        for i, c in enumerate(cids):
            got = np.asarray(sel[c]["cv_mse"], dtype=np.float64)
            cv[i, : got.size] = got
        # the protocol's results (not EM parameters): what _store turns into fitted attributes
        params: dict[str, Any] = {
            "learner_ids": list(cids), "models": blobs, "errors": e, "n_samples": n,
            "exchange_losses": E, "cv_mse": cv,
            "selected": [cands[c][int(sel[c]["selected"])][0] for c in cids],
            "candidate_names": [nm for nm, _ in cands[cids[0]]],
        }
        if self.standardize:
            keys = ("x_mean", "x_scale", "y_mean", "y_scale")
            params["scalers"] = {c: tuple(np.asarray(sel[c][k], dtype=np.float64) for k in keys)
                                 for c in cids}
        params.update(clusters, validation=val)
        return FitResult(params, Stats({}), history, True, len(history))

    def _validated(self, send, cids, labels, blobs, n, seed, run, signed, step) -> np.ndarray:
        """Step 4 (``collaboration="validated"``): each learner's validation MSE alone and
        with its cluster (:func:`~.protocol.validate_step`), recorded as a protocol step; NaN
        throughout under "always"."""
        if self.collaboration != "validated":
            return np.full((len(cids), 3), np.nan)
        t0, traffic = time.perf_counter(), Traffic()
        val = validate_step(send, cids, labels, blobs, n, seed, split=self.split,
                            n_jobs=self.n_jobs, traffic=traffic, run=run, signed=signed)
        step(3, float(np.nanmean(val[:, 1])) if np.isfinite(val).any() else float("nan"),
             traffic, t0)
        return val

    def _cluster(self, E: np.ndarray, e: np.ndarray, n: np.ndarray, seed: int) -> dict:
        """Step 3 on the server: eq. (2), the affinity, K, spectral clustering."""
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
            cap = default_max_clusters(L) if self.max_clusters is None else int(self.max_clusters)
            kmax = min(cap, max(2, L // 2))
            Y = selection_embedding(S, kmax)
            if self.k_selection == "gap":
                k, info = gap_statistic(Y, kmax, self.n_refs, self.n_init, rng, self.gap_rule)
            else:
                lam = L / float(np.mean(n)) if self.penalty is None else float(self.penalty)
                k, info = penalty_selection(Y, kmax, lam, self.n_init, rng)
            if k == kmax and kmax < L:
                how = ("the gap statistic" if self.k_selection == "gap"
                       else f"the penalty (lambda_n = {lam:.3g})")
                warnings.warn(
                    f"SEC chose K = {k}, the largest K considered (max_clusters={self.max_clusters}"
                    f", at most L // 2 = {max(2, L // 2)} for {L} learners): {how} may want more "
                    "clusters, or the learners form a continuum rather than groups; raise "
                    "max_clusters, give n_clusters=..., or use k_selection='penalty' with a "
                    "larger penalty", UserWarning, stacklevel=2)
        labels, U, w = spectral_clustering(S, k, self.n_init, rng)
        return {"dissimilarity": V, "affinity_scale": float(a), "similarity": S,
                "eigenvalues": w, "embedding": U, "labels": labels, "k_selection_info": info}

    def _store(self, result: FitResult, model: SECModel) -> None:
        p = result.params
        self.learner_ids_ = [str(c) for c in p["learner_ids"]]
        for k in ("errors", "n_samples", "cv_mse", "exchange_losses", "dissimilarity",
                  "similarity", "eigenvalues", "embedding", "labels"):
            setattr(self, k + "_", p[k])
        self.affinity_scale_ = p["affinity_scale"]
        self.selected_ = list(p["selected"])
        self.candidate_names_ = list(p["candidate_names"])
        self.k_selection_info_ = p["k_selection_info"]
        self.validation_mse_ = np.asarray(p["validation"], dtype=np.float64)
        # what save writes: the learners' models in one byte array, the scalers in two
        blobs = p["models"]
        self._model_sizes = np.array([b.size for b in blobs], dtype=np.int64)
        self._model_bytes = np.concatenate(blobs)
        sc = p.get("scalers") or {}
        d = int(self.n_features_in_)
        self._scaler_x = np.array([np.stack(sc[c][:2]) for c in self.learner_ids_] if sc
                                  else np.zeros((0, 2, d)))
        self._scaler_y = np.array([[float(sc[c][2]), float(sc[c][3])] for c in self.learner_ids_]
                                  if sc else np.zeros((0, 2)))
        self._after_load()

    def _check_loaded(self) -> None:
        from ...engine.protocol import loadcheck as lc

        L = len(self.learner_ids_)
        for name in ("errors_", "n_samples_", "labels_", "_model_sizes"):
            lc.expect_shape(self, name, (L,))
        lc.expect_labels(self, "labels_", L)
        lc.expect_positive(self, "_model_sizes")
        if int(np.sum(self._model_sizes)) != np.size(self._model_bytes):
            raise ValueError(f"field '_model_sizes' sums to {int(np.sum(self._model_sizes))}, "
                             f"but '_model_bytes' holds {np.size(self._model_bytes)} bytes")

    def _after_load(self) -> None:
        sizes = np.asarray(self._model_sizes, dtype=np.int64).reshape(-1)
        total = np.asarray(self._model_bytes).size
        if sizes.size != len(self.learner_ids_) or np.any(sizes < 1) or sizes.sum() != total:
            raise UntrustedModelError(
                f"the saved models' sizes ({sizes.size} sizes summing to {int(sizes.sum())}) do "
                f"not split their {total} bytes among {len(self.learner_ids_)} learners")
        self.models_ = np.split(np.asarray(self._model_bytes, dtype=np.uint8),
                                np.cumsum(sizes)[:-1])
        self._check_models(self.learner_ids_, self.models_, "")
        self.n_clusters_ = int(np.unique(self.labels_).size)
        val = getattr(self, "validation_mse_", None)
        if val is None or np.shape(val) != (len(self.learner_ids_), 3):
            val = np.full((len(self.learner_ids_), 3), np.nan)
        self.validation_mse_ = np.asarray(val, dtype=np.float64)
        v = self.validation_mse_  # the cluster only where better by a standard error
        self.collaborates_ = ~(v[:, 1] + COLLABORATE_SE * v[:, 2] >= v[:, 0])
        self.scalers_ = {c: (self._scaler_x[i, 0], self._scaler_x[i, 1],
                             float(self._scaler_y[i, 0]), float(self._scaler_y[i, 1]))
                         for i, c in enumerate(self.learner_ids_)} if len(self._scaler_y) else {}

    def _save_extra(self) -> dict[str, Any]:
        info = {k: np.asarray(v).tolist() for k, v in self.k_selection_info_.items()}
        return {"sec": {"learner_ids_": list(self.learner_ids_), "selected_": list(self.selected_),
                        "candidate_names_": list(self.candidate_names_),
                        "affinity_scale_": float(self.affinity_scale_),
                        "k_selection_info_": info,
                        "validation_mse_": [[None if not np.isfinite(v) else float(v)
                                             for v in row] for row in self.validation_mse_]}}

    def _load_extra(self, meta: dict[str, Any]) -> None:
        sec = meta["sec"]
        self.learner_ids_ = list(sec["learner_ids_"])
        self.selected_ = list(sec["selected_"])
        self.candidate_names_ = list(sec["candidate_names_"])
        self.affinity_scale_ = float(sec["affinity_scale_"])
        self.k_selection_info_ = {k: np.asarray(v) for k, v in sec["k_selection_info_"].items()}
        if "validation_mse_" in sec:  # (files before issue 42: every learner collaborates)
            self.validation_mse_ = np.array([[np.nan if v is None else v for v in row]
                                             for row in sec["validation_mse_"]], dtype=float)

