"""Frequency weights: one non-negative finite number per row, checked once, up front.

A row of weight ``w`` counts as ``w`` copies of itself in every model's statistics (a row of
weight 2 is the row twice, exactly); a weight need not be a whole number. Weights change the
sums, never the records: disclosure thresholds count the rows of positive weight (a weight-100
row is still one record, and a row of weight 0 contributes nothing, so it is not counted).

What is refused (each error names the weight column and at most ten clients): a weight that is
not a number, negative, NaN or infinite, and a client whose weights are all zero (it would
contribute nothing; leave it out of the federation).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .validation import DataValidationError, name_list

__all__ = ["check_weights", "weight_array"]


def weight_array(values, column: str, client: str, n_rows: int) -> np.ndarray:
    """One client's weights as float64 of shape (n_rows,).

    Parameters
    ----------
    values : array-like
        The client's weight of each row.
    column : str
        The weight column's name (for the message).
    client : str
        The client's id (for the message).
    n_rows : int
        The client's number of rows.

    Returns
    -------
    ndarray of shape (n_rows,)
    """
    w = np.asarray(values)
    if w.dtype == object or w.dtype.kind not in "biuf":
        try:
            w = w.astype(np.float64)
        except (TypeError, ValueError):
            raise DataValidationError(
                f"client {client!r}: weight column {column!r} is not numeric; give one "
                "non-negative number per row") from None
    w = w.astype(np.float64).reshape(-1)
    if w.shape[0] != n_rows:
        raise DataValidationError(f"client {client!r}: weight column {column!r} has "
                                  f"{w.shape[0]} values but the client has {n_rows} rows")
    return w


_PROBLEMS = (
    ("NaN", np.isnan, "give every row a weight"),
    ("infinite", np.isinf, "give every row a finite weight"),
    ("negative", lambda w: w < 0, "frequency weights are counts: give weights >= 0"),
)


def check_weights(weights: Mapping[str, np.ndarray], column: str) -> None:
    """Raise :class:`DataValidationError` when a client's weights cannot be frequency weights.

    Parameters
    ----------
    weights : mapping of str to ndarray of shape (n_rows,)
        Each client's weights (float64, from :func:`weight_array`).
    column : str
        The weight column's name.

    Raises
    ------
    DataValidationError
        Naming the column, the problem and at most ten of the clients that have it.
    """
    for what, test, fix in _PROBLEMS:
        bad = {c: int(test(w).sum()) for c, w in weights.items()}
        bad = {c: k for c, k in bad.items() if k}
        if bad:
            first = next(iter(bad))
            raise DataValidationError(
                f"weight column {column!r} has {what} values at clients {name_list(bad)} "
                f"({bad[first]} at client {first!r}); {fix}")
    zero = [c for c, w in weights.items() if not np.any(w > 0)]
    if zero:
        raise DataValidationError(
            f"weight column {column!r} is zero on every row of clients {name_list(zero)}; such "
            "a client contributes nothing: leave it out or give its rows positive weights")
