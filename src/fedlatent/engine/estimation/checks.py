"""The checks of a fitted estimator's input: fitted at all, and features like those it was
fitted with (scikit-learn's ``check_is_fitted`` and feature-name checks, with fedlatent's
refusals of non-finite and out-of-range values)."""

from __future__ import annotations

import numpy as np

from fedlatent.data.validation import DataValidationError

__all__ = ["check_enough_rows", "check_features", "check_is_fitted", "check_weights_init",
           "refuse_missing"]


def check_is_fitted(est, attr: str = "n_iter_") -> None:
    """Raise NotFittedError (scikit-learn's) unless ``est`` has been fitted."""
    if not hasattr(est, attr):
        from fedlatent.engine.errors import NotFittedError  # (imports scikit-learn)

        raise NotFittedError(
            f"this {type(est).__name__} is not fitted yet; call fit(fd) before using it"
        )


def check_features(est, X, what: str | None = None) -> np.ndarray:
    """X as a finite float array of shape (n_samples, n_features_in_), or a clear error.

    A DataFrame must have the columns the estimator was fitted with, in the same order
    (scikit-learn's check and message). A 1-D X is one sample. ``what`` names the estimator
    in the message (default: its class). Text, complex, date/time, NaN (unless the estimator
    declares ``capabilities.missing_values``), infinite values and values beyond
    ``fedlatent.data.validation.MAX_ABS_VALUE`` are refused (a ValueError naming the column),
    as the data layer refuses them at fit.
    """
    from fedlatent.data.validation import (
        check_finite,
        check_magnitude,
        frame_column,
        to_float_array,
    )

    check_is_fitted(est)
    fitted = [str(f) for f in getattr(est, "feature_names_in_", [])]
    if hasattr(X, "columns"):
        from sklearn.utils.validation import _check_feature_names

        _check_feature_names(est, X, reset=False)
        names = [str(c) for c in X.columns]
        X = np.column_stack(
            [frame_column(X.iloc[:, j], names[j], lambda i: "X: ").to_numpy(
                dtype=np.float64, na_value=np.nan) for j in range(len(names))]
        ) if len(names) else np.asarray(X, dtype=np.float64)
    else:
        names = fitted
        if hasattr(X, "toarray"):
            raise ValueError("X is a sparse matrix; fedlatent predicts on dense arrays: pass "
                             "X.toarray()")
        X = np.asarray(X)
        if X.ndim == 1:
            X = X.reshape(1, -1)
        X = to_float_array(X, lambda j: names[j] if j < len(names) else f"x{j}", where="X: ")
    if X.ndim != 2 or X.shape[1] != est.n_features_in_:
        raise ValueError(
            f"X has {X.shape[-1] if X.ndim else 0} features, but this {what or type(est).__name__}"
            f" was fitted with {est.n_features_in_} ({list(est.feature_names_in_)})"
        )
    check_finite(X, names, where="X: ", fix_nan="drop or impute them before predicting",
                 fix_inf="drop or clip them before predicting",
                 allow_nan=getattr(getattr(est, "capabilities", None), "missing_values", False))
    check_magnitude(X, names, where="X: ")
    return X


def refuse_missing(fd, remote: bool) -> None:
    """Today's NaN error for a model that cannot take missing values: in-process naming the
    client and the column; for a RemoteDataset the client (its ``describe`` reply said so)."""
    if not remote:
        fd.refuse_missing()
        return
    for c, e in fd.extras.items():
        if e.get("missing"):
            raise DataValidationError(f"client {c!r}: its features have NaN values; drop or "
                                      "impute them before fitting")


def check_enough_rows(fd, k: int, name: str, unit: str = "samples") -> None:
    """Refuse a federation with fewer rows in all than ``k`` (the ``name`` parameter).

    Parameters
    ----------
    fd : FederatedDataset
    k : int
        The number of components (clusters, input components) asked for.
    name : str
        The parameter that asked for them, named in the message.
    unit : str
        What a row is called in the message ("samples", "rows").
    """
    n = fd.n_samples
    if n < k:
        raise ValueError(f"the federation has {n} {unit} in all, fewer than {name}={k}")


def check_weights_init(weights_init, k: int) -> None:
    """Refuse user-given mixture weights that are not ``k`` non-negative numbers summing to 1
    (None: nothing given, nothing checked)."""
    if weights_init is None:
        return
    w = np.asarray(weights_init, float)
    if w.shape != (k,) or np.any(w < 0) or not np.isclose(w.sum(), 1.0):
        raise ValueError(f"weights_init must be {k} non-negative numbers summing to 1, got {w!r}")
