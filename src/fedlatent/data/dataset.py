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
    check_entity_ids,
    check_target_values,
    check_unique_names,
    frame_column,
    to_float_array,
)

if TYPE_CHECKING:  # pandas is imported where a table is read or written (it is slow to import)
    import pandas as pd

__all__ = ["ClientData", "DataValidationError", "DatasetShape", "FederatedDataset",
           "client_row_order"]


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
    """

    X: np.ndarray
    y: np.ndarray | None = None
    entity: np.ndarray | None = None

    @property
    def n_samples(self) -> int:
        return int(self.X.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.X.shape[1])

    def take(self, rows: np.ndarray) -> ClientData:
        return ClientData(
            self.X[rows],
            None if self.y is None else self.y[rows],
            None if self.entity is None else self.entity[rows],
        )


def _client_of_row(df: pd.DataFrame, client: str):
    """``where(i)``: the message prefix naming the client of row ``i`` of ``df``."""
    return lambda i: f"client {str(df[client].iloc[i])!r}: "


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
    """

    clients: dict[str, ClientData]
    feature_names: list[str]
    target_name: str | None = None
    entity_name: str | None = None
    _validated: bool = field(default=False, repr=False)

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
    ) -> FederatedDataset:
        """From ``{client: X}`` or ``{client: (X, y)}`` (optionally ``(X, y, entity)``)."""
        if not isinstance(data, Mapping) or len(data) == 0:
            raise DataValidationError(
                "from_arrays expects a non-empty dict {client: X} or {client: (X, y)}"
            )
        check_client_ids(data)  # 1 and "1" would merge below
        given = list(feature_names) if feature_names is not None else []

        def name_of(j: int) -> str:
            return str(given[j]) if j < len(given) else f"x{j}"

        clients: dict[str, ClientData] = {}
        width = None
        has_y = None
        for cid, value in data.items():
            cid = str(cid)
            y = ent = None
            if isinstance(value, tuple | list) and len(value) in (2, 3):
                X = value[0]
                y = value[1]
                if len(value) == 3:
                    ent = value[2]
            else:
                X = value
            X = np.asarray(X)
            if X.ndim == 1:
                X = X.reshape(-1, 1)
            if X.ndim != 2:
                raise DataValidationError(
                    f"client {cid!r}: X must be 2-D (n_samples, n_features), got shape {X.shape}"
                )
            # complex, dates and text are refused here, before the cast could hide them
            X = to_float_array(X, name_of, where=f"client {cid!r}: ")
            if width is None:  # widths are compared by validate(), on construction
                width = X.shape[1]
            if has_y is None:
                has_y = y is not None
            elif has_y != (y is not None):
                raise DataValidationError(
                    f"client {cid!r}: some clients have y and some do not; give y for all or none"
                )
            if y is not None:
                y = np.asarray(y)
                if y.ndim != 1:
                    y = y.reshape(-1)
                check_target_values(y, "y", where=f"client {cid!r}: ")
                if y.shape[0] != X.shape[0]:
                    raise DataValidationError(
                        f"client {cid!r}: y has {y.shape[0]} values but X has {X.shape[0]} rows"
                    )
            if entities is not None and cid in {str(k) for k in entities}:
                ent = np.asarray({str(k): v for k, v in entities.items()}[cid])
            if ent is not None:
                ent = np.asarray(ent)
                if ent.shape[0] != X.shape[0]:
                    raise DataValidationError(
                        f"client {cid!r}: entity has {ent.shape[0]} values but X has "
                        f"{X.shape[0]} rows"
                    )
            clients[cid] = ClientData(X, y, ent)
        names = list(feature_names) if feature_names is not None else [
            f"x{j}" for j in range(width)
        ]
        if len(names) != width:
            raise DataValidationError(
                f"feature_names has {len(names)} names but the data have {width} columns"
            )
        return cls(
            clients,
            names,
            target_name="y" if has_y else None,
            entity_name="entity" if any(c.entity is not None for c in clients.values()) else None,
        )

    @classmethod
    def from_pandas(
        cls,
        df: pd.DataFrame,
        client: str,
        features: Sequence[str] | None = None,
        target: str | None = None,
        entity: str | None = None,
    ) -> FederatedDataset:
        """From a long table with one row per sample and a client column.

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
        """
        import pandas as pd

        if not isinstance(df, pd.DataFrame):
            raise DataValidationError(f"from_pandas expects a DataFrame, got {type(df).__name__}")
        columns = [str(c) for c in df.columns]
        df = df.copy()
        df.columns = columns
        for role, col in (("client", client), ("target", target), ("entity", entity)):
            if col is not None and col not in columns:
                raise DataValidationError(
                    f"{role} column {col!r} is not in the data; available columns: {columns}"
                )
        roles = [(r, c) for r, c in (("client", client), ("target", target),
                                      ("entity", entity)) if c is not None]
        for i, (r1, c1) in enumerate(roles):  # one column, one role
            for r2, c2 in roles[i + 1:]:
                if c1 == c2:
                    raise DataValidationError(
                        f"column {c1!r} cannot be both the {r1} and the {r2} column; give "
                        f"each role its own column")
        if isinstance(features, str):
            raise DataValidationError(
                f"features must be a list of column names, got the string {features!r}; write "
                f"features=[{features!r}]")
        reserved = {client, target, entity} - {None}
        check_unique_names(columns, None if features is None else
                           [*reserved, *(str(f) for f in features)])
        if features is None:
            features = [c for c in columns if c not in reserved]
        else:
            features = [str(f) for f in features]
            for f in features:
                if f not in columns:
                    raise DataValidationError(
                        f"feature column {f!r} is not in the data; available columns: {columns}"
                    )
                if f in reserved:
                    raise DataValidationError(
                        f"column {f!r} cannot be both a feature and the client/target/entity column"
                    )
        if len(features) == 0:
            raise DataValidationError("no feature columns: give features=[...]")
        if df[client].isna().any():
            n = int(df[client].isna().sum())
            raise DataValidationError(
                f"client column {client!r} has {n} missing values; every row needs a client id"
            )
        if len(df) == 0:
            raise DataValidationError("the table has no rows")
        ids = df[client].astype(str)  # clients are keyed by the text of their id
        blank = ids.str.strip().eq("").to_numpy()
        if blank.any():
            raise DataValidationError(
                f"client column {client!r} has {int(blank.sum())} rows with an empty client id; "
                "every row needs a client id")
        check_client_ids(pd.unique(df[client]), where=f"client column {client!r}: ")
        # Text, complex, dates: name the column and the first client holding one.
        where = _client_of_row(df, client)
        dtypes = df.dtypes
        for f in features:
            dt = dtypes[f]
            if isinstance(dt, np.dtype) and dt.kind in "biuf":
                continue  # plain numbers: nothing to convert (wide tables stay fast)
            df[f] = frame_column(df[f], f, where, "column",
                                 "convert it to numbers or leave it out of features")
        if target is not None:
            df[target] = frame_column(df[target], target, where, "target column",
                                      "encode it as numbers")
        clients: dict[str, ClientData] = {}
        uniq, order, bounds = client_row_order(ids.to_numpy())
        Xall = df[features].to_numpy(dtype=np.float64)
        yall = df[target].to_numpy() if target is not None else None
        eall = df[entity].to_numpy() if entity is not None else None
        for j, cid in enumerate(uniq):
            rows = order[bounds[j] : bounds[j + 1]]
            y = yall[rows] if yall is not None else None
            if y is not None:
                y = np.asarray(y)
                if y.dtype == object:
                    y = pd.to_numeric(pd.Series(y)).to_numpy()
                if np.issubdtype(y.dtype, np.floating) and np.isnan(y).any():
                    raise DataValidationError(
                        f"client {cid!r}: target column {target!r} has "
                        f"{int(np.isnan(y).sum())} NaN values; drop those rows before fitting"
                    )
            ent = eall[rows] if eall is not None else None
            if ent is not None and pd.isna(ent).any():
                raise DataValidationError(
                    f"client {cid!r}: entity column {entity!r} has {int(pd.isna(ent).sum())} "
                    "missing values; every event needs an entity id"
                )
            clients[str(cid)] = ClientData(Xall[rows], y, ent)
        if entity is not None:  # 1 and "1" would pool into one entity
            check_entity_ids(pd.unique(df[entity]), where=f"entity column {entity!r}: ")
        return cls(clients, list(features), target_name=target, entity_name=entity)

    @classmethod
    def read_table(
        cls,
        path: str | os.PathLike,
        client: str,
        features: Sequence[str] | None = None,
        target: str | None = None,
        entity: str | None = None,
        **read_kwargs,
    ) -> FederatedDataset:
        """Read a CSV (``.csv``, ``.csv.gz``, ``.tsv``) or Parquet (``.parquet``, ``.pq``) file."""
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
        return cls.from_pandas(df, client=client, features=features, target=target, entity=entity)

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
            check_array_values(X, name_of, where=f"client {cid!r}: ")
            if cd.y is not None:
                check_target_values(cd.y, self.target_name or "y", where=f"client {cid!r}: ")
        if len(self.feature_names) != width:
            raise DataValidationError(
                f"{len(self.feature_names)} feature names for {width} columns"
            )
        check_unique_names(self.feature_names, what="feature name", where="feature_names")
        self._validated = True

    # -- access ---------------------------------------------------------------------------------
    def client_sizes(self) -> dict[str, int]:
        """Rows of each client."""
        return {cid: cd.n_samples for cid, cd in self.clients.items()}

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

    def subset(self, client_ids: Sequence[str]) -> FederatedDataset:
        return FederatedDataset(
            {str(c): self.clients[str(c)] for c in client_ids},
            self.feature_names,
            self.target_name,
            self.entity_name,
        )

    def map(self, fn) -> FederatedDataset:
        """A new dataset with ``fn(client_id, ClientData) -> ClientData`` applied per client."""
        return FederatedDataset(
            {cid: fn(cid, cd) for cid, cd in self.items()},
            self.feature_names,
            self.target_name,
            self.entity_name,
        )

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
        return (
            FederatedDataset(tr, self.feature_names, self.target_name, self.entity_name),
            FederatedDataset(te, self.feature_names, self.target_name, self.entity_name),
        )

    def pooled(self) -> ClientData:
        """All clients' rows stacked in client-id order. For tests and centralized references
        only: a federated fit never calls it."""
        cds = [self.clients[c] for c in self.client_ids]
        X = np.vstack([c.X for c in cds])
        y = np.concatenate([c.y for c in cds]) if self.has_target else None
        ent = None
        if self.has_entity:
            ent = np.concatenate([c.entity for c in cds])
        return ClientData(X, y, ent)

    def to_pandas(self, client: str = "client") -> pd.DataFrame:
        import pandas as pd

        frames = []
        for cid, cd in self.items():
            f = pd.DataFrame(cd.X, columns=self.feature_names)
            if cd.y is not None:
                f[self.target_name or "y"] = cd.y
            if cd.entity is not None:
                f[self.entity_name or "entity"] = cd.entity
            f.insert(0, client, cid)
            frames.append(f)
        return pd.concat(frames, ignore_index=True)

    def __repr__(self) -> str:
        return (
            f"FederatedDataset(n_clients={self.n_clients}, n_samples={self.n_samples}, "
            f"n_features={self.n_features}, target={self.target_name!r}, "
            f"entity={self.entity_name!r})"
        )
