"""The FedGMM estimator (hooks of the base estimator) and its client-side helpers."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from ...data.dataset import ClientData, FederatedDataset
from ...engine.contract.model import Capabilities, Params
from ...engine.contract.params import ROUND_LOOP, Integer, Options, Real, store_params
from ...engine.contract.registry import register_estimator
from ...engine.contract.selection import AUTO_SIZE
from ...engine.estimation.checks import check_enough_rows
from ...engine.estimation.estimator import (
    FederatedEstimator,
    FitContext,
    check_features,
    check_is_fitted,
)
from ...engine.node.replay_start import register_start
from ...engine.rounds.loop import FitResult
from ...engine.stats import Stats
from ..gmm import gmm_m_step
from ..gmm.estimator import initialize_gaussians
from ..gmm.init import INIT_PARAMS, GaussianStart, replay_gaussians
from ..gmm.math import covariances_from_precisions
from .clients import ClientWeights
from .dp import private_refusal, private_start
from .inference import FedGMMSummary
from .math import fedgmm_log_components, fedgmm_predict_log_proba
from .model import FedGMMModel, initial_coef, start_from
from .selection import auto_size, fedgmm_selection

__all__ = ["FedGMM"]

logger = logging.getLogger(__name__)


@register_start("fedgmm")
def _fedgmm_start(model: FedGMMModel, ctx) -> list[Params]:
    """The start a verifying site replays (:mod:`fedlatent.engine.node.replay_start`): the
    Gaussian part's (:func:`~fedlatent.models.gmm.init.replay_gaussians`) and the learners'
    coefficients drawn from the seed at the default ``learner_init_scale`` (none under
    differential privacy: the noisy start of :mod:`.dp`)."""
    if model.private:
        return []
    g = replay_gaussians(ctx, model.M1, model.cov_type, model.reg)
    return [start_from(g, initial_coef(model, ctx.seed, g["means"].shape[1]))]


@register_estimator(
    "fedgmm", target=True,
    description="FedGMM: personalized mixture of Gaussian inputs and shared learners (Wu et al.)",
)
class FedGMM(FedGMMSummary, ClientWeights, FederatedEstimator):
    """Personalized federated learning under a mixture of joint distributions (FedGMM).

    Parameters
    ----------
    n_input_components : int or "auto", default 3
        ``M1``, Gaussian components of the input distribution. "auto": chosen among
        ``n_input_components_candidates`` by the held-out log-likelihood (each candidate fitted
        on 80% of every client's rows, scored by the mean ``log h_c(x, y)`` of the other 20%
        with the client's own ``pi_c``; the best is fitted again on all rows; see
        :mod:`fedlatent.models.fedgmm.selection`).
    n_learners : int or "auto", default 3
        ``M2``, shared learners ``P_theta(y | x)``; "auto" as for ``n_input_components`` (one
        of the two at a time).
    learner : {"logistic", "torch"}, default "logistic"
        Multinomial logistic regression (binary and multi-class) in NumPy, or a PyTorch MLP
        (``fedlatent[torch]``; needs ``learner_update="average"``).
    learner_params : dict or None
        For "torch": ``hidden`` (list of layer sizes, default [32]), ``lr`` (0.1), ``epochs``
        (1), ``batch_size`` (64) of the local SGD refits.
    covariance_type : {"full", "tied", "diag", "spherical"}, default "full"
    reg_covar : float, default 1e-6
    l2 : float, default 1e-3
        Ridge on each learner's responsibility-weighted *mean* cross-entropy (the penalty
        scales with the learner's responsibility mass, so it does not depend on the sample size).
        It also keeps the Newton step well-posed when clients hold one class (label skew;
        accepted): a learner whose responsibility falls on one class has no finite optimum
        without it, and with it ``||theta_m||^2 <= 2 log K / l2``. Keep ``l2 > 0`` then.
    learner_update : {"newton", "average"}, default "newton"
        "newton": exact federated Newton / IRLS step from summed gradients and Hessians.
        "average": each client refits locally (``local_steps`` Newton steps from the broadcast
        parameters, with FedProx's proximal term when ``prox > 0``) and the server averages
        with responsibility weights (the paper's rule).
    covariance_aggregation : {"exact", "paper"}, default "exact"
        "exact" sums ``sum q x x^T`` (the pooled EM covariance); "paper" averages per-client
        covariances around per-client means (drops the between-client scatter; comparison only).
    local_steps : int, default 1
    prox : float, default 0.0
    newton_step_max : float or None, default 5.0
        Damped Newton (server step and local refits): a learner's update is scaled down so
        that no coefficient moves by more than this in one round (EM responsibilities can
        swing early on, and a full step from near-separable weighted data overshoots).
        None: the plain Newton step. When the cap does not bind, the step is exactly the
        centralized IRLS step.
    classes : list or None
        Label values; default the union of the training labels.
    init_params : {"kmeans-sums", "kmeans-federated", "random"}, default "kmeans-sums"
        Initialization of the Gaussian components (see :class:`FederatedGaussianMixture`).
    learner_init_scale : float, default 1.0
        Standard deviation of the random initial learner coefficients (breaks the symmetry
        between learners).
    n_init : int, default 1
        Starts (scikit-learn's ``n_init``): the whole fit runs once per start, each from its
        own seed, and the start of highest final mean log-likelihood is kept (``init_scores_``,
        ``best_start_``; :mod:`fedlatent.engine.contract.starts`). Refused under differential
        privacy, partial participation and with checkpoints.
    federation : fl.Federation or None
        With ``privacy=fl.DifferentialPrivacy(...)`` (Newton updates, exact covariances, no
        ``target_range``): rows clipped, labels not; the released E-step uses a public joint
        table and the learners send gradients (:mod:`fedlatent.models.fedgmm.dp`).
    max_rounds : int or None, default None
        None: 100 rounds, or under ``Federation(privacy=...)`` 5 rounds (every round is
        paid from the privacy budget; from the private start that ties each learner to an
        input component, five rounds come within a point of the converged non-private
        accuracy at 10^5 records, see ``docs/privacy.md``).
    tol : float, default 1e-4
        Convergence on the change of the mean per-sample ``log h_c(x, y)``.
    random_state : int or None
    verbose : bool or None
    n_input_components_candidates, n_learners_candidates : list of int or None
        The sizes "auto" tries; None: 1 to 5.

    Attributes
    ----------
    n_input_components_, n_learners_ : int
        ``M1`` and ``M2`` of the fit (the chosen one with "auto").
    selection_scores_ : DataFrame
        Only with "auto": per candidate, ``heldout_loglik`` (mean ``log h_c(x, y)`` per
        held-out row), ``n_heldout``, ``n_iter``, ``converged``, ``error``.
    means_, covariances_, precisions_cholesky_ : Gaussian input components
    weights_x_ : ndarray of shape (M1,)
        Federated marginal weight of each input component.
    coef_ : ndarray of shape (M2, K - 1, n_features + 1)
        Learner coefficients (class 0 is the reference; the last column is the intercept).
    weights_y_ : ndarray of shape (M2,)
    classes_ : ndarray of shape (K,)
    history_, converged_, n_rounds_

    References
    ----------
    Wu et al., "Personalized Federated Learning under Mixture of Distributions", ICML 2023,
    section 3 and Algorithm 1.
    """

    _save_arrays = ("means_", "covariances_", "precisions_cholesky_", "weights_x_", "coef_",
                    "weights_y_", "center_", "classes_")
    _load_text = ("classes_",)  # the labels may be text; every other field holds numbers

    _multi_start = True  # n_init: engine/contract/starts.py
    _parameter_constraints = {
        **ROUND_LOOP,
        "max_rounds": [None, Integer(1)],
        "n_init": [Integer(1)],
        "n_input_components": [AUTO_SIZE],
        "n_learners": [AUTO_SIZE],
        "n_input_components_candidates": [None, "array-like"],
        "n_learners_candidates": [None, "array-like"],
        "learner": [Options("logistic", "torch")],
        "learner_params": [None, dict],
        **{k: FedGMMModel.config_constraints[k] for k in (  # (the model's: a node checks
            "covariance_type", "reg_covar", "l2", "local_steps", "prox",  # its setup by them)
            "newton_step_max")},
        "learner_update": [Options("newton", "average")],
        "covariance_aggregation": [Options("exact", "paper")],
        "classes": [None, list, tuple, np.ndarray],
        "init_params": [Options(*INIT_PARAMS)],
        "learner_init_scale": [Real(0)],
    }

    def __init__(
        self,
        n_input_components: int = 3,
        n_learners: int = 3,
        *,
        learner: str = "logistic",
        learner_params: dict | None = None,
        covariance_type: str = "full",
        reg_covar: float = 1e-6,
        l2: float = 1e-3,
        learner_update: str = "newton",
        covariance_aggregation: str = "exact",
        local_steps: int = 1,
        prox: float = 0.0,
        newton_step_max: float | None = 5.0,
        classes=None,
        init_params: str = "kmeans-sums",
        learner_init_scale: float = 1.0,
        n_init: int = 1,
        federation=None,
        max_rounds: int | None = None,
        tol: float = 1e-4,
        random_state=None,
        verbose: bool | None = None,
        n_input_components_candidates=None,
        n_learners_candidates=None,
    ):
        store_params(self, locals())

    _score_name = "accuracy"
    # DP: with the settings private_refusal accepts; NaN in X: .missing (issue 25)
    capabilities = Capabilities(secure_aggregation=True, differential_privacy=True,
                                missing_values=True)

    #: the private plan: five rounds after the private start (learners tied to the input
    #: components, .dp); privacy_utility, 1e5 records, epsilon 1, three seeds: within 0.63
    #: points of the converged non-private accuracy, 0.92 at 3 rounds, unstable beyond 5
    _private_max_rounds = 5

    @property
    def _dp_init_releases(self) -> int:
        """The Gaussian start's releases: the moments, and the private k-means start's
        hard-assignment sums (:func:`~fedlatent.models.gmm.init.initialize_gaussians`); the
        learners start from random coefficients (no data)."""
        return 1 if self.init_params == "random" else 2

    def _selection(self):
        return fedgmm_selection(self)

    # ---- validation -----------------------------------------------------------------------
    def _check_params(self) -> None:
        refusal = private_refusal(self)
        if refusal:
            raise ValueError(f"FedGMM under differential privacy: {refusal}")
        auto_size(self)  # at most one "auto" size, and valid candidates
        if self.learner == "torch":
            if self.learner_update != "average":
                raise ValueError(
                    "learner='torch' is refitted locally and averaged: use "
                    "learner_update='average' (Newton steps need the logistic learner)"
                )
            allowed = {"hidden", "lr", "epochs", "batch_size"}
            bad = sorted(set(self.learner_params or {}) - allowed)
            if bad:
                raise ValueError(f"unknown learner_params {bad}; allowed: {sorted(allowed)}")

    def _validate_data(self, fd: FederatedDataset) -> None:
        # Runs where the data are (like FederatedDataset.validate): only the label set leaves.
        if not fd.has_target:
            raise ValueError(
                "FedGMM is supervised: the federated dataset has no target y; build it with "
                "FederatedDataset.from_pandas(..., target='y') or from_arrays({client: (X, y)})"
            )
        labels = set()
        if getattr(fd, "is_remote", False):  # each node checked its own labels (_describe_local)
            for cid in fd.client_ids:
                labels.update(fd.extras[cid]["labels"])
        else:
            for cid, cd in fd.items():
                labels.update(self._client_labels(cid, cd))
        if self.classes is not None:
            classes = np.unique(np.asarray(self.classes))
            unknown = sorted(labels - set(classes.tolist()))
            if unknown:
                raise ValueError(
                    f"y has labels {unknown} that are not in classes={classes.tolist()}; add "
                    "them to classes or drop those rows"
                )
            self._classes = classes
        else:
            self._classes = np.array(sorted(labels))
        if self._classes.size < 2:
            raise ValueError(
                f"y has one class ({self._classes.tolist()[0]!r}) in the whole federation; "
                "FedGMM's learners need two or more: declare the others with classes=[...]"
            )
        check_enough_rows(fd, self.n_input_components, "n_input_components")
        self._missing = _missing_names(self, fd)

    def _client_labels(self, cid, cd) -> list:
        # A client may hold one class only (label skew): the learners are shared, and its
        # Newton sums (gradient, Hessian) are valid terms of the federation's weighted fit.
        # Labels outside the declared classes are refused where the data are, naming the client.
        labels = np.unique(cd.y).tolist()
        if self.classes is not None:
            classes = np.unique(np.asarray(self.classes))
            unknown = sorted(set(labels) - set(classes.tolist()))
            if unknown:
                raise ValueError(
                    f"client {cid!r}: y has labels {unknown} that are not in classes="
                    f"{classes.tolist()}; add them to classes or drop those rows"
                )
        return labels

    def _describe_local(self, fd: FederatedDataset) -> dict:
        self._validate_params()
        if not fd.has_target:
            self._validate_data(fd)  # raises the no-target error
        (cid,) = fd.client_ids
        return {"labels": self._client_labels(cid, fd[cid])}

    def _make_model(self, fd: FederatedDataset) -> FedGMMModel:
        model = FedGMMModel(
            self.n_input_components,
            self.n_learners,
            [c.item() if hasattr(c, "item") else c for c in self._classes],
            covariance_type=self.covariance_type,
            reg_covar=self.reg_covar,
            l2=self.l2,
            learner_update=self.learner_update,
            covariance_aggregation=self.covariance_aggregation,
            local_steps=self.local_steps,
            prox=self.prox,
            newton_step_max=self.newton_step_max,
            learner=self.learner,
            learner_params=dict(self.learner_params or {}),
            n_features=fd.n_features,
            private=self._federation().privacy is not None,
        )
        if getattr(self, "_missing", None) is not None:
            model.batched_step = False  # rows with NaN: one client at a time (.missing)
        return model

    def _initialize(self, ctx: FitContext) -> Params:
        model, seed = ctx.model, ctx.seed
        g = initialize_gaussians(ctx, self.n_input_components, GaussianStart.of(self),
                                 missing=getattr(self, "_missing", None))
        coef = initial_coef(model, seed, g["means"].shape[1], self.learner_init_scale)
        K = len(self._classes)
        return {
            **start_from(g, coef),
            # under differential privacy: learners tied to the input components, the public
            # joint table of the E-step and the Hessian's ridge (.dp)
            **(private_start(ctx, g["weights"], g["center"], coef, K) if model.private
               else {}),
        }

    def _store(self, result: FitResult, model: FedGMMModel) -> None:
        p = result.params
        self.params_ = {k: np.asarray(v) for k, v in p.items()}
        self.weights_x_ = p["weights_x"]
        self.means_ = p["means"]
        self.precisions_cholesky_ = p["precisions_cholesky"]
        self.center_ = p["center"]
        self.coef_ = p["coef"]
        self.weights_y_ = p["weights_y"]
        self.classes_ = np.asarray(self._classes)
        self.n_input_components_ = int(p["means"].shape[0])
        self.n_learners_ = int(p["coef"].shape[0])
        G = {k: result.S_hat[k] for k in ("nk", "sx", "sxx")}
        if self.covariance_aggregation == "paper":
            G["sxx"] = G["sxx"] + model._outer(G["sx"], G["nk"] + 10 * np.finfo(float).eps)
        if model.private:  # the floored covariances the M-step used, not the raw noisy ones
            self.covariances_ = covariances_from_precisions(p["precisions_cholesky"],
                                                             self.covariance_type)
        else:
            _, _, self.covariances_ = gmm_m_step(Stats(G), p["center"], self.covariance_type,
                                                 self.reg_covar)
        self.lower_bound_ = result.history[-1].objective
        self.client_ids_ = list(self._runtime.client_ids)

    def _check_loaded(self) -> None:
        from ...engine.protocol import loadcheck as lc
        from ..gmm import checks as gmm_checks

        # a saved "auto" fit: the chosen sizes (its selection entry)
        M1 = int(getattr(self, "n_input_components_", self.n_input_components))
        M2 = int(getattr(self, "n_learners_", self.n_learners))
        d = int(self.n_features_in_)
        for name, shape in (("weights_x_", (M1,)), ("weights_y_", (M2,)), ("means_", (M1, d)),
                            ("center_", (d,))):
            lc.expect_shape(self, name, shape)
        lc.expect_simplex(self, "weights_x_")
        lc.expect_simplex(self, "weights_y_")
        gmm_checks.expect_covariances(self, "covariances_", self.covariance_type, M1, d)
        gmm_checks.expect_precisions_cholesky(self, "precisions_cholesky_",
                                              self.covariance_type, M1, d)
        if np.ndim(self.coef_) < 1 or len(self.coef_) != M2:
            raise ValueError(f"field 'coef_' has shape {np.shape(self.coef_)}, the saved settings"
                             f" need {M2} learners first")

    def _after_load(self) -> None:
        self.params_ = {
            "weights_x": self.weights_x_, "means": self.means_,
            "precisions_cholesky": self.precisions_cholesky_, "center": self.center_,
            "coef": self.coef_, "weights_y": self.weights_y_,
        }
        self.n_input_components_ = len(self.weights_x_)
        self.n_learners_ = len(self.weights_y_)
        self.client_ids_ = list(getattr(self, "client_ids_", []) or [])

    # ---- prediction -----------------------------------------------------------------------
    def _check_X(self, X) -> np.ndarray:
        return check_features(self, X)

    def _encode(self, y) -> np.ndarray:
        y = np.asarray(y)
        classes = self.classes_
        idx = np.clip(np.searchsorted(classes, y), 0, len(classes) - 1)
        bad = classes[idx] != y
        if np.any(bad):
            unseen = sorted(set(np.asarray(y)[bad].tolist()))
            raise ValueError(
                f"y has labels {unseen} unseen at training (known classes: "
                f"{classes.tolist()}); drop those rows or refit with classes=..."
            )
        return idx

    def _learner(self):
        if self.learner == "logistic":
            return None
        if getattr(self, "_learner_obj", None) is None:
            from ..torch_learner import TorchMLPLearner

            self._learner_obj = TorchMLPLearner(self.n_features_in_, len(self.classes_),
                                                **dict(self.learner_params or {}))
        return self._learner_obj

    def _global_pi(self) -> np.ndarray:
        return np.outer(self.weights_x_, self.weights_y_)

    def _pi_for(self, client) -> np.ndarray:
        check_is_fitted(self)
        return self._global_pi() if client is None else self.personalize(client).pi

    def _log_proba_pi(self, X: np.ndarray, pi) -> tuple[np.ndarray, np.ndarray]:
        """``log P(y = k | x)`` (n, K) and ``log p(x)`` (n,) under ``pi``; rows with NaN
        from their observed part, the learners at each input component's completion
        (:mod:`fedlatent.models.fedgmm.missing`)."""
        if np.isnan(X).any():
            from .missing import missing_components, missing_predict_log_proba

            lg, lp = missing_components(X, self.params_, self.covariance_type,
                                        self._learner())[:2]
            return missing_predict_log_proba(lg, lp, pi)
        lg, lp = fedgmm_log_components(X, self.params_, self.covariance_type, self._learner())
        return fedgmm_predict_log_proba(lg, lp, pi)

    def _predict_proba_pi(self, X, pi) -> np.ndarray:
        return np.exp(self._log_proba_pi(self._check_X(X), pi)[0])

    def _score_pi(self, X, y, pi) -> pd.DataFrame:
        X = self._check_X(X)
        lpk, log_px = self._log_proba_pi(X, pi)
        out = {"log_px": log_px}
        if y is not None:
            yc = self._encode(y)
            if yc.shape[0] != X.shape[0]:
                raise ValueError(f"y has {yc.shape[0]} labels for {X.shape[0]} rows of X")
            out["log_py_given_x"] = lpk[np.arange(X.shape[0]), yc]
            out["log_pxy"] = out["log_px"] + out["log_py_given_x"]
        return pd.DataFrame(out)

    def predict_proba(self, X, client: str | None = None) -> np.ndarray:
        """``P_c(y | x)`` by eq. (3) for a known client (global weights when None)."""
        return self._predict_proba_pi(X, self._pi_for(client))

    def predict(self, X, client: str | None = None) -> np.ndarray:
        """Most probable label for a known client (global weights when None)."""
        proba = self.predict_proba(X, client)
        return self.classes_[proba.argmax(axis=1)]

    def score_samples(self, X, y=None, client: str | None = None) -> pd.DataFrame:
        """Novelty scores per sample: ``log_px``, ``log_py_given_x``, ``log_pxy``.

        With ``client=None`` the mixture weights are the product of the federated marginals
        ``weights_x_ (x) weights_y_`` (see the module notes); with a known client, its ``pi_c``.
        ``log_py_given_x`` and ``log_pxy`` need ``y``.
        """
        return self._score_pi(X, y, self._pi_for(client))

    def _predict_client(self, client: str, data: ClientData) -> np.ndarray:
        """A client seen in training predicts with its own ``pi_c`` where it is available
        (in-process, or attached with :meth:`load_client_weights`); others with the global
        weights."""
        known = client in getattr(self, "_client_pi", {}) or client in getattr(
            getattr(self, "_runtime", None), "nodes", {}
        )
        return self.predict(data.X, client=client if known else None)

    def score_dataset(self, fd: FederatedDataset) -> float:
        """Accuracy of :meth:`predict_dataset` on the labels of ``fd``."""
        # predict_dataset is in the source's row order: put the labels in the same order
        y = fd.to_source_order(np.concatenate([np.asarray(cd.y) for _, cd in fd.items()]))
        return float(np.mean(self.predict_dataset(fd).to_numpy() == y.to_numpy()))

    def _save_extra(self) -> dict:
        """Shared parameters only (``.npz`` + ``.json``); clients keep their ``pi_c`` files."""
        return {"client_ids": list(self.client_ids_)}

    def _load_extra(self, meta: dict) -> None:
        self.client_ids_ = list(meta.get("client_ids", meta["fitted"].get("client_ids_", [])))


def _missing_names(est: FedGMM, fd) -> list[str] | None:
    """The feature names when the federation holds NaN in X (the Gaussian mixture's rule,
    :func:`~fedlatent.models.gmm.missing_estimator.missing_names`), else None; refuses the
    settings the missing-data step does not take."""
    from ..gmm.missing_estimator import missing_names

    names = missing_names(est, fd)
    if names is not None and est._federation().privacy is not None:
        raise ValueError("FedGMM under differential privacy does not take missing values yet "
                         "(the completed rows have no clipping bound): drop or impute them, "
                         "or fit without privacy")
    return names
