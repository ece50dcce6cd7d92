"""Federated data: client id -> arrays (X, optional y, optional entity id per row).

The data of a client never leaves its :class:`ClientData`; runtimes hand each client object its
own :class:`ClientData` and only statistics cross.  Validation happens once, up front, with
errors that name the client and the column.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from .validation import (
    DataValidationError,
    check_array_values,
    check_client_ids,
    check_target_values,
    check_unique_names,
)

if TYPE_CHECKING:  # pandas is imported where a table is read or written (it is slow to import)
    import pandas as pd

    from .categorical import CategoricalEncoding  # (annotations only; frame.py encodes)
    from .formula import FormulaDesign  # (annotations only; frame.py builds it)

from .client import ClientData, client_row_order

__all__ = ["ClientData", "DataValidationError", "DatasetShape", "FederatedDataset",
           "client_row_order"]


#: clients whose rows ``has_missing`` tests in one NumPy call
_NAN_CHUNK = 4096


class DatasetShape:
    """What a federation's description answers, for the data in this process
    (:class:`FederatedDataset`) and for data that stay on the clients
    (:class:`~fedlatent.data.remote.RemoteDataset`): ids, sizes and width. Subclasses have
    ``feature_names`` and :meth:`client_sizes`."""

    def client_sizes(self) -> Mapping[str, int]:  # pragma: no cover - overridden
        raise NotImplementedError

    @property
    def client_ids(self) -> list[str]:
        """Client ids in sorted order (the order every runtime uses)."""
        return sorted(self.client_sizes())

    @property
    def n_clients(self) -> int:
        return len(self.client_sizes())

    @property
    def n_features(self) -> int:
        return len(self.feature_names)

    @property
    def n_samples(self) -> int:
        return int(sum(self.client_sizes().values()))


@dataclass
class FederatedDataset(DatasetShape):
    """A mapping client id -> :class:`ClientData` with shared column names.

    Build one with :meth:`from_pandas`, :meth:`from_arrays` or :meth:`read_table`.

    Parameters
    ----------
    clients : dict of str to ClientData
    feature_names : list of str
    target_name : str or None
    entity_name : str or None
    source_index : pandas Index or None
        The index of the table the dataset was made from (``from_pandas``); the rows'
        positions in it are each client's ``ClientData.rows``. See :attr:`row_index`.
    encoding : CategoricalEncoding or None
        The categorical encoding of the features (``from_pandas(..., categorical=...)``).
    weight_name : str or None
        The frequency-weight column (``from_pandas(..., weight=...)``); each client's weights
        are its ``ClientData.weight`` (:mod:`fedlatent.data.weights`). None: unweighted.
    formula : FormulaDesign or None
        The formula the features were built from (``from_pandas(..., formula=...)``).
    """

    clients: dict[str, ClientData]
    feature_names: list[str]
    target_name: str | None = None
    entity_name: str | None = None
    _validated: bool = field(default=False, repr=False)
    source_index: pd.Index | None = field(default=None, repr=False, compare=False)
    encoding: CategoricalEncoding | None = field(default=None, repr=False, compare=False)
    weight_name: str | None = None
    formula: FormulaDesign | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_client_ids(self.clients)  # 1 and "1" would merge below
        self.clients = {str(k): v for k, v in self.clients.items()}
        self.validate()

    # -- constructors ---------------------------------------------------------------------------
    @classmethod
    def from_arrays(
        cls,
        data: Mapping[object, object],
        *,
        feature_names: Sequence[str] | None = None,
        entities: Mapping[object, np.ndarray] | None = None,
        weights: Mapping[object, np.ndarray] | None = None,
    ) -> FederatedDataset:
        """From ``{client: X}`` or ``{client: (X, y)}`` (optionally ``(X, y, entity)``);
        ``weights``: ``{client: frequency weight of each row}`` for every client (see
        :meth:`from_pandas`'s ``weight``)."""
        from .arrays import arrays_parts

        return cls(**arrays_parts(data, feature_names, entities, weights))

    @classmethod
    def from_pandas(
        cls,
        df: pd.DataFrame,
        client: str,
        features: Sequence[str] | None = None,
        target: str | None = None,
        entity: str | None = None,
        *,
        categorical: str | CategoricalEncoding | None = None,
        handle_unknown: str = "error",
        categorical_columns: Sequence[str] | None = None,
        weight: str | None = None,
        formula: str | FormulaDesign | None = None,
    ) -> FederatedDataset:
        """From a long table with one row per sample and a client column.

        The dataset remembers each row's index label and position in ``df``: predictions on
        it (``est.predict_dataset(fd)``) come back as a Series with ``df``'s index, in ``df``'s
        row order, whatever the order of the clients (:meth:`to_source_order`).

        Parameters
        ----------
        df : DataFrame
        client : str
            Column holding the client id of each row.
        features : list of str or None
            Feature columns. None: every column but client, target and entity.
        target : str or None
            Response column (y), if any.
        entity : str or None
            Entity column for hierarchical data (rows are events of an entity).
        categorical : {"onehot", "onehot-all"}, CategoricalEncoding or None
            None: every feature must be numeric (a text column is refused, naming the client
            and the column). "onehot": every text, categorical or boolean feature column ``c``
            becomes indicator columns ``c=level``, one per level but the first (sorted) level,
            the reference (a full set of indicators sums to one, collinear with an intercept);
            "onehot-all" keeps every level. The levels are agreed across clients from the
            distinct labels each client reports for its column (those labels cross; a label
            held by one client reveals that it has such a row: merge rare levels first), never
            from their rows (:mod:`fedlatent.data.categorical`). A CategoricalEncoding (e.g.
            ``fd_train.encoding``) encodes with given levels: new data get the training columns.
        handle_unknown : {"error", "ignore"}, default "error"
            A label outside a given encoding's levels: an error naming the client, the column
            and the label, or all-zero indicators.
        categorical_columns : list of str or None
            With "onehot"/"onehot-all": exactly these feature columns are encoded (numbers as
            labels too, e.g. region codes); None: every text, categorical or boolean feature.
        weight : str or None
            Column of frequency weights: a non-negative finite number per row; a row of weight
            ``w`` counts as ``w`` copies of itself in every model's statistics (weight 2 is the
            row twice). Disclosure thresholds still count rows (records of positive weight),
            not weights. Refused: negative, NaN or infinite weights, and a client whose
            weights are all zero (:mod:`fedlatent.data.weights`).
        formula : str, FormulaDesign or None
            A Wilkinson formula (``"y ~ x1 + C(sex) + x1:x2"``, and ``"y ~ x | z"`` for
            concomitant variables z): the features are its design (no intercept column: the
            model adds its own), the target its response, categorical variables coded
            against levels agreed across clients as ``categorical="onehot"`` agrees them
            (:mod:`fedlatent.data.formula`; needs the ``formula`` extra). ``features`` then
            names columns kept as they are beside the design (an offset, trials), and
            ``categorical`` must be None. A FormulaDesign (``fd_train.formula``) codes new
            data with the training levels.
        """
        from .frame import frame_parts

        return cls(**frame_parts(df, client, features, target, entity, categorical,
                                 handle_unknown, categorical_columns, weight, formula))

    @classmethod
    def read_table(
        cls,
        path: str | os.PathLike,
        client: str,
        features: Sequence[str] | None = None,
        target: str | None = None,
        entity: str | None = None,
        *,
        categorical: str | CategoricalEncoding | None = None,
        handle_unknown: str = "error",
        categorical_columns: Sequence[str] | None = None,
        weight: str | None = None,
        formula: str | FormulaDesign | None = None,
        **read_kwargs,
    ) -> FederatedDataset:
        """Read a CSV (``.csv``, ``.csv.gz``, ``.tsv``) or Parquet (``.parquet``, ``.pq``) file
        (``categorical``, ``handle_unknown``, ``weight``, ``formula``: as in
        :meth:`from_pandas`)."""
        import pandas as pd

        path = os.fspath(path)
        if not os.path.exists(path):
            raise DataValidationError(f"data file {path!r} does not exist")
        low = path.lower()
        if low.endswith((".parquet", ".pq")):
            df = pd.read_parquet(path, **read_kwargs)
        elif low.endswith((".csv", ".csv.gz", ".txt")):
            df = pd.read_csv(path, **read_kwargs)
        elif low.endswith(".tsv"):
            df = pd.read_csv(path, sep="\t", **read_kwargs)
        else:
            raise DataValidationError(
                f"cannot read {path!r}: expected a .csv, .tsv or .parquet file"
            )
        return cls.from_pandas(df, client=client, features=features, target=target, entity=entity,
                               categorical=categorical, handle_unknown=handle_unknown,
                               categorical_columns=categorical_columns, weight=weight,
                               formula=formula)

    # -- validation -----------------------------------------------------------------------------
    def validate(self) -> None:
        """Check every client; raise DataValidationError naming the client and column."""
        if len(self.clients) == 0:
            raise DataValidationError("the federated dataset has no clients")
        names = [str(f) for f in self.feature_names]

        def name_of(j: int) -> str:
            return names[j] if j < len(names) else f"x{j}"

        width = None
        first = None
        for cid, cd in self.clients.items():
            X = np.asarray(cd.X)
            if X.ndim != 2:
                raise DataValidationError(f"client {cid!r}: X must be 2-D, got shape {X.shape}")
            if X.shape[0] == 0:
                raise DataValidationError(
                    f"client {cid!r} has no samples; remove it or give it data"
                )
            if width is None:
                width, first = X.shape[1], cid
            elif X.shape[1] != width:
                raise DataValidationError(
                    f"client {cid!r} has {X.shape[1]} features but client {first!r} has {width}; "
                    "every client must have the same columns"
                )
            check_array_values(X, name_of, where=f"client {cid!r}: ", allow_nan=True)
            if cd.y is not None:
                check_target_values(cd.y, self.target_name or "y", where=f"client {cid!r}: ",
                                    allow_nan=True)
        if len(self.feature_names) != width:
            raise DataValidationError(
                f"{len(self.feature_names)} feature names for {width} columns"
            )
        check_unique_names(self.feature_names, what="feature name", where="feature_names")
        self._check_weights()
        self._validated = True

    def _check_weights(self) -> None:
        """Weights for every client or none, each a valid frequency weight per row."""
        from .weights import check_weights, weight_array

        has = [cd.weight is not None for cd in self.clients.values()]
        if not any(has):
            return
        column = self.weight_name or "weight"
        if not all(has):
            none = [c for c, cd in self.clients.items() if cd.weight is None]
            raise DataValidationError(f"clients {none[:10]} have no {column!r} weights but "
                                      "others do; give weights for every client or none")
        for cid, cd in self.clients.items():
            cd.weight = weight_array(cd.weight, column, cid, cd.n_samples)
        check_weights({c: cd.weight for c, cd in self.clients.items()}, column)
        self.weight_name = column

    @property
    def total_weight(self) -> int | float:
        """The rows' frequency weights summed (their number when unweighted): the ``n`` of a
        likelihood criterion (BIC), as the duplicated rows would have."""
        if not self.has_weights:
            return self.n_samples
        return float(sum(cd.mass() for cd in self.clients.values()))

    @property
    def has_weights(self) -> bool:
        """Whether the rows carry frequency weights (:attr:`weight_name`)."""
        return any(c.weight is not None for c in self.clients.values())

    # -- access ---------------------------------------------------------------------------------
    def client_sizes(self) -> dict[str, int]:
        """Rows of each client (``len(X)``: ``ClientData.n_samples`` without a call per
        client)."""
        return dict(zip(self.clients, map(len, (cd.X for cd in self.clients.values()))))

    @property
    def client_ids(self) -> list[str]:
        """Client ids in sorted order (the order every runtime uses)."""
        return sorted(self.clients)

    @property
    def has_missing(self) -> bool:
        """Whether some client's X holds NaN (missing values; see ``docs/missing.md``):
        the clients' rows tested a few thousand clients at a time (one NumPy call each)."""
        Xs = [c.X for c in self.clients.values()]
        for lo in range(0, len(Xs), _NAN_CHUNK):
            part = Xs[lo:lo + _NAN_CHUNK]
            try:
                block = np.concatenate(part, axis=None)  # (each array flattened)
            except (ValueError, TypeError):  # (no common dtype: each on its own)
                block = None
            if block is None or block.dtype.kind not in "fiub":
                if any(np.isnan(np.asarray(x, dtype=np.float64)).any() for x in part):
                    return True
            elif block.dtype.kind == "f" and np.isnan(block).any():
                return True
        return False

    def refuse_missing(self, fix: str = "drop or impute them before fitting") -> None:
        """Raise today's NaN error (naming the client and the column) if some X holds NaN:
        for models that cannot take missing values."""
        from .validation import check_finite

        names = [str(f) for f in self.feature_names]
        for cid in self.client_ids:
            check_finite(np.asarray(self.clients[cid].X, dtype=np.float64), names,
                         where=f"client {cid!r}: ", fix_nan=fix)

    def missing_target_counts(self) -> dict[str, int]:
        """Rows whose target is NaN, per client (clients without any left out)."""
        out = {}
        for cid, cd in self.clients.items():
            if cd.y is not None:  # (no call for a client without a target)
                miss = cd.missing_target()
                if miss is not None:
                    out[cid] = int(miss.sum())
        return dict(sorted(out.items()))

    def refuse_missing_target(self) -> None:
        """Raise today's error for a NaN target (naming the client): for the models that
        cannot leave those rows out."""
        name = self.target_name or "y"
        for cid, k in self.missing_target_counts().items():
            if self.source_index is not None:  # a table's column (from_pandas, read_table)
                raise DataValidationError(f"client {cid!r}: target column {name!r} has {k} NaN "
                                          "values; drop those rows before fitting")
            raise DataValidationError(f"client {cid!r}: target {name!r} has {k} NaN or "
                                      "infinite values; drop those rows before fitting")

    def with_target(self) -> FederatedDataset:
        """The rows with a target (``ClientData.with_target``); a client left without rows
        is an error naming it."""
        clients = {cid: cd.with_target() for cid, cd in self.clients.items()}
        for cid, cd in clients.items():
            if cd.n_samples == 0:
                raise DataValidationError(f"client {cid!r} has no row with a target (every "
                                          f"{self.target_name or 'y'!r} is missing); remove it")
        return FederatedDataset(clients, list(self.feature_names), self.target_name,
                                self.entity_name, source_index=self.source_index,
                                encoding=self.encoding, formula=self.formula)

    @property
    def has_target(self) -> bool:
        return all(c.y is not None for c in self.clients.values())

    @property
    def has_entity(self) -> bool:
        return all(c.entity is not None for c in self.clients.values())

    def __getitem__(self, cid: str) -> ClientData:
        return self.clients[str(cid)]

    def __iter__(self) -> Iterator[str]:
        return iter(self.client_ids)

    def __len__(self) -> int:
        return len(self.clients)

    def items(self) -> Iterator[tuple[str, ClientData]]:
        for cid in self.client_ids:
            yield cid, self.clients[cid]

    def sizes(self) -> dict[str, int]:
        return {cid: cd.n_samples for cid, cd in self.items()}

    def _like(self, clients: dict[str, ClientData]) -> FederatedDataset:
        """A dataset of other clients (or rows) of the same table: names, index, encoding."""
        return FederatedDataset(clients, self.feature_names, self.target_name, self.entity_name,
                                source_index=self.source_index, encoding=self.encoding,
                                weight_name=self.weight_name, formula=self.formula)

    def subset(self, client_ids: Sequence[str]) -> FederatedDataset:
        return self._like({str(c): self.clients[str(c)] for c in client_ids})

    def map(self, fn) -> FederatedDataset:
        """A new dataset with ``fn(client_id, ClientData) -> ClientData`` applied per client
        (a client whose row count is unchanged keeps its rows' positions in the source and
        their weights)."""
        out = {}
        for cid, cd in self.items():
            new = fn(cid, cd)
            same = new.n_samples == cd.n_samples
            if new.rows is None and cd.rows is not None and same:
                new = new.replace(rows=cd.rows)
            if new.weight is None and cd.weight is not None and same:
                new = new.replace(weight=cd.weight)  # a row keeps its weight
            out[cid] = new
        return self._like(out)

    def train_test_split(
        self, test_size: float = 0.2, random_state: int | None = None
    ) -> tuple[FederatedDataset, FederatedDataset]:
        """Split each client's rows at random (each side keeps at least one row per client)."""
        rng = np.random.default_rng(random_state)
        tr, te = {}, {}
        for cid, cd in self.items():
            n = cd.n_samples
            if n < 2:
                raise DataValidationError(
                    f"client {cid!r} has {n} sample; a train/test split needs at least 2"
                )
            perm = rng.permutation(n)
            k = min(max(1, int(round(test_size * n))), n - 1)
            te[cid] = cd.take(np.sort(perm[:k]))
            tr[cid] = cd.take(np.sort(perm[k:]))
        return self._like(tr), self._like(te)

    # -- rows in the source's order -------------------------------------------------------------
    def _source_order(self) -> tuple[np.ndarray, pd.Index] | None:
        """``(perm, labels)``: the rows in client order (:meth:`pooled`), taken at ``perm``,
        are in source order, labelled ``labels``; None when the source is not known."""
        rows = [cd.rows for _, cd in self.items()]
        if self.source_index is None or any(r is None for r in rows):
            return None
        pos = np.concatenate(rows)
        perm = np.argsort(pos, kind="stable")
        return perm, self.source_index[pos[perm]]

    @property
    def row_index(self) -> pd.Index:
        """The label of every row, in the source's order.

        From a DataFrame (:meth:`from_pandas`, :meth:`read_table`): the DataFrame's index
        labels of the rows this dataset holds, in the DataFrame's row order (also after
        :meth:`subset`, :meth:`train_test_split` or :meth:`map`). From arrays (or when a row's
        source is unknown): a ``RangeIndex`` over the rows in client order, clients in
        :attr:`client_ids` order and each client's rows in order (the order of :meth:`pooled`).
        """
        import pandas as pd

        so = self._source_order()
        return pd.RangeIndex(self.n_samples) if so is None else so[1]

    def to_source_order(self, values, name: str | None = None, columns=None):
        """Per-row values computed client by client -> a Series (or DataFrame) in the source's
        order, indexed by :attr:`row_index`.

        Parameters
        ----------
        values : array-like of shape (n_samples,) or (n_samples, k), or dict client -> array
            One value (or row) per row of the dataset in client order (the order of
            :meth:`items` and :meth:`pooled`), or each client's values by id.
        name : str or None
            The Series' name.
        columns : list or None
            Column names of a 2-D result.

        Returns
        -------
        Series of shape (n_samples,) or DataFrame of shape (n_samples, k)
        """
        import pandas as pd

        if isinstance(values, Mapping):
            values = np.concatenate([np.asarray(values[cid]) for cid in self.client_ids])
        values = np.asarray(values)
        if values.ndim == 0 or values.shape[0] != self.n_samples:
            raise ValueError(f"got {values.shape[0] if values.ndim else 1} values for the "
                             f"{self.n_samples} rows of the dataset; give one per row, clients "
                             "in client_ids order")
        so = self._source_order()
        index = pd.RangeIndex(self.n_samples) if so is None else so[1]
        if so is not None:
            values = values[so[0]]
        if values.ndim == 1:
            return pd.Series(values, index=index, name=name)
        return pd.DataFrame(values.reshape(values.shape[0], -1), index=index, columns=columns)

    def target_series(self) -> pd.Series:
        """The target of every row in the source's order (as :meth:`to_source_order`), so that
        ``est.predict_dataset(fd)`` and it line up row for row."""
        if not self.has_target:
            raise ValueError("the dataset has no target; build it with target='COLUMN'")
        return self.to_source_order(np.concatenate([np.asarray(cd.y) for _, cd in self.items()]),
                                    name=self.target_name)

    def pooled(self) -> ClientData:
        """All clients' rows stacked in client-id order. For tests and centralized references
        only: a federated fit never calls it."""
        cds = [self.clients[c] for c in self.client_ids]
        X = np.vstack([c.X for c in cds])
        y = np.concatenate([c.y for c in cds]) if self.has_target else None
        ent = None
        if self.has_entity:
            ent = np.concatenate([c.entity for c in cds])
        w = np.concatenate([c.weight for c in cds]) if self.has_weights else None
        return ClientData(X, y, ent, weight=w)

    def to_pandas(self, client: str = "client") -> pd.DataFrame:
        import pandas as pd

        frames = []
        for cid, cd in self.items():
            f = pd.DataFrame(cd.X, columns=self.feature_names)
            if cd.y is not None:
                f[self.target_name or "y"] = cd.y
            if cd.entity is not None:
                f[self.entity_name or "entity"] = cd.entity
            if cd.weight is not None:
                f[self.weight_name or "weight"] = cd.weight
            f.insert(0, client, cid)
            frames.append(f)
        return pd.concat(frames, ignore_index=True)

    def __repr__(self) -> str:
        return (
            f"FederatedDataset(n_clients={self.n_clients}, n_samples={self.n_samples}, "
            f"n_features={self.n_features}, target={self.target_name!r}, "
            f"entity={self.entity_name!r})"
        )
