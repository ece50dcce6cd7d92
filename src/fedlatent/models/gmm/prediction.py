"""The fitted Gaussian mixture's prediction and loading hooks, without scikit-learn: shared by
the estimator (:mod:`.estimator`) and the saved model read for prediction alone
(:mod:`.saved`), so the two compute and refuse the same."""

from __future__ import annotations

import numpy as np

from ...engine.contract.model import Capabilities, Params
from ...engine.estimation.prediction import MixturePrediction
from .math import estimate_log_gaussian_prob, n_free_parameters

__all__ = ["GaussianPrediction"]


class GaussianPrediction(MixturePrediction):
    """``_estimate_weighted_log_prob`` (so predict, score, bic...), the fitted parameters, the
    invariants of a loaded model and its derived precisions, from ``weights_``, ``means_``,
    ``covariances_``, ``precisions_cholesky_``, ``covariance_type`` and ``n_features_in_``."""

    _save_arrays = ("weights_", "means_", "covariances_", "precisions_cholesky_")
    capabilities = Capabilities(secure_aggregation=True, differential_privacy=True,
                                missing_values=True)  # NaN: .missing (issue 25)

    def _fitted_k(self) -> int:
        """The number of components of the fitted mixture."""
        return int(np.shape(self.weights_)[0])

    def _check_loaded(self) -> None:
        from ...engine.protocol import loadcheck as lc
        from . import checks as gmm_checks

        K = getattr(self, "n_components_", self.n_components)  # a saved "auto" fit: chosen K
        if K == "auto":
            raise ValueError("a model saved with n_components='auto' must record the chosen "
                             "number (entry 'selection')")
        K, d, ct = int(K), int(self.n_features_in_), self.covariance_type
        lc.expect_shape(self, "weights_", (K,))
        lc.expect_shape(self, "means_", (K, d))
        lc.expect_simplex(self, "weights_")
        gmm_checks.expect_covariances(self, "covariances_", ct, K, d)
        gmm_checks.expect_precisions_cholesky(self, "precisions_cholesky_", ct, K, d)

    def _after_load(self) -> None:
        self.n_components_ = self._fitted_k()
        pc = self.precisions_cholesky_
        if self.covariance_type == "full":
            self.precisions_ = np.einsum("kij,klj->kil", pc, pc)
        elif self.covariance_type == "tied":
            self.precisions_ = pc @ pc.T
        else:
            self.precisions_ = pc**2

    def _estimate_weighted_log_prob(self, X) -> np.ndarray:
        """``log p(x | k) + log pi_k`` (the base gives predict, score, bic... from it); for
        rows with NaN, the density of their observed part."""
        if np.isnan(X).any():
            from .missing import missing_log_prob

            return missing_log_prob(X, self.means_, self.covariances_,
                                    self.covariance_type) + np.log(self.weights_)
        return estimate_log_gaussian_prob(
            X, self.means_, self.precisions_cholesky_, self.covariance_type
        ) + np.log(self.weights_)

    def _fitted_params(self) -> Params:
        return {"weights": self.weights_, "means": self.means_,
                "precisions_cholesky": self.precisions_cholesky_}

    def _n_parameters(self) -> int:
        return n_free_parameters(self._fitted_k(), self.n_features_in_, self.covariance_type)
