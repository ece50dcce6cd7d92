"""The base of mixture estimators: prediction and scores from one hook, as scikit-learn's
``BaseMixture`` gives them.

A mixture estimator implements :meth:`FederatedMixture._estimate_weighted_log_prob` (``log
p(x | k) + log pi_k`` of each row and component, at the fitted parameters) and
:meth:`FederatedMixture._n_parameters`; :meth:`~FederatedMixture.predict`,
:meth:`~FederatedMixture.predict_proba`, :meth:`~FederatedMixture.score_samples`,
:meth:`~FederatedMixture.score` (on arrays, or on federated data through the clients' ``loglik``
query), :meth:`~FederatedMixture.bic` and :meth:`~FederatedMixture.aic` follow.
"""

from __future__ import annotations

from abc import abstractmethod

import numpy as np

from fedlatent.data.dataset import FederatedDataset
from fedlatent.engine.estimation.estimator import FederatedEstimator, check_features
from fedlatent.engine.protocol.numerics import logsumexp

__all__ = ["FederatedMixture"]


class FederatedMixture(FederatedEstimator):
    """A federated estimator of a finite mixture (scikit-learn's ``BaseMixture`` interface).

    Required hooks beyond :class:`FederatedEstimator`'s: :meth:`_estimate_weighted_log_prob`,
    :meth:`_n_parameters`, and ``_fitted_params`` (for scores on federated data). A model whose
    rows are not plain feature vectors overrides :meth:`_check_X`.
    """

    _score_name = "mean log-likelihood"

    @abstractmethod
    def _estimate_weighted_log_prob(self, X: np.ndarray) -> np.ndarray:
        """``log p(x_i | k) + log pi_k`` for every row ``i`` and component ``k``.

        Parameters
        ----------
        X : ndarray of shape (n_samples, n_features)
            Rows already checked by :meth:`_check_X`.

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """

    @abstractmethod
    def _n_parameters(self) -> int:
        """The number of free parameters of the fitted mixture (for BIC and AIC)."""

    def _check_X(self, X) -> np.ndarray:
        """X as the rows the model scores, or a ValueError naming the column (default:
        :func:`~fedlatent.engine.estimation.estimator.check_features`)."""
        return check_features(self, X)

    def score_samples(self, X) -> np.ndarray:
        """Log-likelihood of each sample, shape (n_samples,)."""
        return logsumexp(self._estimate_weighted_log_prob(self._check_X(X)), axis=1)

    def score(self, X, y=None) -> float:
        """Mean per-sample log-likelihood. X may be an array or a FederatedDataset (computed on
        the clients; only sums come back)."""
        if isinstance(X, FederatedDataset):
            tot, n = self._federated_loglik(X)
            return tot / n
        return float(self.score_samples(X).mean())

    def score_dataset(self, fd: FederatedDataset) -> float:
        """Mean per-sample log-likelihood over the clients of ``fd``."""
        return self.score(fd)

    def predict_proba(self, X) -> np.ndarray:
        """Posterior probability of each component, shape (n_samples, n_components)."""
        wlp = self._estimate_weighted_log_prob(self._check_X(X))
        return np.exp(wlp - logsumexp(wlp, axis=1)[:, None])

    def predict(self, X) -> np.ndarray:
        """Most probable component of each sample."""
        return self._estimate_weighted_log_prob(self._check_X(X)).argmax(axis=1)

    def _n_rows(self, X) -> int:
        return X.total_weight if isinstance(X, FederatedDataset) else self._check_X(X).shape[0]

    def bic(self, X) -> float:
        """Bayesian information criterion (lower is better). X: array or FederatedDataset."""
        n = self._n_rows(X)
        return -2 * self.score(X) * n + self._n_parameters() * np.log(n)

    def aic(self, X) -> float:
        """Akaike information criterion (lower is better). X: array or FederatedDataset."""
        n = self._n_rows(X)
        return -2 * self.score(X) * n + 2 * self._n_parameters()

    #: why :meth:`summary` gives no standard errors (a mixture with its own observed
    #: information overrides :meth:`summary`, as :class:`~fedlatent.engine.estimation.inference.
    #: InferenceMixin` does)
    _no_se_reason = "no SE: the observed information is not implemented for this model"

    def summary(self):
        """A statsmodels-style table of the fitted parameters: one row per component and entry
        of each fitted array (``_fitted_params``), point estimates with the reason why there
        are no standard errors.

        Returns
        -------
        Summary
            ``.table`` indexed by (component, parameter), columns ``coef``, ``std err``,
            ``note``; ``.info`` the model, components, objective and convergence.
        """
        import pandas as pd
        from sklearn.utils.validation import check_is_fitted

        from fedlatent.engine.estimation.inference import Summary, sites_info

        check_is_fitted(self)
        rows, index = [], []
        for name, value in self._fitted_params().items():
            arr = np.asarray(value, dtype=float)
            for k in range(arr.shape[0]):
                flat = arr[k].reshape(-1)
                for j, v in enumerate(flat):
                    index.append((str(k), name if flat.size == 1 and arr.ndim == 1
                                  else f"{name}[{j}]"))
                    rows.append((float(v), np.nan, self._no_se_reason))
        table = pd.DataFrame(rows, columns=["coef", "std err", "note"],
                             index=pd.MultiIndex.from_tuples(index,
                                                             names=["component", "parameter"]))
        info = {"Model": type(self).__name__,
                "Components": str(int(np.asarray(self._fitted_params()["weights"]).shape[0])),
                f"Final {self._score_name}": f"{float(getattr(self, 'lower_bound_', np.nan)):.6g}",
                "Converged": str(bool(getattr(self, "converged_", False))),
                "Standard errors": self._no_se_reason, **sites_info(self)}
        return Summary(f"{type(self).__name__} results", info, table)
