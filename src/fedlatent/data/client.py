"""One client's own data (:class:`ClientData`) and the grouping of a table's rows by client.

Below the readers (:mod:`.arrays`, :mod:`.frame`) and the dataset (:mod:`.dataset`), which all
build :class:`ClientData`: none of them imports another in a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from dataclasses import replace as _replace

import numpy as np

__all__ = ["ClientData", "client_row_order"]


def client_row_order(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of a table grouped by client, clients sorted by the text of their id.

    Parameters
    ----------
    keys : ndarray of shape (n_rows,)
        The client id of each row, as text.

    Returns
    -------
    ids : ndarray of shape (n_clients,)
        The distinct ids, sorted.
    order : ndarray of shape (n_rows,)
        The rows, client after client, each client's rows in table order (a stable sort).
    bounds : ndarray of shape (n_clients + 1,)
        Client ``j``'s rows are ``order[bounds[j]:bounds[j + 1]]``.

    The ids are hashed once (``pandas.factorize``) and only the distinct ones are sorted as text:
    rows are then sorted by an integer rank, much faster than sorting every row's text.
    """
    import pandas as pd

    codes, uniques = pd.factorize(keys)
    uniques = np.asarray(uniques, dtype=object)
    by_text = np.argsort(uniques, kind="stable")
    rank = np.empty(len(uniques), dtype=np.intp)
    rank[by_text] = np.arange(len(uniques))
    row_rank = rank[codes]
    order = np.argsort(row_rank, kind="stable")
    bounds = np.concatenate([[0], np.cumsum(np.bincount(row_rank, minlength=len(uniques)))])
    return uniques[by_text], order, bounds


@dataclass
class ClientData:
    """One client's own data. Stays inside the client object.

    Attributes
    ----------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,) or None
    entity : ndarray of shape (n_samples,) or None
        Entity id of each row (hierarchical data: agent = client, rows = events).
    rows : ndarray of shape (n_samples,) or None
        Position of each row in the table the dataset was made from (``from_pandas``); None
        for data made from arrays. Stays in this process: no message carries it.
    weight : ndarray of shape (n_samples,) or None
        Frequency weight of each row (:mod:`fedlatent.data.weights`): a row of weight ``w``
        counts ``w`` times in every sum; None: every row counts once.
    """

    X: np.ndarray
    y: np.ndarray | None = None
    entity: np.ndarray | None = None
    rows: np.ndarray | None = field(default=None, repr=False, compare=False)
    weight: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_samples(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])

    def weights_of(self, rows: np.ndarray | None = None) -> np.ndarray | None:
        """The frequency weights of ``rows`` (all when None); None when the data have none."""
        if self.weight is None:
            return None
        return self.weight if rows is None else self.weight[rows]

    def mass(self, rows: np.ndarray | None = None) -> float | int:
        """The weighted number of ``rows`` (all when None): the sum of their weights, or their
        number when the data have no weights (an int then)."""
        if self.weight is None:
            return int(self.n_samples if rows is None else len(rows))
        return float(self.weights_of(rows).sum())

    def n_records(self, rows: np.ndarray | None = None) -> int:
        """Records behind a sum over ``rows`` (all when None), what disclosure control counts:
        the rows of positive weight (a row of weight 100 is one record; one of weight 0 adds
        nothing to any sum)."""
        if self.weight is None:
            return int(self.n_samples if rows is None else len(rows))
        return int(np.count_nonzero(self.weights_of(rows) > 0))

    def replace(self, **changes) -> ClientData:
        """A copy with some fields changed (the others, weights and row positions included,
        kept)."""
        return _replace(self, **changes)

    def missing_target(self) -> np.ndarray | None:
        """The rows whose target is NaN (a boolean mask), or None when there are none."""
        if self.y is None or np.asarray(self.y).dtype.kind != "f":
            return None
        miss = np.isnan(self.y)
        return miss if miss.any() else None

    def with_target(self) -> ClientData:
        """The rows with a target (itself when none is missing): what a conditional model
        (y given x) fits; the rows without one carry no information about it."""
        miss = self.missing_target()
        return self if miss is None else self.take(np.flatnonzero(~miss))

    def take(self, rows: np.ndarray) -> ClientData:
        return ClientData(
            self.X[rows],
            None if self.y is None else self.y[rows],
            None if self.entity is None else self.entity[rows],
            None if self.rows is None else self.rows[rows],
            None if self.weight is None else self.weight[rows],
        )
