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

from ...data.dataset import FederatedDataset
from ...engine.contract.model import Params
from ...engine.contract.params import store_params
from ...engine.contract.registry import register_estimator
from ...engine.contract.selection import Selection, bic_selection
from ...engine.estimation.base_mixture import FederatedMixture
from ...engine.estimation.checks import check_enough_rows, check_weights_init
from ...engine.estimation.estimator import FitContext, check_is_fitted
from ...engine.estimation.inference import InferenceMixin
from ...engine.rounds.loop import FitResult
from .init import GaussianStart, initialize_gaussians
from .math import (
    covariances_from_precisions,
    gmm_m_step,
    hold_degenerate,
)
from .model import GMMModel
from .params import PARAMETER_CONSTRAINTS, check_params
from .prediction import GaussianPrediction

__all__ = ["FederatedGaussianMixture", "initialize_gaussians"]

logger = logging.getLogger(__name__)


@register_estimator("gmm", description="Gaussian mixture fitted by federated EM (clusters)")
class FederatedGaussianMixture(InferenceMixin, GaussianPrediction, FederatedMixture):
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
    max_rounds : int or None, default None
        Rounds at most (round 1 is the initialization E-step).
        None: 1,000 rounds (100 with a numeric ``tol``), or under
        ``Federation(privacy=...)`` 2 rounds (every round is
        paid from the privacy budget; from the private k-means start two rounds reach the
        non-private optimum at 10^5 records, see ``docs/privacy.md``).
    tol : float or "auto", default "auto"
        "auto": stop once every parameter is within 0.1 standard error of the optimum (the
        summed log-likelihood within 0.005 nats of its limit, by Aitken's estimate from the
        last rounds: :mod:`fedlatent.engine.rounds.stopping`). A number: stop when the mean
        per-sample log-likelihood changes by less than ``tol`` (scikit-learn's rule, its
        default 1e-3).
    init_params : {"kmeans-sums", "kmeans-federated", "random"}, default "kmeans-sums"
        "kmeans-sums": a k-means start built from sums only: ``8 K`` candidate centres drawn
        from the pooled Gaussian, the clients' summed hard-assignment statistics to them, a
        weighted k-means of the populated candidates on the server, two Lloyd steps (summed
        too) and one M-step; the same start with or without secure aggregation (to the
        fixed-point rounding). "kmeans-federated": each client runs k-means locally and sends
        centroids with counts (centroids of fewer than ``min_points_per_centroid`` samples are
        not sent); the server clusters them (weighted k-means) and one hard-assignment round
        gives the initial parameters; not sums, so under secure aggregation it becomes
        "random" with a UserWarning. "random": means drawn from N(global mean, global
        covariance), covariances the global covariance divided by K, equal weights, from
        federated global moments.
    n_init : int, default 1
        Starts (scikit-learn's ``n_init``): the whole fit runs once per start, each from its
        own seed, and the start of highest final mean log-likelihood is kept (``init_scores_``,
        ``best_start_``; :mod:`fedlatent.engine.contract.starts`). Refused under differential
        privacy, partial participation and with checkpoints.
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
    init_scores_ : DataFrame
        Only with more than one start: per start (index ``start``), its ``seed``, ``score``
        (final mean log-likelihood over every client), ``n_iter`` and ``converged``;
        ``best_start_`` is the kept one.

    Examples
    --------
    >>> import numpy as np, fedlatent as fl
    >>> rng = np.random.default_rng(0)
    >>> fd = fl.FederatedDataset.from_arrays({c: rng.normal(size=(50, 2)) + c for c in range(4)})
    >>> gm = fl.FederatedGaussianMixture(2, random_state=0, verbose=False).fit(fd)
    >>> gm.means_.shape
    (2, 2)
    """

    _parameter_constraints = PARAMETER_CONSTRAINTS  # (.params: a node's describe too)

    def __init__(
        self,
        n_components: int = 1,
        *,
        covariance_type: str = "full",
        reg_covar: float = 1e-6,
        max_rounds: int | None = None,
        tol: float | str = "auto",
        init_params: str = "kmeans-sums",
        n_init: int = 1,
        weights_init=None,
        means_init=None,
        precisions_init=None,
        federation=None,
        random_state=None,
        verbose: bool | None = None,
        min_points_per_centroid: int = 5,
        n_components_candidates=None,
    ):
        store_params(self, locals())

    _multi_start = True  # n_init: engine/contract/starts.py
    # capabilities, _save_arrays and the prediction hooks: .prediction.GaussianPrediction
    _dp_init_releases = 2  # the pooled moments, the private k-means start
    #: the private plan: two rounds after the private k-means start (privacy_utility, 1e5
    #: records, epsilon 1: 0.30/0.53/0.40% held-out loss over three seeds, 1.18/1.31/0.35% at 3)
    _private_max_rounds = 2

    def _check_params(self) -> None:
        check_params(self.get_params(deep=False))

    def _selection(self) -> Selection | None:
        return bic_selection(self, range(1, 9))

    def _validate_data(self, fd: FederatedDataset) -> None:
        from .missing_estimator import missing_names

        self._missing = missing_names(self, fd)  # the feature names when fd has NaN
        check_enough_rows(fd, self.n_components, "n_components")
        K, d = self.n_components, fd.n_features
        check_weights_init(self.weights_init, K)
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
        model = GMMModel(K, self.covariance_type, self.reg_covar)
        if getattr(self, "_missing", None) is not None:
            model.batched_step = False  # rows with NaN: one client at a time (.missing)
        return model

    def _initialize(self, ctx: FitContext) -> Params:
        return initialize_gaussians(ctx, self.n_components, GaussianStart.of(self),
                                    missing=getattr(self, "_missing", None))

    def _store(self, result: FitResult, model: GMMModel) -> None:
        p = result.params
        self.weights_ = p["weights"]
        self.means_ = p["means"]
        self.precisions_cholesky_ = p["precisions_cholesky"]
        self.n_components_ = int(np.shape(p["weights"])[0])
        if model.privacy is not None:  # the floored covariances the M-step used
            self.covariances_ = covariances_from_precisions(p["precisions_cholesky"],
                                                             self.covariance_type)
        else:  # the M-step's covariances, components kept off a point mass as it keeps them
            _, _, cov = gmm_m_step(result.S_hat, p["center"], self.covariance_type,
                                   self.reg_covar)
            self.covariances_, held = hold_degenerate(cov, result.S_hat, self.covariance_type)
            self.degenerate_components_ = [int(k) for k in np.flatnonzero(held)]
            if self.degenerate_components_:
                from ...engine.contract.degenerate import DEGENERATE_FRACTION, warn_degenerate

                what = ("a covariance eigenvalue at {:g} of the pooled covariance's smallest"
                        if self.covariance_type == "full" else
                        "a variance at {:g} of the feature's pooled variance")
                warn_degenerate(type(self).__name__, self.degenerate_components_,
                                what.format(DEGENERATE_FRACTION))
        self.lower_bound_ = result.history[-1].objective
        self._after_load()

    def _degenerate_reason(self, n_rows: int | None) -> str:
        """A degenerate component ("" when none), for the size selection: weight worth fewer
        than d + 1 rows, or a covariance's smallest eigenvalue near zero (singular)."""
        from ...engine.estimation.inference import degenerate_reason
        from .inference import full_covariances

        held = list(getattr(self, "degenerate_components_", []) or [])
        if held:
            return (f"component {held[0]} collapsed onto a point mass (its covariance at the "
                    "floor; degenerate)")
        K, d = self.means_.shape
        eig = np.linalg.eigvalsh(full_covariances(self.covariances_, self.covariance_type, K, d))
        return degenerate_reason(self.weights_, eig.min(1), self.reg_covar, n_rows, d + 1)

    def _inference_layout(self):  # fedlatent.engine.estimation.inference, .inference
        from .inference import gmm_layout

        return gmm_layout(self.weights_, self.means_, self.covariances_, self.covariance_type,
                          [str(f) for f in self.feature_names_in_])

    def to_sklearn(self):
        """The fitted mixture as a fitted ``sklearn.mixture.GaussianMixture`` (same weights,
        means, covariances and precisions; its ``score_samples`` agrees to rounding)."""
        from sklearn.mixture import GaussianMixture

        check_is_fitted(self)
        gm = GaussianMixture(self._fitted_k(), covariance_type=self.covariance_type,
                             reg_covar=self.reg_covar, tol=1e-3 if self.tol == "auto" else self.tol,
                             max_iter=self._max_rounds())
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

    def impute(self, X) -> np.ndarray:
        """``X`` with each NaN replaced by its conditional mean given the row's observed
        values under the fitted mixture (:func:`.missing_estimator.impute`).

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features), NaN where missing

        Returns
        -------
        ndarray of shape (n_samples, n_features)
        """
        from .missing_estimator import impute

        return impute(self, self._check_X(X))

    def sample_missing(self, X, n_draws: int = 5, random_state=None) -> np.ndarray:
        """Multiple imputation: ``n_draws`` completions of ``X``, each NaN drawn from its
        conditional distribution given the row's observed values (a component from its
        posterior, then the conditional Gaussian); the fitted parameters are held fixed
        (no parameter uncertainty yet).

        Returns
        -------
        ndarray of shape (n_draws, n_samples, n_features)
        """
        from .missing_estimator import sample_missing

        if int(n_draws) < 1:
            raise ValueError(f"n_draws must be >= 1, got {n_draws}")
        return sample_missing(self, self._check_X(X), int(n_draws),
                              np.random.default_rng(random_state))

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

