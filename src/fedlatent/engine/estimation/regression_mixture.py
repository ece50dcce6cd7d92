"""The base of regression-mixture estimators: a density of ``y`` given ``x``, so prediction and
scores take ``y`` (what :class:`~fedlatent.engine.estimation.base_mixture.FederatedMixture`
gives a density of ``x`` alone).

A regression mixture ``p(y | x) = sum_k pi_k(x) f_k(y | x)`` implements
:meth:`FederatedRegressionMixture._estimate_weighted_log_prob` (``log f_k(y | x) + log
pi_k(x)`` of each row and component), :meth:`~FederatedRegressionMixture._predict_mean`
(``E[y | x]``) and ``_n_parameters``; :meth:`~FederatedRegressionMixture.predict`,
:meth:`~FederatedRegressionMixture.predict_proba`,
:meth:`~FederatedRegressionMixture.score_samples`, :meth:`~FederatedRegressionMixture.score`
(arrays, or federated data through the clients' ``loglik`` query),
:meth:`~FederatedRegressionMixture.bic` and :meth:`~FederatedRegressionMixture.aic` follow, with
the load checks of the fitted weights and coefficients.

A model fitted on data built from a formula (``FederatedDataset.from_pandas(...,
formula="y ~ x1 + C(sex)")``) keeps the formula (``formula_``, saved with the model): rows given
as a DataFrame of the formula's variables are turned into the design the same way, with the
levels agreed at fit, and a DataFrame holding the formula's response gives ``y`` too.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np

from fedlatent.data.dataset import FederatedDataset
from fedlatent.engine.estimation.estimator import FederatedEstimator, check_features
from fedlatent.engine.protocol.numerics import logsumexp

__all__ = ["FederatedRegressionMixture"]


class FederatedRegressionMixture(FederatedEstimator):
    """A federated estimator of a mixture of regressions (``y`` given ``x``).

    Required hooks beyond :class:`FederatedEstimator`'s: :meth:`_estimate_weighted_log_prob`,
    :meth:`_predict_mean`, ``_n_parameters`` and ``_fitted_params`` (for scores on federated
    data); :meth:`_validate_target` checks a federated dataset's target before scoring.
    Fitted attributes the load checks read: ``weights_`` (K,), ``coef_`` (K, d) and
    ``intercept_`` (K,), with ``_coef_width()`` giving ``d``.
    """

    _score_name = "mean log-likelihood"

    @abstractmethod
    def _estimate_weighted_log_prob(self, X: np.ndarray, y: np.ndarray) -> np.ndarray:
        """``log f_k(y_i | x_i) + log pi_k(x_i)`` for every row ``i`` and component ``k``.

        Parameters
        ----------
        X : ndarray of shape (n_samples, n_features)
            Rows already checked (:meth:`_check_X`).
        y : ndarray of shape (n_samples,)
            Targets already checked (:meth:`_check_y`).

        Returns
        -------
        ndarray of shape (n_samples, n_components)
        """

    @abstractmethod
    def _predict_mean(self, X: np.ndarray) -> np.ndarray:
        """``E[y | x]`` of the fitted mixture for checked rows ``X``, shape (n_samples,)."""

    @abstractmethod
    def _n_parameters(self) -> int:
        """The number of free parameters of the fitted mixture (for BIC and AIC)."""

    def _validate_target(self, fd: FederatedDataset) -> None:
        """Checks of a federated dataset's target before it is scored (default: it has one)."""
        if not fd.has_target:
            raise ValueError(f"{type(self).__name__} scores p(y | x): the federated dataset has "
                             "no target; build it with a target column")

    # ---- rows -----------------------------------------------------------------------------
    def _check_X(self, X) -> np.ndarray:
        """X as the checked rows the model scores: the fitted columns, or a DataFrame of a
        formula's variables turned into them (``formula_``)."""
        formula = getattr(self, "formula_", None)
        if formula is not None and hasattr(X, "columns") and not set(
                map(str, self.feature_names_in_)) <= set(map(str, X.columns)):
            X = formula.design_frame(X)
        return check_features(self, X)

    def _check_y(self, y, n: int, X=None) -> np.ndarray:
        """``y`` as a float array of ``n`` values, or a ValueError naming it; None with a
        DataFrame ``X`` holding the formula's response takes that column."""
        formula = getattr(self, "formula_", None)
        if y is None and formula is not None and hasattr(X, "columns") \
                and formula.target in X.columns:
            y = X[formula.target]
        if y is None:
            raise ValueError(f"y is required: {type(self).__name__}'s likelihood is p(y | x)")
        from fedlatent.data.validation import to_float_target

        # refuses text, complex, dates, NaN/inf and |y| > MAX_ABS_VALUE, naming y
        return to_float_target(y, "y", n=n)

    def _rows(self, X, y) -> tuple[np.ndarray, np.ndarray]:
        Xc = self._check_X(X)
        return Xc, self._check_y(y, Xc.shape[0], X)

    # ---- prediction and scores ------------------------------------------------------------
    def predict(self, X) -> np.ndarray:
        """The mixture's mean response ``E[y | x] = sum_k pi_k(x) E_k[y | x]``, shape (n,)."""
        return np.asarray(self._predict_mean(self._check_X(X)), dtype=np.float64)

    def predict_proba(self, X, y) -> np.ndarray:
        """Posterior probability of each component given (x, y), shape (n, K); rows sum to 1
        (``y`` None: the formula's response column of a DataFrame ``X``)."""
        wlp = self._estimate_weighted_log_prob(*self._rows(X, y))
        return np.exp(wlp - logsumexp(wlp, axis=1)[:, None])

    def score_samples(self, X, y) -> np.ndarray:
        """``log p(y_i | x_i)`` of each row, shape (n,) (``y`` None: the formula's response
        column of a DataFrame ``X``)."""
        return logsumexp(self._estimate_weighted_log_prob(*self._rows(X, y)), axis=1)

    def score(self, X, y=None) -> float:
        """Mean per-row log-likelihood. ``X`` may be a FederatedDataset with a target (computed
        on the clients; only sums come back), or rows with ``y``."""
        if isinstance(X, FederatedDataset):
            tot, n = self._federated_loglik(X)
            return tot / n
        return float(self.score_samples(X, y).mean())

    def score_dataset(self, fd: FederatedDataset) -> float:
        """Mean per-row log-likelihood over the clients of ``fd`` (which needs the target)."""
        return self.score(fd)

    def _federated_loglik(self, fd: FederatedDataset, runtime=None) -> tuple[float, int]:
        self._validate_target(fd)
        return super()._federated_loglik(fd, runtime)

    def _n_rows(self, X, y=None) -> int | float:
        return X.total_weight if isinstance(X, FederatedDataset) else self._check_X(X).shape[0]

    def bic(self, X, y=None) -> float:
        """Bayesian information criterion (lower is better): ``-2 log L + k log n``.
        X: rows with ``y``, or a FederatedDataset with a target."""
        if isinstance(X, FederatedDataset):
            tot, n = self._federated_loglik(X)
        else:
            s = self.score_samples(X, y)
            tot, n = float(s.sum()), s.shape[0]
        return -2.0 * tot + self._n_parameters() * np.log(n)

    def aic(self, X, y=None) -> float:
        """Akaike information criterion (lower is better): ``-2 log L + 2 k``."""
        return self.bic(X, y) - self._n_parameters() * (np.log(self._n_rows(X, y)) - 2.0)

    # ---- fitted attributes, formula, load checks ------------------------------------------
    def _coef_width(self) -> int:
        """Columns of ``coef_`` (default: every feature)."""
        return int(self.n_features_in_)

    def _store_fit(self, fd, ctx, result) -> None:
        #: the formula the data were built from (FederatedDataset.from_pandas(...,
        #: formula=...)), applied to DataFrames given to predict and score; None without one
        self.formula_ = getattr(fd, "formula", None)
        super()._store_fit(fd, ctx, result)

    def _save_extra(self) -> dict[str, Any]:
        formula = getattr(self, "formula_", None)
        return {} if formula is None else {"formula": formula.to_json()}

    def _load_extra(self, meta: dict[str, Any]) -> None:
        self.formula_ = None
        if meta.get("formula") is not None:
            from fedlatent.data.formula import FormulaDesign

            self.formula_ = FormulaDesign.from_json(meta["formula"])

    def _check_loaded(self) -> None:
        """The weights on the simplex and the coefficients' shapes (K components)."""
        from fedlatent.engine.protocol import loadcheck as lc

        K = getattr(self, "n_components_", getattr(self, "n_components", None))
        if K == "auto" or K is None:
            raise ValueError("a model saved with n_components='auto' must record the chosen "
                             "number (entry 'selection')")
        K = int(K)
        for name, shape in (("weights_", (K,)), ("coef_", (K, self._coef_width())),
                            ("intercept_", (K,))):
            lc.expect_shape(self, name, shape)
        lc.expect_simplex(self, "weights_")
