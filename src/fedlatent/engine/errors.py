"""The exceptions and warnings users catch: scikit-learn's own, so ``except NotFittedError`` and
warning filters written for scikit-learn work for fedlatent too.

This module imports scikit-learn; the engine imports it only where a warning or error is raised,
so a Flower client process (one per message) does not pay for it.
"""

from __future__ import annotations

from sklearn.exceptions import ConvergenceWarning as _SklearnConvergenceWarning
from sklearn.exceptions import NotFittedError as _SklearnNotFittedError

__all__ = ["ConvergenceWarning", "NotFittedError"]


class ConvergenceWarning(_SklearnConvergenceWarning):
    """The fit stopped at ``max_rounds`` before the objective settled (scikit-learn's warning)."""


class NotFittedError(_SklearnNotFittedError):
    """The estimator is used before ``fit`` (scikit-learn's error)."""
