"""FedGMM: personalized federated learning under a mixture of joint distributions.

Every client ``c`` models its joint distribution as

    h_c(x, y) = sum_{m1, m2} pi_c(m1, m2) N(x; mu_m1, Sigma_m1) P_theta_m2(y | x)

with Gaussian input components and learners shared by all clients and mixture weights
``pi_c`` that never leave the client. EM (paper eq. (E) and (M), Algorithm 1) runs on the
federated engine:

E-step on the client (log space)
    q_i(m1, m2) proportional to pi_c(m1, m2) N(x_i; mu_m1, Sigma_m1) P_theta_m2(y_i | x_i);
    ``pi_c <- mean_i q_i`` is kept in the client's private state.
Statistics a client sends (sums over its samples)
    per input component m1 (weights ``r_i(m1) = sum_m2 q_i(m1, m2)``): ``sum r``, ``sum r x``,
    ``sum r x x^T`` (``covariance_aggregation="exact"``), or the within-client scatter
    ``sum r (x - mu_c)(x - mu_c)^T`` (``"paper"``: the paper's per-client covariance averaging,
    which drops the between-client scatter; for comparison only);
    per learner m2 (weights ``s_i(m2) = sum_m1 q_i(m1, m2)``): ``sum s`` and either the IRLS
    statistics ``H theta - g`` and ``H`` of the weighted cross-entropy at the broadcast
    ``theta`` (``learner_update="newton"``: the server's Newton step is exactly the centralized
    weighted IRLS step), or ``sum s * theta_c`` for parameters ``theta_c`` refitted locally
    from the broadcast ones (``"average"``: the paper's responsibility-weighted averaging).
Server M-step
    Gaussians in closed form (:func:`fedlatent.models.gmm.gmm_m_step`), learners by
    ``theta = (H + l2 * mass * I)^-1 (H theta_old - g)`` or by the weighted average.

Stochastic approximation, partial participation and the quantizer act on these statistics. The
Newton statistics are sent in IRLS form (normal equations ``b = H theta - g``, ``H``) so an
averaged ``S_hat`` (step < 1, control variates, partial participation) is an average of
normal equations taken at recent parameters: the server's solve is a quasi-Newton step that
needs no parameters of past rounds, and with step 1 and full participation it is the exact
Newton step. Round 1 of the engine is the initialization E-step at the initial parameters,
with ``pi_c`` uniform.

Privacy. Clients return the sums above (which, like any federated mixture, contain the
responsibility mass per input component and per learner) and never ``pi_c`` itself (the joint
``M1 x M2`` table), nor rows of ``X`` or ``y``. The global table ``pi(m1, m2)`` of the paper's
footnote 3 would need the clients' joint tables, so the model's global weights (used when no
client is given) are the product of the two federated marginals ``weights_x_ (x) weights_y_``.

Prediction for a known client needs its ``pi_c``, which stays with the client: after an
in-process fit, :meth:`FedGMM.personalize` reads it *on the client's side* (from the client node
object, not through a message) and returns a :class:`PersonalizedFedGMM` predictor holding the
shared parameters and that client's weights; ``predict(X, client=c)`` is a shortcut for it.
:meth:`FedGMM.save_client_weights` writes one file per client (what each client keeps).

References
----------
Wu, Zhou, Zheng, Xiong, Zhou, Wang, Cheng, Li, Marfoq, Ding, Ren, "Personalized Federated
Learning under Mixture of Distributions", ICML 2023: model section 3.2, EM eq. (E) and (M),
prediction eq. (3), Algorithm 1 (Appendix A).
Marfoq, Neglia, Bellet, Kameni, Vidal, "Federated Multi-Task Learning under a Mixture of
Distributions", NeurIPS 2021 (the mixture of learners, ``M1 = 1``).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd

from ..data.dataset import ClientData, FederatedDataset
from ..engine.loop import FitResult
from ..engine.model import ClientStep, FederatedModel, Params, register_model
from ..engine.registry import register_estimator
from ..engine.runtime import Runtime
from ..engine.stats import Stats
from .base import FederatedEstimator, check_features, check_is_fitted
from .gmm import (
    COV_TYPES,
    FederatedGaussianMixture,
    GMMModel,
    compute_precision_cholesky,
    estimate_log_gaussian_prob,
    gmm_m_step,
    gmm_statistics,
)
from .logistic import (
    add_intercept,
    irls_statistics,
    local_refit,
    logistic_log_proba,
    newton_solve,
)

__all__ = [
    "FedGMM",
    "FedGMMModel",
    "PersonalizedFedGMM",
    "fedgmm_log_components",
    "fedgmm_responsibilities",
    "fedgmm_predict_log_proba",
]

logger = logging.getLogger(__name__)
_GMM_QUERIES = ("moments", "kmeans", "hard_stats")


# ---------------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------------
def _logsumexp(a: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(m, axis=axis) + np.log(np.sum(np.exp(a - m), axis=axis))


def _log(a: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.log(a)


def fedgmm_log_components(
    X: np.ndarray, params: Params, covariance_type: str, learner=None
) -> tuple[np.ndarray, np.ndarray]:
    """Log densities of the input components and log class probabilities of the learners.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    params : dict with ``means`` (M1, d), ``precisions_cholesky`` and ``coef`` (M2, K-1, d+1)
        (or (M2, P) flat parameters of a ``learner``)
    learner : object with ``log_proba(X, theta)`` or None (the logistic learner)

    Returns
    -------
    log_gauss : ndarray of shape (n_samples, M1)
        ``log N(x_i; mu_m1, Sigma_m1)``.
    log_proba : ndarray of shape (n_samples, M2, K)
        ``log P_theta_m2(y = k | x_i)``.
    """
    lg = estimate_log_gaussian_prob(X, params["means"], params["precisions_cholesky"],
                                    covariance_type)
    coef = params["coef"]
    if learner is not None:
        lp = np.stack([learner.log_proba(X, coef[m]) for m in range(coef.shape[0])], axis=1)
        return lg, lp
    Xa = add_intercept(X)
    lp = np.stack([logistic_log_proba(Xa, coef[m]) for m in range(coef.shape[0])], axis=1)
    return lg, lp


def fedgmm_responsibilities(
    log_gauss: np.ndarray, log_py: np.ndarray, pi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """E-step (eq. (E)): ``q_i(m1, m2)`` and ``log h_c(x_i, y_i)``.

    Parameters
    ----------
    log_gauss : ndarray of shape (n_samples, M1)
    log_py : ndarray of shape (n_samples, M2)
        ``log P_theta_m2(y_i | x_i)`` at the observed labels.
    pi : ndarray of shape (M1, M2)

    Returns
    -------
    q : ndarray of shape (n_samples, M1, M2), rows sum to 1
    log_lik : ndarray of shape (n_samples,)
    """
    lj = _log(pi)[None] + log_gauss[:, :, None] + log_py[:, None, :]
    norm = _logsumexp(lj.reshape(lj.shape[0], -1), axis=1)
    return np.exp(lj - norm[:, None, None]), norm


def fedgmm_predict_log_proba(
    log_gauss: np.ndarray, log_proba: np.ndarray, pi: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Personalized prediction, eq. (3): ``log P_c(y = k | x)`` and ``log p_c(x)``.

    Parameters
    ----------
    log_gauss : ndarray of shape (n_samples, M1)
    log_proba : ndarray of shape (n_samples, M2, K)
    pi : ndarray of shape (M1, M2)

    Returns
    -------
    log_proba_c : ndarray of shape (n_samples, K)
    log_px : ndarray of shape (n_samples,)
    """
    # log of sum_{m1} pi(m1, m2) N_m1(x): (n, M2)
    a = _logsumexp(_log(pi)[None] + log_gauss[:, :, None], axis=1)
    log_px = _logsumexp(a, axis=1)
    lpk = _logsumexp(a[:, :, None] + log_proba, axis=1) - log_px[:, None]
    return lpk, log_px


# ---------------------------------------------------------------------------------------------
# The model (engine side)
# ---------------------------------------------------------------------------------------------
@register_model
class FedGMMModel(FederatedModel):
    """FedGMM math for the engine.

    Config: ``n_input_components``, ``n_learners``, ``classes`` (list of label values),
    ``covariance_type``, ``reg_covar``, ``l2``, ``learner_update``, ``covariance_aggregation``,
    ``local_steps``, ``prox``. Client state: ``pi`` of shape (M1, M2).
    """

    name = "fedgmm"

    def __init__(
        self,
        n_input_components: int,
        n_learners: int,
        classes: list,
        covariance_type: str = "full",
        reg_covar: float = 1e-6,
        l2: float = 1e-3,
        learner_update: str = "newton",
        covariance_aggregation: str = "exact",
        local_steps: int = 1,
        prox: float = 0.0,
        newton_step_max: float | None = 5.0,
        learner: str = "logistic",
        learner_params: dict | None = None,
        n_features: int | None = None,
    ):
        super().__init__(
            n_input_components=int(n_input_components),
            n_learners=int(n_learners),
            classes=list(classes),
            covariance_type=str(covariance_type),
            reg_covar=float(reg_covar),
            l2=float(l2),
            learner_update=str(learner_update),
            covariance_aggregation=str(covariance_aggregation),
            local_steps=int(local_steps),
            prox=float(prox),
            newton_step_max=None if newton_step_max is None else float(newton_step_max),
            learner=str(learner),
            learner_params=dict(learner_params or {}),
            n_features=None if n_features is None else int(n_features),
        )
        self.learner_name = str(learner)
        self.learner_params = dict(learner_params or {})
        self.n_features = n_features
        self._learner_cache = None
        self.step_max = None if newton_step_max is None else float(newton_step_max)
        self.M1, self.M2 = int(n_input_components), int(n_learners)
        self.classes = np.asarray(classes)
        self.K = len(classes)
        self.cov_type = covariance_type
        self.reg = float(reg_covar)
        self.l2 = float(l2)
        self.update = learner_update
        self.cov_agg = covariance_aggregation
        self.local_steps = int(local_steps)
        self.prox = float(prox)

    def encode(self, y: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.classes, y)

    def learner(self, n_features: int):
        """The learner object (None for the built-in logistic regression)."""
        if self.learner_name == "logistic":
            return None
        if self._learner_cache is None:
            from .torch_learner import TorchMLPLearner

            self._learner_cache = TorchMLPLearner(n_features, self.K, **self.learner_params)
        return self._learner_cache

    def init_client_state(self, data: ClientData) -> dict[str, np.ndarray]:
        return {"pi": np.full((self.M1, self.M2), 1.0 / (self.M1 * self.M2))}

    def client_stats(self, params, data, state, rng, rows=None) -> ClientStep:
        X = data.X if rows is None else data.X[rows]
        y = self.encode(data.y if rows is None else data.y[rows])
        n = X.shape[0]
        learner = self.learner(X.shape[1])
        lg, lp = fedgmm_log_components(X, params, self.cov_type, learner)
        lpy = lp[np.arange(n), :, y]  # (n, M2)
        q, loglik = fedgmm_responsibilities(lg, lpy, state["pi"])
        rx, ry = q.sum(axis=2), q.sum(axis=1)
        stats = dict(gmm_statistics(X, rx, params["center"], self.cov_type))
        if self.cov_agg == "paper":
            nk = stats["nk"] + 10 * np.finfo(np.float64).eps
            stats["sxx"] = stats["sxx"] - self._outer(stats["sx"], nk)
        Xa = add_intercept(X)
        coef = params["coef"]
        lw = ry.sum(axis=0)
        stats["lw"] = lw
        if self.update == "newton":
            P = coef[0].size
            lb, lH = np.empty((self.M2, P)), np.empty((self.M2, P, P))
            for m in range(self.M2):
                lb[m], lH[m] = irls_statistics(Xa, y, ry[:, m], coef[m])
            stats["lb"], stats["lH"] = lb, lH
        else:
            lt = np.empty((self.M2, coef[0].size))
            for m in range(self.M2):
                if learner is not None:
                    lt[m] = lw[m] * learner.refit(X, y, ry[:, m], coef[m], self.l2, self.prox, rng)
                    continue
                c_m = local_refit(Xa, y, ry[:, m], coef[m], self.l2 * lw[m], self.local_steps,
                                  self.prox * lw[m], self.step_max)
                lt[m] = lw[m] * c_m.ravel()
            stats["ltheta"] = lt
        return ClientStep(Stats(stats, copy=False), n, float(loglik.sum()),
                          {"pi": q.mean(axis=0)})

    def _outer(self, sx: np.ndarray, nk: np.ndarray) -> np.ndarray:
        """``sx sx^T / nk`` in the layout of ``sxx`` (removes the client's own mean)."""
        if self.cov_type == "full":
            return np.einsum("ki,kj->kij", sx, sx) / nk[:, None, None]
        if self.cov_type == "tied":
            return (sx / nk[:, None]).T @ sx
        return sx**2 / nk[:, None]

    def stat_shapes(self, params):
        M1, d = params["means"].shape
        sxx = {"full": (M1, d, d), "tied": (d, d), "diag": (M1, d), "spherical": (M1, d)}
        P = params["coef"][0].size
        shapes = {"nk": (M1,), "sx": (M1, d), "sxx": sxx[self.cov_type], "lw": (self.M2,)}
        if self.update == "newton":
            shapes.update(lb=(self.M2, P), lH=(self.M2, P, P))
        else:
            shapes["ltheta"] = (self.M2, P)
        return shapes

    def server_step(self, S, params, n_total):
        G = {k: S[k] for k in ("nk", "sx", "sxx")}
        if self.cov_agg == "paper":
            nk = G["nk"] + 10 * np.finfo(np.float64).eps
            G["sxx"] = G["sxx"] + self._outer(G["sx"], nk)
        wx, means, cov = gmm_m_step(Stats(G, copy=False), params["center"], self.cov_type,
                                    self.reg)
        # a component with (almost) no mass keeps its parameters: its ratios are rounding noise
        dead = S["nk"] * n_total < 1e-8
        prec = np.array(params["precisions_cholesky"], copy=True)
        if self.cov_type == "tied" or not dead.any():
            prec = compute_precision_cholesky(cov, self.cov_type)
        else:
            alive = ~dead
            prec[alive] = compute_precision_cholesky(cov[alive], self.cov_type)
            means[dead] = params["means"][dead]
        coef = params["coef"]
        lw = S["lw"]
        new = np.empty_like(coef)
        for m in range(self.M2):
            if self.update == "newton":
                new[m] = newton_solve(S["lb"][m], S["lH"][m], self.l2 * lw[m], coef[m].shape)
                step = np.max(np.abs(new[m] - coef[m]))
                if self.step_max is not None and step > self.step_max:
                    # damped Newton (trust region on the coefficients)
                    new[m] = coef[m] + (new[m] - coef[m]) * (self.step_max / step)
            elif lw[m] > 0:
                new[m] = (S["ltheta"][m] / lw[m]).reshape(coef[m].shape)
            else:
                new[m] = coef[m]
        return {
            "weights_x": wx,
            "means": means,
            "precisions_cholesky": prec,
            "center": params["center"],
            "coef": new,
            "weights_y": lw / max(lw.sum(), np.finfo(np.float64).tiny),
        }

    def client_query(self, name, payload, data, state, rng):
        if name in _GMM_QUERIES:
            gm = GMMModel(self.M1, self.cov_type, self.reg)
            return gm.client_query(name, payload, data, {}, rng)[0], state
        return super().client_query(name, payload, data, state, rng)


# ---------------------------------------------------------------------------------------------
# Client-side predictor
# ---------------------------------------------------------------------------------------------
class PersonalizedFedGMM:
    """The predictor of one client: the shared parameters and that client's ``pi_c``.

    Built on the client's side (:meth:`FedGMM.personalize`, :meth:`FedGMM.adapt`); its ``pi``
    is the client's own and is never sent anywhere.

    Attributes
    ----------
    pi : ndarray of shape (M1, M2)
    classes_ : ndarray of shape (K,)
    """

    def __init__(self, estimator: FedGMM, pi: np.ndarray, client: str | None = None):
        self._est = estimator
        self.pi = np.asarray(pi, dtype=np.float64)
        self.client = client
        self.classes_ = estimator.classes_

    def predict_proba(self, X) -> np.ndarray:
        """``P_c(y | x)`` by eq. (3), shape (n_samples, n_classes)."""
        return self._est._predict_proba_pi(X, self.pi)

    def predict(self, X) -> np.ndarray:
        """Most probable label under ``P_c(y | x)``."""
        return self.classes_[self.predict_proba(X).argmax(axis=1)]

    def score_samples(self, X, y=None) -> pd.DataFrame:
        """``log p_c(x)``, ``log P_c(y|x)`` and ``log p_c(x, y)`` per sample."""
        return self._est._score_pi(X, y, self.pi)

    def score(self, X, y) -> float:
        """Accuracy on ``(X, y)``."""
        return float(np.mean(self.predict(X) == np.asarray(y)))


# ---------------------------------------------------------------------------------------------
# The estimator
# ---------------------------------------------------------------------------------------------
@register_estimator(
    "fedgmm", target=True,
    description="FedGMM: personalized mixture of Gaussian inputs and shared learners (Wu et al.)",
)
class FedGMM(FederatedEstimator):
    """Personalized federated learning under a mixture of joint distributions (FedGMM).

    Parameters
    ----------
    n_input_components : int, default 3
        ``M1``, Gaussian components of the input distribution.
    n_learners : int, default 3
        ``M2``, shared learners ``P_theta(y | x)``.
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
    init_params : {"kmeans-federated", "random"}, default "kmeans-federated"
        Initialization of the Gaussian components (see :class:`FederatedGaussianMixture`).
    learner_init_scale : float, default 1.0
        Standard deviation of the random initial learner coefficients (breaks the symmetry
        between learners).
    federation : fl.Federation or None
    max_rounds : int, default 100
    tol : float, default 1e-4
        Convergence on the change of the mean per-sample ``log h_c(x, y)``.
    random_state : int or None
    verbose : bool or None

    Attributes
    ----------
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
        init_params: str = "kmeans-federated",
        learner_init_scale: float = 1.0,
        federation=None,
        max_rounds: int = 100,
        tol: float = 1e-4,
        random_state=None,
        verbose: bool | None = None,
    ):
        self.n_input_components = n_input_components
        self.n_learners = n_learners
        self.learner = learner
        self.learner_params = learner_params
        self.covariance_type = covariance_type
        self.reg_covar = reg_covar
        self.l2 = l2
        self.learner_update = learner_update
        self.covariance_aggregation = covariance_aggregation
        self.local_steps = local_steps
        self.prox = prox
        self.newton_step_max = newton_step_max
        self.classes = classes
        self.init_params = init_params
        self.learner_init_scale = learner_init_scale
        self.federation = federation
        self.max_rounds = max_rounds
        self.tol = tol
        self.random_state = random_state
        self.verbose = verbose

    # ---- validation -----------------------------------------------------------------------
    def _validate_params(self) -> None:
        for name in ("n_input_components", "n_learners", "max_rounds", "local_steps"):
            v = getattr(self, name)
            if not isinstance(v, int | np.integer) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        if self.learner not in ("logistic", "torch"):
            raise ValueError(f"learner must be 'logistic' or 'torch', got {self.learner!r}")
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
        if self.covariance_type not in COV_TYPES:
            raise ValueError(
                f"covariance_type must be one of {COV_TYPES}, got {self.covariance_type!r}"
            )
        if self.learner_update not in ("newton", "average"):
            raise ValueError(
                f"learner_update must be 'newton' or 'average', got {self.learner_update!r}"
            )
        if self.covariance_aggregation not in ("exact", "paper"):
            raise ValueError(
                "covariance_aggregation must be 'exact' or 'paper', got "
                f"{self.covariance_aggregation!r}"
            )
        for name in ("reg_covar", "l2", "prox", "tol", "learner_init_scale"):
            if not (float(getattr(self, name)) >= 0.0):
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if self.init_params not in ("kmeans-federated", "random"):
            raise ValueError(
                f"init_params must be 'kmeans-federated' or 'random', got {self.init_params!r}"
            )

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
        n = fd.n_samples
        if n < self.n_input_components:
            raise ValueError(
                f"the federation has {n} samples in all, fewer than n_input_components="
                f"{self.n_input_components}"
            )

    @staticmethod
    def _client_labels(cid, cd) -> list:
        u = np.unique(cd.y)
        if u.size < 2:
            raise ValueError(
                f"client {cid!r} has only one class ({u.tolist()[0]!r}) in y; FedGMM's "
                "learners need at least two classes per client: merge the client with "
                "another or drop it"
            )
        return u.tolist()

    def _describe_local(self, fd: FederatedDataset) -> dict:
        self._validate_params()
        if not fd.has_target:
            self._validate_data(fd)  # raises the no-target error
        (cid,) = fd.client_ids
        return {"labels": self._client_labels(cid, fd[cid])}

    def _make_model(self, fd: FederatedDataset) -> FedGMMModel:
        return FedGMMModel(
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
        )

    # ---- fit -------------------------------------------------------------------------------
    def fit(self, fd: FederatedDataset, *, runtime: Runtime | None = None, **kwargs):
        """Fit on a federated dataset with a target; ``pi_c`` stays in each client.

        Parameters
        ----------
        fd : FederatedDataset with a target ``y``
        runtime : Runtime or None
            Default: in-process clients built from ``fd`` (kept so that
            :meth:`personalize` can build each client's predictor on its side).
        **kwargs
            ``checkpoint``, ``checkpoint_every``, ``resume``, ``progress`` as in
            :meth:`FederatedEstimator.fit`.
        """
        if isinstance(fd, FederatedDataset):
            from ..engine.inprocess import InProcessRuntime

            self._validate_params()
            self._validate_data(fd)
            runtime = runtime if runtime is not None else InProcessRuntime(fd)
        elif getattr(fd, "is_remote", False):
            self._validate_params()
            self._validate_data(fd)
        super().fit(fd, runtime=runtime, **kwargs)
        self._runtime = runtime
        self.client_ids_ = list(runtime.client_ids)
        return self

    def _initialize(self, runtime: Runtime, model: FedGMMModel, seed: int) -> Params:
        gm = FederatedGaussianMixture(
            self.n_input_components,
            covariance_type=self.covariance_type,
            reg_covar=self.reg_covar,
            init_params=self.init_params,
        )
        g = gm._initialize(runtime, None, seed)
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0xF3D6,)))
        d = g["means"].shape[1]
        K = len(self._classes)
        learner = model.learner(d)
        if learner is not None:
            coef = np.stack([learner.init_params(rng) for _ in range(self.n_learners)])
        else:
            coef = float(self.learner_init_scale) * rng.standard_normal(
                (self.n_learners, K - 1, d + 1)
            ) / np.sqrt(d + 1)
        return {
            "weights_x": g["weights"],
            "means": g["means"],
            "precisions_cholesky": g["precisions_cholesky"],
            "center": g["center"],
            "coef": coef,
            "weights_y": np.full(self.n_learners, 1.0 / self.n_learners),
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
        G = {k: result.S_hat[k] for k in ("nk", "sx", "sxx")}
        if self.covariance_aggregation == "paper":
            G["sxx"] = G["sxx"] + model._outer(G["sx"], G["nk"] + 10 * np.finfo(float).eps)
        _, _, self.covariances_ = gmm_m_step(Stats(G), p["center"], self.covariance_type,
                                             self.reg_covar)
        self.lower_bound_ = result.history[-1].objective

    def _after_load(self) -> None:
        self.params_ = {
            "weights_x": self.weights_x_, "means": self.means_,
            "precisions_cholesky": self.precisions_cholesky_, "center": self.center_,
            "coef": self.coef_, "weights_y": self.weights_y_,
        }
        self.client_ids_ = list(getattr(self, "client_ids_", []) or [])

    # ---- client-side predictors -------------------------------------------------------------
    def personalize(self, client: str) -> PersonalizedFedGMM:
        """The predictor of a client seen in training, built on the client's side.

        After an in-process fit, the client's ``pi_c`` is read from its own node object (this
        is the client's half of the library: nothing crosses the runtime). After :meth:`load`,
        use :meth:`load_client_weights` with the file the client kept.
        """
        check_is_fitted(self)
        client = str(client)
        pis = getattr(self, "_client_pi", {})
        if client in pis:
            return PersonalizedFedGMM(self, pis[client], client)
        rt = getattr(self, "_runtime", None)
        nodes = getattr(rt, "nodes", None)
        if nodes is None or client not in nodes:
            known = self.client_ids_ or sorted(pis)
            raise KeyError(
                f"unknown client {client!r}: its mixture weights are not available here "
                f"(clients of this fit: {known[:5]}{'...' if len(known) > 5 else ''}); for a "
                "new client use adapt(ClientData(X, y))"
            )
        return PersonalizedFedGMM(self, nodes[client].state["model/pi"], client)

    def save_client_weights(self, directory: str | Path) -> list[Path]:
        """Write each client's ``pi_c`` to ``<directory>/<client>.npz`` (what it keeps)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for cid in self.client_ids_:
            path = directory / f"{cid}.npz"
            np.savez(path, pi=self.personalize(cid).pi)
            paths.append(path)
        return paths

    def load_client_weights(self, client: str, path: str | Path) -> PersonalizedFedGMM:
        """Attach a client's saved ``pi_c`` (from :meth:`save_client_weights`)."""
        with np.load(path, allow_pickle=False) as z:
            pi = np.asarray(z["pi"], dtype=np.float64)
        M = (len(self.weights_x_), len(self.weights_y_))
        if pi.shape != M:
            raise ValueError(f"{path}: pi has shape {pi.shape}, this model needs {M}")
        if not hasattr(self, "_client_pi"):
            self._client_pi = {}
        self._client_pi[str(client)] = pi
        return PersonalizedFedGMM(self, pi, str(client))

    def adapt(self, client_data: ClientData, n_rounds: int = 20) -> PersonalizedFedGMM:
        """Learn the mixture weights of a client unseen in training (shared parameters frozen).

        Runs ``n_rounds`` E-steps and ``pi`` updates (lines 6 and 8 of Algorithm 1) on the new
        client's labelled samples only; nothing is sent.

        Parameters
        ----------
        client_data : ClientData with X and y, or a tuple (X, y)
        n_rounds : int

        Returns
        -------
        PersonalizedFedGMM
        """
        check_is_fitted(self)
        if isinstance(client_data, tuple):
            client_data = ClientData(np.asarray(client_data[0], float), np.asarray(client_data[1]))
        if client_data.y is None:
            raise ValueError("adapt needs labelled samples: client_data.y is None")
        if int(n_rounds) < 1:
            raise ValueError(f"n_rounds must be >= 1, got {n_rounds!r}")
        X = self._check_X(client_data.X)
        y = self._encode(client_data.y)
        lg, lp = fedgmm_log_components(X, self.params_, self.covariance_type, self._learner())
        lpy = lp[np.arange(X.shape[0]), :, y]
        M1, M2 = len(self.weights_x_), len(self.weights_y_)
        pi = np.full((M1, M2), 1.0 / (M1 * M2))
        for _ in range(int(n_rounds)):
            q, _ = fedgmm_responsibilities(lg, lpy, pi)
            pi = q.mean(axis=0)
        return PersonalizedFedGMM(self, pi, None)

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
            from .torch_learner import TorchMLPLearner

            self._learner_obj = TorchMLPLearner(self.n_features_in_, len(self.classes_),
                                                **dict(self.learner_params or {}))
        return self._learner_obj

    def _global_pi(self) -> np.ndarray:
        return np.outer(self.weights_x_, self.weights_y_)

    def _pi_for(self, client) -> np.ndarray:
        return self._global_pi() if client is None else self.personalize(client).pi

    def _predict_proba_pi(self, X, pi) -> np.ndarray:
        X = self._check_X(X)
        lg, lp = fedgmm_log_components(X, self.params_, self.covariance_type, self._learner())
        return np.exp(fedgmm_predict_log_proba(lg, lp, pi)[0])

    def _score_pi(self, X, y, pi) -> pd.DataFrame:
        X = self._check_X(X)
        lg, lp = fedgmm_log_components(X, self.params_, self.covariance_type, self._learner())
        lpk, log_px = fedgmm_predict_log_proba(lg, lp, pi)
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
        return self.classes_[self.predict_proba(X, client).argmax(axis=1)]

    def score_samples(self, X, y=None, client: str | None = None) -> pd.DataFrame:
        """Novelty scores per sample: ``log_px``, ``log_py_given_x``, ``log_pxy``.

        With ``client=None`` the mixture weights are the product of the federated marginals
        ``weights_x_ (x) weights_y_`` (see the module notes); with a known client, its ``pi_c``.
        ``log_py_given_x`` and ``log_pxy`` need ``y``.
        """
        return self._score_pi(X, y, self._pi_for(client))

    def save(self, path) -> None:
        """Shared parameters only (``.npz`` + ``.json``); clients keep their ``pi_c`` files."""
        super().save(path)
        meta_path = Path(str(path) + ".json")
        meta = json.loads(meta_path.read_text())
        meta["fitted"]["client_ids_"] = list(self.client_ids_)
        meta_path.write_text(json.dumps(meta))
