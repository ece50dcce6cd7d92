"""Federated Gaussian mixture: EM with the E-step on clients and the M-step on the server.

Clients send, per component k, ``sum q``, ``sum q x`` and ``sum q x x^T`` (the diagonal for
"diag"/"spherical", one pooled ``sum x x^T`` for "tied") computed around a fixed centre broadcast
at initialization (the federated global mean), which keeps the second moments well conditioned.
With full participation and step 1 the iterates are scikit-learn's ``GaussianMixture`` iterates.

References
----------
Dempster, Laird, Rubin (1977); Dieuleveut, Fort, Moulines, Robin, "Federated Expectation
Maximization with heterogeneity mitigation and variance reduction", NeurIPS 2021.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from scipy import linalg

from ..data.dataset import FederatedDataset
from ..engine.loop import FitResult, setup_clients
from ..engine.model import ClientStep, FederatedModel, Params, register_model
from ..engine.registry import register_estimator
from ..engine.runtime import Runtime
from ..engine.stats import Stats
from .base import FederatedEstimator, check_features, check_is_fitted
from .kmeans import kmeans

__all__ = [
    "FederatedGaussianMixture",
    "GMMModel",
    "compute_precision_cholesky",
    "estimate_log_gaussian_prob",
    "gmm_statistics",
    "gmm_m_step",
]

logger = logging.getLogger(__name__)
COV_TYPES = ("full", "tied", "diag", "spherical")


def logsumexp(a: np.ndarray, axis: int = -1) -> np.ndarray:
    """log(sum(exp(a))) along ``axis``, stable (a lean version of scipy's for the hot path)."""
    m = np.max(a, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    out = np.log(np.sum(np.exp(a - m), axis=axis, keepdims=True)) + m
    return np.squeeze(out, axis=axis)


# ---------------------------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------------------------
def compute_precision_cholesky(covariances: np.ndarray, covariance_type: str) -> np.ndarray:
    """Cholesky factors of the precision matrices (as scikit-learn stores them).

    Parameters
    ----------
    covariances : ndarray
        (K, d, d) full, (d, d) tied, (K, d) diag, (K,) spherical.
    covariance_type : {"full", "tied", "diag", "spherical"}

    Returns
    -------
    ndarray, same shape as ``covariances``
    """
    msg = (
        "a covariance matrix is not positive definite (a component collapsed onto few points); "
        "raise reg_covar or lower n_components"
    )
    if covariance_type == "full":
        K, d, _ = covariances.shape
        out = np.empty((K, d, d))
        for k in range(K):
            try:
                c = linalg.cholesky(covariances[k], lower=True)
            except linalg.LinAlgError as e:
                raise ValueError(msg) from e
            out[k] = linalg.solve_triangular(c, np.eye(d), lower=True).T
        return out
    if covariance_type == "tied":
        d = covariances.shape[0]
        try:
            c = linalg.cholesky(covariances, lower=True)
        except linalg.LinAlgError as e:
            raise ValueError(msg) from e
        return linalg.solve_triangular(c, np.eye(d), lower=True).T
    if np.any(np.less_equal(covariances, 0.0)):
        raise ValueError(msg)
    return 1.0 / np.sqrt(covariances)


def _log_det_cholesky(prec_chol: np.ndarray, covariance_type: str, d: int) -> np.ndarray:
    if covariance_type == "full":
        K = prec_chol.shape[0]
        return np.sum(np.log(prec_chol.reshape(K, -1)[:, :: d + 1]), axis=1)
    if covariance_type == "tied":
        return np.sum(np.log(np.diag(prec_chol)))
    if covariance_type == "diag":
        return np.sum(np.log(prec_chol), axis=1)
    return d * np.log(prec_chol)


def estimate_log_gaussian_prob(
    X: np.ndarray, means: np.ndarray, prec_chol: np.ndarray, covariance_type: str
) -> np.ndarray:
    """log N(x_i; mu_k, Sigma_k) for every sample and component.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    means : ndarray of shape (n_components, n_features)
    prec_chol : ndarray
        Precision Cholesky factors, see :func:`compute_precision_cholesky`.

    Returns
    -------
    ndarray of shape (n_samples, n_components)
    """
    n, d = X.shape
    K = means.shape[0]
    log_det = _log_det_cholesky(prec_chol, covariance_type, d)
    if covariance_type == "full":
        log_prob = np.empty((n, K))
        for k in range(K):
            y = X @ prec_chol[k] - means[k] @ prec_chol[k]
            log_prob[:, k] = np.einsum("ij,ij->i", y, y)
    elif covariance_type == "tied":
        log_prob = np.empty((n, K))
        Xp = X @ prec_chol
        for k in range(K):
            y = Xp - means[k] @ prec_chol
            log_prob[:, k] = np.einsum("ij,ij->i", y, y)
    elif covariance_type == "diag":
        precisions = prec_chol**2
        log_prob = (
            np.sum(means**2 * precisions, 1) - 2.0 * (X @ (means * precisions).T)
            + (X**2) @ precisions.T
        )
    else:
        precisions = prec_chol**2
        log_prob = (
            np.sum(means**2, 1) * precisions
            - 2 * (X @ means.T * precisions)
            + np.outer(np.einsum("ij,ij->i", X, X), precisions)
        )
    return -0.5 * (d * np.log(2 * np.pi) + log_prob) + log_det


def gmm_statistics(
    X: np.ndarray, resp: np.ndarray, center: np.ndarray, covariance_type: str
) -> Stats:
    """Sufficient statistics of a Gaussian mixture, summed over samples.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    resp : ndarray of shape (n_samples, n_components)
        Responsibilities (rows sum to 1).
    center : ndarray of shape (n_features,)
        Shift applied to X before the moments (any fixed vector; the sums stay additive).

    Returns
    -------
    Stats with blocks ``nk`` (K,), ``sx`` (K, d), and ``sxx``: (K, d, d) full, (d, d) tied,
    (K, d) diag and spherical.
    """
    Xc = X - center
    nk = resp.sum(axis=0)
    sx = resp.T @ Xc
    if covariance_type == "full":
        K, d = resp.shape[1], X.shape[1]
        sxx = np.empty((K, d, d))
        for k in range(K):
            sxx[k] = (Xc * resp[:, k : k + 1]).T @ Xc
    elif covariance_type == "tied":
        sxx = Xc.T @ Xc
    else:
        sxx = resp.T @ (Xc * Xc)
    return Stats({"nk": nk, "sx": sx, "sxx": sxx}, copy=False)


def gmm_m_step(
    S: Stats, center: np.ndarray, covariance_type: str, reg_covar: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights, means and covariances from (mean or summed) statistics.

    Returns
    -------
    weights : ndarray of shape (K,)
    means : ndarray of shape (K, d)
    covariances : ndarray, shape by covariance_type
    """
    nk = S["nk"] + 10 * np.finfo(np.float64).eps
    mc = S["sx"] / nk[:, None]
    d = mc.shape[1]
    if covariance_type == "full":
        cov = S["sxx"] / nk[:, None, None] - np.einsum("ki,kj->kij", mc, mc)
        cov = 0.5 * (cov + np.transpose(cov, (0, 2, 1)))
        cov[:, np.arange(d), np.arange(d)] += reg_covar
    elif covariance_type == "tied":
        cov = (S["sxx"] - (nk[:, None] * mc).T @ mc) / nk.sum()
        cov = 0.5 * (cov + cov.T)
        cov[np.arange(d), np.arange(d)] += reg_covar
    else:
        cov = S["sxx"] / nk[:, None] - mc**2 + reg_covar
        if covariance_type == "spherical":
            cov = cov.mean(axis=1)
    weights = nk / nk.sum()
    return weights, mc + center, cov


def floor_covariances(cov: np.ndarray, covariance_type: str, floor: float) -> np.ndarray:
    """Covariances with every eigenvalue raised to at least ``floor`` (a projection onto the
    positive-definite cone used when stochastic statistics leave it)."""
    if covariance_type in ("diag", "spherical"):
        return np.maximum(cov, floor)
    mats = cov if covariance_type == "full" else cov[None]
    vals, vecs = np.linalg.eigh(0.5 * (mats + np.transpose(mats, (0, 2, 1))))
    vals = np.maximum(vals, floor)
    out = np.einsum("kij,kj,klj->kil", vecs, vals, vecs)
    return out if covariance_type == "full" else out[0]


def n_free_parameters(n_components: int, n_features: int, covariance_type: str) -> int:
    K, d = n_components, n_features
    cov = {"full": K * d * (d + 1) / 2, "tied": d * (d + 1) / 2, "diag": K * d, "spherical": K}[
        covariance_type
    ]
    return int(cov + K * d + K - 1)


# ---------------------------------------------------------------------------------------------
# The model (engine side)
# ---------------------------------------------------------------------------------------------
@register_model
class GMMModel(FederatedModel):
    """Gaussian mixture math for the engine. Config: n_components, covariance_type, reg_covar."""

    name = "gmm"

    def __init__(self, n_components: int, covariance_type: str = "full", reg_covar: float = 1e-6):
        super().__init__(
            n_components=int(n_components),
            covariance_type=str(covariance_type),
            reg_covar=float(reg_covar),
        )
        self.K = int(n_components)
        self.cov_type = covariance_type
        self.reg = float(reg_covar)

    def _log_resp(self, params: Params, X: np.ndarray):
        wlp = estimate_log_gaussian_prob(
            X, params["means"], params["precisions_cholesky"], self.cov_type
        ) + np.log(params["weights"])
        norm = logsumexp(wlp, axis=1)
        return wlp - norm[:, None], norm

    def client_stats(self, params, data, state, rng, rows=None) -> ClientStep:
        X = data.X if rows is None else data.X[rows]
        log_resp, norm = self._log_resp(params, X)
        stats = gmm_statistics(X, np.exp(log_resp), params["center"], self.cov_type)
        return ClientStep(stats, X.shape[0], float(norm.sum()), state)

    def stat_shapes(self, params):
        K, d = params["means"].shape
        sxx = {"full": (K, d, d), "tied": (d, d), "diag": (K, d), "spherical": (K, d)}
        return {"nk": (K,), "sx": (K, d), "sxx": sxx[self.cov_type]}

    def server_step(self, S, params, n_total):
        # Stochastic statistics (quantized, mini-batch, partial participation) can leave the set
        # where T is defined; project the parameters back (the exact-EM path is untouched).
        tiny = 1e-10 * max(float(np.abs(S["nk"]).sum()), 1e-300)
        if np.any(S["nk"] <= tiny):
            S = Stats({**S, "nk": np.maximum(S["nk"], tiny)})
        w, m, cov = gmm_m_step(S, params["center"], self.cov_type, self.reg)
        try:
            prec = compute_precision_cholesky(cov, self.cov_type)
        except ValueError:
            cov = floor_covariances(cov, self.cov_type, max(self.reg, 1e-6))
            prec = compute_precision_cholesky(cov, self.cov_type)
        return {"weights": w, "means": m, "precisions_cholesky": prec, "center": params["center"]}

    # ---- initialization exchanges (aggregates only) --------------------------------------
    def client_query(self, name, payload, data, state, rng):
        X = data.X
        if name == "moments":
            return {"n": X.shape[0], "sx": X.sum(0), "sxx": X.T @ X}, state
        if name == "kmeans":
            k = int(payload["k"])
            min_points = int(payload["min_points"])
            n_loc = min(k, X.shape[0] // max(min_points, 1))
            if n_loc < 1:
                d = X.shape[1]
                return {"centroids": np.zeros((0, d)), "counts": np.zeros(0)}, state
            _, labels, _ = kmeans(X, n_loc, rng, n_init=3)
            counts = np.bincount(labels, minlength=n_loc).astype(float)
            keep = counts >= min_points
            sums = np.zeros((n_loc, X.shape[1]))
            np.add.at(sums, labels, X)
            cent = sums[keep] / counts[keep, None]
            return {"centroids": cent, "counts": counts[keep]}, state
        if name == "hard_stats":
            centers = np.asarray(payload["centers"])
            d2 = (
                np.einsum("ij,ij->i", X, X)[:, None] - 2 * X @ centers.T
                + np.einsum("ij,ij->i", centers, centers)[None, :]
            )
            resp = np.zeros((X.shape[0], centers.shape[0]))
            resp[np.arange(X.shape[0]), d2.argmin(1)] = 1.0
            st = gmm_statistics(X, resp, np.asarray(payload["center"]), self.cov_type)
            return {f"stat/{k}": v for k, v in st.items()}, state
        if name == "loglik":
            _, norm = self._log_resp(payload_params(payload), X)
            return {"n": X.shape[0], "loglik": float(norm.sum())}, state
        return super().client_query(name, payload, data, state, rng)


def payload_params(payload: dict[str, Any]) -> Params:
    return {k[7:]: np.asarray(v) for k, v in payload.items() if k.startswith("params/")}


# ---------------------------------------------------------------------------------------------
# The estimator
# ---------------------------------------------------------------------------------------------
@register_estimator("gmm", description="Gaussian mixture fitted by federated EM (clusters)")
class FederatedGaussianMixture(FederatedEstimator):
    """Gaussian mixture fitted by federated EM; raw samples never leave the clients.

    Parameters
    ----------
    n_components : int, default 1
    covariance_type : {"full", "tied", "diag", "spherical"}, default "full"
    reg_covar : float, default 1e-6
        Added to the diagonal of every covariance.
    max_rounds : int, default 100
        Rounds at most (round 1 is the initialization E-step).
    tol : float, default 1e-3
        Convergence threshold on the change of the mean per-sample log-likelihood.
    init_params : {"kmeans-federated", "random"}, default "kmeans-federated"
        "kmeans-federated": each client runs k-means locally and sends centroids with counts
        (centroids of fewer than ``min_points_per_centroid`` samples are not sent); the server
        clusters them (weighted k-means) and one hard-assignment round gives the initial
        parameters. "random": means drawn from N(global mean, global covariance), covariances the
        global covariance divided by K, equal weights, from federated global moments.
    weights_init, means_init, precisions_init : array_like or None
        Explicit initial parameters, named and shaped as in scikit-learn; they override the
        corresponding parts of ``init_params``.
    federation : fl.Federation or None
        Participation, step size, compression, control variates, variance reduction.
    random_state : int or None
    verbose : bool or None
        Progress bar; None shows it when stderr is a terminal.
    min_points_per_centroid : int, default 5

    Attributes
    ----------
    weights_, means_, covariances_, precisions_cholesky_, precisions_
    history_ : History
        One record per round (objective, bytes, participants, seconds...).
    converged_ : bool
    n_rounds_ : int
    lower_bound_ : float
        Mean per-sample log-likelihood at the last round's broadcast parameters.

    Examples
    --------
    >>> import numpy as np, fedlatent as fl
    >>> rng = np.random.default_rng(0)
    >>> fd = fl.FederatedDataset.from_arrays({c: rng.normal(size=(50, 2)) + c for c in range(4)})
    >>> gm = fl.FederatedGaussianMixture(2, random_state=0, verbose=False).fit(fd)
    >>> gm.means_.shape
    (2, 2)
    """

    _save_arrays = ("weights_", "means_", "covariances_", "precisions_cholesky_")

    def __init__(
        self,
        n_components: int = 1,
        *,
        covariance_type: str = "full",
        reg_covar: float = 1e-6,
        max_rounds: int = 100,
        tol: float = 1e-3,
        init_params: str = "kmeans-federated",
        weights_init=None,
        means_init=None,
        precisions_init=None,
        federation=None,
        random_state=None,
        verbose: bool | None = None,
        min_points_per_centroid: int = 5,
    ):
        self.n_components = n_components
        self.covariance_type = covariance_type
        self.reg_covar = reg_covar
        self.max_rounds = max_rounds
        self.tol = tol
        self.init_params = init_params
        self.weights_init = weights_init
        self.means_init = means_init
        self.precisions_init = precisions_init
        self.federation = federation
        self.random_state = random_state
        self.verbose = verbose
        self.min_points_per_centroid = min_points_per_centroid

    # ---- validation -----------------------------------------------------------------------
    def _validate_params(self) -> None:
        K = self.n_components
        if not isinstance(K, int | np.integer) or K < 1:
            raise ValueError(f"n_components must be an integer >= 1, got {K!r}")
        if self.covariance_type not in COV_TYPES:
            raise ValueError(
                f"covariance_type must be one of {COV_TYPES}, got {self.covariance_type!r}"
            )
        if not (float(self.reg_covar) >= 0.0):
            raise ValueError(f"reg_covar must be >= 0, got {self.reg_covar!r}")
        if not isinstance(self.max_rounds, int | np.integer) or self.max_rounds < 1:
            raise ValueError(f"max_rounds must be an integer >= 1, got {self.max_rounds!r}")
        if not (float(self.tol) >= 0.0):
            raise ValueError(f"tol must be >= 0, got {self.tol!r}")
        if self.init_params not in ("kmeans-federated", "random"):
            raise ValueError(
                f"init_params must be 'kmeans-federated' or 'random', got {self.init_params!r}"
            )

    def _validate_data(self, fd: FederatedDataset) -> None:
        n = fd.n_samples
        if n < self.n_components:
            raise ValueError(
                f"the federation has {n} samples in all, fewer than n_components="
                f"{self.n_components}"
            )
        K, d = self.n_components, fd.n_features
        if self.weights_init is not None:
            w = np.asarray(self.weights_init, float)
            if w.shape != (K,) or np.any(w < 0) or not np.isclose(w.sum(), 1.0):
                raise ValueError(
                    f"weights_init must be {K} non-negative numbers summing to 1, got {w!r}"
                )
        if self.means_init is not None and np.shape(self.means_init) != (K, d):
            raise ValueError(
                f"means_init must have shape {(K, d)}, got {np.shape(self.means_init)}"
            )
        if self.precisions_init is not None:
            want = {"full": (K, d, d), "tied": (d, d), "diag": (K, d), "spherical": (K,)}[
                self.covariance_type
            ]
            if np.shape(self.precisions_init) != want:
                raise ValueError(
                    f"precisions_init must have shape {want} for covariance_type="
                    f"{self.covariance_type!r}, got {np.shape(self.precisions_init)}"
                )

    def _make_model(self, fd):
        return GMMModel(self.n_components, self.covariance_type, self.reg_covar)

    # ---- initialization without raw samples ---------------------------------------------------
    def _initialize(self, runtime: Runtime, model: GMMModel, seed: int) -> Params:
        cids = runtime.client_ids
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0xC0FFEE,)))
        mom = runtime.broadcast(cids, "query", {"query": "moments", "seed": seed})
        n = sum(float(mom[c]["n"]) for c in cids)
        sx = sum(np.asarray(mom[c]["sx"]) for c in cids)
        sxx = sum(np.asarray(mom[c]["sxx"]) for c in cids)
        center = sx / n
        gcov = sxx / n - np.outer(center, center)
        gcov = 0.5 * (gcov + gcov.T)
        K, d = self.n_components, center.shape[0]
        ct = self.covariance_type
        explicit = (
            self.weights_init is not None
            and self.means_init is not None
            and self.precisions_init is not None
        )
        if explicit:
            weights = means = cov = None
        elif self.init_params == "random":
            ridge = (1e-9 * np.trace(gcov) / d + 1e-12) * np.eye(d)
            jitter = np.linalg.cholesky(gcov + ridge)
            means = center + rng.standard_normal((K, d)) @ jitter.T
            weights = np.full(K, 1.0 / K)
            gcov = gcov / K  # K components share the global spread
            cov = {
                "full": np.repeat(gcov[None] + self.reg_covar * np.eye(d), K, 0),
                "tied": gcov + self.reg_covar * np.eye(d),
                "diag": np.repeat(np.diag(gcov)[None] + self.reg_covar, K, 0),
                "spherical": np.full(K, np.trace(gcov) / d + self.reg_covar),
            }[ct]
        else:
            km = runtime.broadcast(
                cids,
                "query",
                {"query": "kmeans", "k": K, "min_points": int(self.min_points_per_centroid),
                 "seed": seed},
            )
            cents = np.vstack([np.asarray(km[c]["centroids"]).reshape(-1, d) for c in cids])
            counts = np.concatenate([np.asarray(km[c]["counts"]).ravel() for c in cids])
            if cents.shape[0] < K:
                raise ValueError(
                    f"kmeans-federated initialization got {cents.shape[0]} centroids for "
                    f"{K} components (clients send only centroids of at least "
                    f"{self.min_points_per_centroid} samples); use init_params='random' or "
                    "lower min_points_per_centroid"
                )
            centers, _, _ = kmeans(cents, K, rng, sample_weight=counts, n_init=10)
            hs = runtime.broadcast(
                cids, "query",
                {"query": "hard_stats", "centers": centers, "center": center, "seed": seed},
            )
            S = None
            for c in cids:
                st = Stats({k[5:]: v for k, v in hs[c].items() if k.startswith("stat/")})
                S = st if S is None else S.add_(st)
            weights, means, cov = gmm_m_step(S / n, center, ct, self.reg_covar)
        if self.weights_init is not None:
            weights = np.asarray(self.weights_init, float).copy()
        if self.means_init is not None:
            means = np.asarray(self.means_init, float).copy()
        if self.precisions_init is not None:
            prec = np.asarray(self.precisions_init, float)
            if ct == "full":
                prec_chol = np.stack([linalg.cholesky(p, lower=True) for p in prec])
            elif ct == "tied":
                prec_chol = linalg.cholesky(prec, lower=True)
            else:
                prec_chol = np.sqrt(prec)
        else:
            prec_chol = compute_precision_cholesky(cov, ct)
        return {
            "weights": weights,
            "means": means,
            "precisions_cholesky": prec_chol,
            "center": center,
        }

    def _store(self, result: FitResult, model: GMMModel) -> None:
        p = result.params
        self.weights_ = p["weights"]
        self.means_ = p["means"]
        self.precisions_cholesky_ = p["precisions_cholesky"]
        _, _, self.covariances_ = gmm_m_step(
            result.S_hat, p["center"], self.covariance_type, self.reg_covar
        )
        self.lower_bound_ = result.history[-1].objective
        self._after_load()

    def _after_load(self) -> None:
        pc = self.precisions_cholesky_
        if self.covariance_type == "full":
            self.precisions_ = np.einsum("kij,klj->kil", pc, pc)
        elif self.covariance_type == "tied":
            self.precisions_ = pc @ pc.T
        else:
            self.precisions_ = pc**2

    # ---- prediction -----------------------------------------------------------------------
    def _check_X(self, X) -> np.ndarray:
        return check_features(self, X)

    def _weighted_log_prob(self, X) -> np.ndarray:
        return estimate_log_gaussian_prob(
            X, self.means_, self.precisions_cholesky_, self.covariance_type
        ) + np.log(self.weights_)

    def score_samples(self, X) -> np.ndarray:
        """Log-likelihood of each sample, shape (n_samples,)."""
        return logsumexp(self._weighted_log_prob(self._check_X(X)), axis=1)

    def score(self, X) -> float:
        """Mean per-sample log-likelihood. X may be an array or a FederatedDataset (computed on
        the clients; only sums come back)."""
        if isinstance(X, FederatedDataset):
            tot, n = self._federated_loglik(X)
            return tot / n
        return float(self.score_samples(X).mean())

    def _federated_loglik(self, fd: FederatedDataset) -> tuple[float, int]:
        from ..engine.inprocess import InProcessRuntime

        check_is_fitted(self)
        rt = InProcessRuntime(fd)
        model = GMMModel(self.n_components, self.covariance_type, self.reg_covar)
        setup_clients(rt, model)
        params = {"weights": self.weights_, "means": self.means_,
                  "precisions_cholesky": self.precisions_cholesky_}
        msg = {"query": "loglik", **{f"params/{k}": v for k, v in params.items()}}
        rep = rt.broadcast(rt.client_ids, "query", msg)
        return (sum(float(r["loglik"]) for r in rep.values()),
                sum(int(r["n"]) for r in rep.values()))

    def predict_proba(self, X) -> np.ndarray:
        """Posterior probability of each component, shape (n_samples, n_components)."""
        wlp = self._weighted_log_prob(self._check_X(X))
        return np.exp(wlp - logsumexp(wlp, axis=1)[:, None])

    def predict(self, X) -> np.ndarray:
        """Most probable component of each sample."""
        return self._weighted_log_prob(self._check_X(X)).argmax(axis=1)

    def _n_parameters(self) -> int:
        return n_free_parameters(self.n_components, self.n_features_in_, self.covariance_type)

    def bic(self, X) -> float:
        """Bayesian information criterion (lower is better). X: array or FederatedDataset."""
        n = X.n_samples if isinstance(X, FederatedDataset) else self._check_X(X).shape[0]
        return -2 * self.score(X) * n + self._n_parameters() * np.log(n)

    def aic(self, X) -> float:
        """Akaike information criterion (lower is better). X: array or FederatedDataset."""
        n = X.n_samples if isinstance(X, FederatedDataset) else self._check_X(X).shape[0]
        return -2 * self.score(X) * n + 2 * self._n_parameters()

    def sample(self, n_samples: int = 1, random_state=None) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n_samples`` from the fitted mixture; returns (X, component labels)."""
        check_is_fitted(self)
        if n_samples < 1:
            raise ValueError(f"n_samples must be >= 1, got {n_samples}")
        rng = np.random.default_rng(random_state)
        counts = rng.multinomial(n_samples, self.weights_)
        d = self.means_.shape[1]
        Xs, ys = [], []
        for k, nk in enumerate(counts):
            if nk == 0:
                continue
            if self.covariance_type == "full":
                cov = self.covariances_[k]
            elif self.covariance_type == "tied":
                cov = self.covariances_
            elif self.covariance_type == "diag":
                cov = np.diag(self.covariances_[k])
            else:
                cov = self.covariances_[k] * np.eye(d)
            Xs.append(rng.multivariate_normal(self.means_[k], cov, nk))
            ys.append(np.full(nk, k))
        return np.vstack(Xs), np.concatenate(ys)
