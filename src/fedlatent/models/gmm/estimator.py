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

import numpy as np
from scipy import linalg

from ...data.dataset import FederatedDataset
from ...engine.estimator import FederatedEstimator, FitContext, check_features, check_is_fitted
from ...engine.exchange import array, number
from ...engine.loop import FitResult
from ...engine.messages import bordered, count_problem, psd_problem
from ...engine.model import Params
from ...engine.numerics import kmeans, logsumexp
from ...engine.params import ROUND_LOOP, Integer, Options, Real
from ...engine.registry import register_estimator
from ...engine.selection import AUTO_SIZE, Selection, check_candidates
from ...engine.stats import Stats
from .math import (
    COV_TYPES,
    compute_precision_cholesky,
    estimate_log_gaussian_prob,
    gmm_m_step,
    n_free_parameters,
)
from .model import GMMModel, gaussian_problem

__all__ = ["FederatedGaussianMixture", "initialize_gaussians"]

logger = logging.getLogger(__name__)


def _stat_shapes(K: int, d: int, covariance_type: str) -> dict[str, tuple[int, ...]]:
    sxx = {"full": (K, d, d), "tied": (d, d), "diag": (K, d), "spherical": (K, d)}
    return {"nk": (K,), "sx": (K, d), "sxx": sxx[covariance_type]}


def _units_check(ctx: FitContext):
    """``n`` in a reply must be the client's number of samples at setup."""
    def check(n, reply, c):
        return None if float(n) == ctx.n_units[c] else (
            f"claims {float(n):g} samples, {ctx.n_units[c]} at setup")
    return check


def _moments_expect(ctx: FitContext, d: int) -> dict:
    """The moments reply: ``n`` as at setup, ``[[n, sum x], [sum x, sum x x^T]]`` PSD."""
    def psd(sxx, reply, c):
        M = bordered(np.asarray(sxx)[None], np.asarray(reply["sx"])[None], [float(reply["n"])])
        return psd_problem("the moment matrix [[sum x x^T, sum x], [., n]]", M, None, "block")

    return {"n": number(low=1, check=_units_check(ctx)), "sx": array(d),
            "sxx": array(d, d, check=psd)}


def _counts_check(ctx: FitContext):
    """Local k-means counts: each and their total at most the client's samples."""
    def check(counts, reply, c):
        return count_problem("counts", counts, ctx.n_units[c], total=False) or (
            None if float(np.sum(counts)) <= ctx.n_units[c] * (1 + 1e-12) else
            f"sum to {float(np.sum(counts)):g}, more than the {ctx.n_units[c]} samples")
    return check


def _centroids_check(ctx: FitContext, mom):
    """Local centroids are means of disjoint sets of the client's samples: the moment matrix
    of its samples minus ``sum_j n_j [1; c_j][1; c_j]^T`` (the samples left over) is PSD."""
    def check(cents, reply, c):
        cents = np.asarray(cents, dtype=np.float64).reshape(-1, np.shape(mom[c]["sx"])[0])
        counts = np.asarray(reply["counts"], dtype=np.float64).ravel()
        if cents.shape[0] != counts.size:
            return None  # refused below with the numbers
        full = bordered(np.asarray(mom[c]["sxx"])[None], np.asarray(mom[c]["sx"])[None],
                        [float(mom[c]["n"])])[0]
        aug = np.hstack([cents, np.ones((counts.size, 1))]) * np.sqrt(counts)[:, None]
        used = aug.T @ aug
        slack = 1e-9 * (np.abs(full) + np.abs(used))
        return psd_problem("the samples left over by the centroids ([[sum x x^T, sum x], "
                           "[., n]] minus the centroids' share)", (full - used)[None],
                           slack[None], "block")
    return check


def _stats_check(ctx: FitContext, covariance_type: str):
    """Hard-assignment statistics: a Gaussian mixture's invariants over the client's samples."""
    def check(nk, reply, c):
        st = {k[5:]: np.asarray(v) for k, v in reply.items() if str(k).startswith("stat/")}
        return gaussian_problem(st, ctx.n_units[c], covariance_type)
    return check


def initialize_gaussians(
    ctx: FitContext,
    n_components: int,
    *,
    covariance_type: str = "full",
    reg_covar: float = 1e-6,
    init_params: str = "kmeans-federated",
    min_points_per_centroid: int = 5,
    weights_init=None,
    means_init=None,
    precisions_init=None,
) -> Params:
    """Initial Gaussian components from the clients' aggregates (never their rows).

    Every client sends its moments (n, sum x, sum x x^T); with "kmeans-federated" each also
    sends local k-means centroids of at least ``min_points_per_centroid`` samples with their
    counts, the server clusters them (weighted k-means) and one hard-assignment round of
    statistics gives the initial parameters; "random" draws means from N(global mean, global
    covariance). Every reply is checked (shapes, finite values, counts >= 0) and a client that
    fails to answer stops the fit with a message naming it. FedGMM's Gaussian part uses this too.

    Returns
    -------
    dict with ``weights`` (K,), ``means`` (K, d), ``precisions_cholesky`` and ``center`` (d,)
    """
    cids = ctx.client_ids
    seed = ctx.seed
    d = ctx.n_features
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0xC0FFEE,)))
    mom = ctx.ask("moments", expect=_moments_expect(ctx, d), what="initialization (moments)")
    n = sum(float(mom[c]["n"]) for c in cids)
    sx = sum(np.asarray(mom[c]["sx"]) for c in cids)
    sxx = sum(np.asarray(mom[c]["sxx"]) for c in cids)
    center = sx / n
    gcov = sxx / n - np.outer(center, center)
    gcov = 0.5 * (gcov + gcov.T)
    K = n_components
    ct = covariance_type
    explicit = weights_init is not None and means_init is not None and precisions_init is not None
    if explicit:
        weights = means = cov = None
    elif init_params == "random":
        ridge = (1e-9 * np.trace(gcov) / d + 1e-12) * np.eye(d)
        jitter = np.linalg.cholesky(gcov + ridge)
        means = center + rng.standard_normal((K, d)) @ jitter.T
        weights = np.full(K, 1.0 / K)
        gcov = gcov / K  # K components share the global spread
        cov = {
            "full": np.repeat(gcov[None] + reg_covar * np.eye(d), K, 0),
            "tied": gcov + reg_covar * np.eye(d),
            "diag": np.repeat(np.diag(gcov)[None] + reg_covar, K, 0),
            "spherical": np.full(K, np.trace(gcov) / d + reg_covar),
        }[ct]
    else:
        km = ctx.ask("kmeans", {"k": K, "min_points": int(min_points_per_centroid)},
                     expect={"counts": array(None, low=0, check=_counts_check(ctx)),
                             "centroids": array(None, d, check=_centroids_check(ctx, mom))},
                     what="k-means initialization")
        for c in cids:
            if np.shape(km[c]["centroids"])[0] != np.size(km[c]["counts"]):
                from ...engine.loop import FederatedFitError

                raise FederatedFitError(
                    f"k-means initialization: client {c!r} sent "
                    f"{np.shape(km[c]['centroids'])[0]} centroids with "
                    f"{np.size(km[c]['counts'])} counts; nothing of this exchange was used"
                )
        cents = np.vstack([np.asarray(km[c]["centroids"]).reshape(-1, d) for c in cids])
        counts = np.concatenate([np.asarray(km[c]["counts"]).ravel() for c in cids])
        if cents.shape[0] < K:
            raise ValueError(
                f"kmeans-federated initialization got {cents.shape[0]} centroids for "
                f"{K} components (clients send only centroids of at least "
                f"{min_points_per_centroid} samples); use init_params='random' or "
                "lower min_points_per_centroid"
            )
        centers, _, _ = kmeans(cents, K, rng, sample_weight=counts, n_init=10)
        shapes = _stat_shapes(K, d, ct)
        hs = ctx.ask("hard_stats", {"centers": centers, "center": center},
                     expect={f"stat/{k}": array(*shp, low=0 if k == "nk" else None,
                                                check=_stats_check(ctx, ct) if k == "nk" else None)
                             for k, shp in shapes.items()},
                     what="k-means initialization (hard-assignment statistics)")
        S = None
        for c in cids:
            st = Stats({k[5:]: v for k, v in hs[c].items() if k.startswith("stat/")})
            S = st if S is None else S.add_(st)
        weights, means, cov = gmm_m_step(S / n, center, ct, reg_covar)
    if weights_init is not None:
        weights = np.asarray(weights_init, float).copy()
    if means_init is not None:
        means = np.asarray(means_init, float).copy()
    if precisions_init is not None:
        prec = np.asarray(precisions_init, float)
        if ct == "full":
            prec_chol = np.stack([linalg.cholesky(p, lower=True) for p in prec])
        elif ct == "tied":
            prec_chol = linalg.cholesky(prec, lower=True)
        else:
            prec_chol = np.sqrt(prec)
    else:
        prec_chol = compute_precision_cholesky(cov, ct)
    return {"weights": weights, "means": means, "precisions_cholesky": prec_chol, "center": center}


@register_estimator("gmm", description="Gaussian mixture fitted by federated EM (clusters)")
class FederatedGaussianMixture(FederatedEstimator):
    """Gaussian mixture fitted by federated EM; raw samples never leave the clients.

    Parameters
    ----------
    n_components : int or "auto", default 1
        "auto": one fit per value of ``n_components_candidates``, the one of lowest BIC
        (:meth:`bic` on the fitted data, computed on the clients) is kept; ``n_components_``
        is the chosen number and ``selection_scores_`` every candidate's BIC.
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
    n_components_candidates : list of int or None, default None
        The numbers of components ``n_components="auto"`` tries; None: 1 to 8.

    Attributes
    ----------
    weights_, means_, covariances_, precisions_cholesky_, precisions_
    n_components_ : int
        The number of components of the fit (the chosen one with "auto").
    selection_scores_ : DataFrame
        Only with "auto": per candidate (index ``n_components``), ``bic``, ``loglik`` (summed
        over the rows), ``n_parameters``, ``n_iter``, ``converged`` and ``error``.
    history_ : History
        One record per round (objective, bytes, participants, seconds...).
    converged_ : bool
    n_iter_ : int
        Rounds run (``n_rounds_`` is an alias).
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

    _parameter_constraints = {
        **ROUND_LOOP,
        "n_components": [AUTO_SIZE],
        "covariance_type": [Options(*COV_TYPES)],
        "reg_covar": [Real(0)],
        "init_params": [Options("kmeans-federated", "random")],
        "weights_init": [None, "array-like"],
        "means_init": [None, "array-like"],
        "precisions_init": [None, "array-like"],
        "min_points_per_centroid": [Integer(1)],
        "n_components_candidates": [None, "array-like"],
    }

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
        n_components_candidates=None,
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
        self.n_components_candidates = n_components_candidates

    _score_name = "mean log-likelihood"

    def _check_params(self) -> None:
        if self.n_components != "auto":
            return
        check_candidates(self.n_components_candidates, range(1, 9), "n_components",
                         "n_components_candidates")
        given = [k for k in ("weights_init", "means_init", "precisions_init")
                 if getattr(self, k) is not None]
        if given:
            raise ValueError(f"{given[0]} fixes the number of components, but n_components="
                             "'auto' chooses it; give n_components a number or leave "
                             f"{given[0]} out")

    def _selection(self) -> Selection | None:
        if self.n_components != "auto":
            return None

        def bic(est, fd) -> dict:
            tot, n = est._federated_loglik(fd)
            k = est._n_parameters()
            return {"bic": -2.0 * tot + k * np.log(n), "loglik": tot, "n_parameters": k}

        return Selection("n_components", check_candidates(
            self.n_components_candidates, range(1, 9), "n_components",
            "n_components_candidates"), "bic", bic)

    def _fitted_k(self) -> int:
        """The number of components of the fitted mixture."""
        return int(np.shape(self.weights_)[0])

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
        K = self._fitted_k() if self.n_components == "auto" else self.n_components
        return GMMModel(K, self.covariance_type, self.reg_covar)

    def _initialize(self, ctx: FitContext) -> Params:
        return initialize_gaussians(
            ctx,
            self.n_components,
            covariance_type=self.covariance_type,
            reg_covar=self.reg_covar,
            init_params=self.init_params,
            min_points_per_centroid=self.min_points_per_centroid,
            weights_init=self.weights_init,
            means_init=self.means_init,
            precisions_init=self.precisions_init,
        )

    def _store(self, result: FitResult, model: GMMModel) -> None:
        p = result.params
        self.weights_ = p["weights"]
        self.means_ = p["means"]
        self.precisions_cholesky_ = p["precisions_cholesky"]
        self.n_components_ = int(np.shape(p["weights"])[0])
        _, _, self.covariances_ = gmm_m_step(
            result.S_hat, p["center"], self.covariance_type, self.reg_covar
        )
        self.lower_bound_ = result.history[-1].objective
        self._after_load()

    def _check_loaded(self) -> None:
        from ...engine import loadcheck as lc

        K = getattr(self, "n_components_", self.n_components)  # a saved "auto" fit: chosen K
        if K == "auto":
            raise ValueError("a model saved with n_components='auto' must record the chosen "
                             "number (entry 'selection')")
        K, d, ct = int(K), int(self.n_features_in_), self.covariance_type
        lc.expect_shape(self, "weights_", (K,))
        lc.expect_shape(self, "means_", (K, d))
        lc.expect_simplex(self, "weights_")
        lc.expect_covariances(self, "covariances_", ct, K, d)
        lc.expect_precisions_cholesky(self, "precisions_cholesky_", ct, K, d)

    def _after_load(self) -> None:
        self.n_components_ = self._fitted_k()
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

    def _fitted_params(self) -> Params:
        return {"weights": self.weights_, "means": self.means_,
                "precisions_cholesky": self.precisions_cholesky_}

    def score_dataset(self, fd: FederatedDataset) -> float:
        """Mean per-sample log-likelihood over the clients of ``fd``."""
        return self.score(fd)

    def to_sklearn(self):
        """The fitted mixture as a fitted ``sklearn.mixture.GaussianMixture`` (same weights,
        means, covariances and precisions; its ``score_samples`` agrees to rounding)."""
        from sklearn.mixture import GaussianMixture

        check_is_fitted(self)
        gm = GaussianMixture(self._fitted_k(), covariance_type=self.covariance_type,
                             reg_covar=self.reg_covar, tol=self.tol, max_iter=self.max_rounds)
        gm.weights_ = np.array(self.weights_, copy=True)
        gm.means_ = np.array(self.means_, copy=True)
        gm.covariances_ = np.array(self.covariances_, copy=True)
        gm.precisions_cholesky_ = np.array(self.precisions_cholesky_, copy=True)
        gm.precisions_ = np.array(self.precisions_, copy=True)
        gm.converged_ = bool(self.converged_)
        gm.n_iter_ = int(self.n_iter_)
        gm.lower_bound_ = float(self.history_[-1].objective)
        gm.n_features_in_ = int(self.n_features_in_)
        gm.feature_names_in_ = np.array(self.feature_names_in_, dtype=object)
        return gm

    def predict_proba(self, X) -> np.ndarray:
        """Posterior probability of each component, shape (n_samples, n_components)."""
        wlp = self._weighted_log_prob(self._check_X(X))
        return np.exp(wlp - logsumexp(wlp, axis=1)[:, None])

    def predict(self, X) -> np.ndarray:
        """Most probable component of each sample."""
        return self._weighted_log_prob(self._check_X(X)).argmax(axis=1)

    def _n_parameters(self) -> int:
        return n_free_parameters(self._fitted_k(), self.n_features_in_, self.covariance_type)

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
