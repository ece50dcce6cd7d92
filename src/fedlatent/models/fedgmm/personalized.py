"""The predictor of one FedGMM client: the shared parameters and that client's ``pi_c``."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import pandas as pd

__all__ = ["PersonalizedFedGMM"]


class _Fitted(Protocol):
    """What a predictor reads of the fitted FedGMM (this module does not import the estimator,
    which imports it: no circle)."""

    classes_: np.ndarray

    def _predict_proba_pi(self, X, pi: np.ndarray) -> np.ndarray: ...

    def _score_pi(self, X, y, pi: np.ndarray) -> pd.DataFrame: ...


class PersonalizedFedGMM:
    """The predictor of one client: the shared parameters and that client's ``pi_c``.

    Built on the client's side (:meth:`FedGMM.personalize`, :meth:`FedGMM.adapt`); its ``pi``
    is the client's own and is never sent anywhere.

    Attributes
    ----------
    pi : ndarray of shape (M1, M2)
    classes_ : ndarray of shape (K,)
    """

    def __init__(self, estimator: _Fitted, pi: np.ndarray, client: str | None = None):
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
