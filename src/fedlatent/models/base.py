"""The estimator base class lives in the engine (:mod:`fedlatent.engine.estimator`)."""

from ..engine.estimator import (  # noqa: F401
    FederatedEstimator,
    FitContext,
    NotFittedError,
    check_features,
    check_is_fitted,
    resolve_seed,
)
