"""A long table (one row per sample, a client column) -> the arguments of a FederatedDataset.

The body of :meth:`FederatedDataset.from_pandas`: column roles, the checks that name the client
and the column, the categorical encoding (:mod:`fedlatent.data.categorical`) and the rows'
positions in the table, so predictions come back with the table's index in its order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .categorical import (
    ENCODINGS,
    HANDLE_UNKNOWN,
    CategoricalEncoding,
    _labels,
    agree_levels,
    categorical_columns,
    client_levels,
    encode_columns,
)
from .validation import (
    DataValidationError,
    check_client_ids,
    check_entity_ids,
    check_unique_names,
    frame_column,
)

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["frame_parts"]

#: what the error on a column of text adds (the command line says --categorical onehot)
CATEGORICAL_HINT = ", or encode its levels as indicator columns with categorical='onehot'"


def _all_text(series: pd.Series) -> bool:
    """A column of labels (no value reads as a number), not numbers with a stray text value.
    A pandas Categorical column keeps the plain message (pinned by the reliability tests)."""
    import pandas as pd

    if isinstance(series.dtype, pd.CategoricalDtype):
        return False
    return bool(pd.to_numeric(series, errors="coerce").notna().sum() == 0)


def _client_of_row(df: pd.DataFrame, client: str):
    """``where(i)``: the message prefix naming the client of row ``i`` of ``df``."""
    return lambda i: f"client {str(df[client].iloc[i])!r}: "


def _check_roles(df, columns, client, features, target, entity) -> list[str]:
    """The feature columns, after checking that every role names one column of the table."""
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
        return [c for c in columns if c not in reserved]
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
    return features


def _encoding(df, features, categorical, ids_codes, uniq,
              columns=None) -> CategoricalEncoding | None:
    """The encoding asked for: agreed from the clients' reported levels, or the one given."""
    if categorical is None:
        if columns is not None:
            raise DataValidationError("categorical_columns is given without categorical=; "
                                      "add categorical='onehot'")
        return None
    if isinstance(categorical, CategoricalEncoding):
        unknown = [c for c in categorical.levels if c not in features]
        if unknown:
            raise DataValidationError(
                f"the categorical encoding names column {unknown[0]!r}, which is not a feature "
                f"here (features: {features})")
        return categorical
    if categorical not in ENCODINGS:
        raise DataValidationError(
            f"categorical must be one of {list(ENCODINGS)} or a CategoricalEncoding (e.g. "
            f"fd_train.encoding), got {categorical!r}")
    if columns is None:
        cols = categorical_columns(df, features)
    else:
        if isinstance(columns, str):
            columns = [columns]
        cols = [str(c) for c in columns]
        bad = [c for c in cols if c not in features]
        if bad:
            raise DataValidationError(
                f"categorical column {bad[0]!r} is not a feature; features: {features}")
    labels = {c: _labels(df[c]) for c in cols}
    reports = client_levels(labels, ids_codes, uniq)  # what each client says of its columns
    return CategoricalEncoding(agree_levels(reports, cols), drop_first=categorical == "onehot",
                               features=tuple(features))


def frame_parts(df: pd.DataFrame, client: str, features: Sequence[str] | None,
                target: str | None, entity: str | None, categorical: Any = None,
                handle_unknown: str = "error", categorical_columns: Any = None
                ) -> dict[str, Any]:
    """The keyword arguments of the :class:`FederatedDataset` of a long table.

    Returns a dict with ``clients`` (id -> ClientData, each with its rows' positions in the
    table), ``feature_names``, ``target_name``, ``entity_name``, ``source_index`` (the table's
    index) and ``encoding`` (None without ``categorical``).
    """
    import pandas as pd

    from .client import ClientData, client_row_order

    if not isinstance(df, pd.DataFrame):
        raise DataValidationError(f"from_pandas expects a DataFrame, got {type(df).__name__}")
    if handle_unknown not in HANDLE_UNKNOWN:
        raise DataValidationError(f"handle_unknown must be one of {list(HANDLE_UNKNOWN)}, got "
                                  f"{handle_unknown!r}")
    source_index = df.index
    columns = [str(c) for c in df.columns]
    df = df.copy()
    df.columns = columns
    df.index = pd.RangeIndex(len(df))
    if features is None and isinstance(categorical, CategoricalEncoding) and categorical.features:
        features = list(categorical.features)  # encode new data as the training data were
    features = _check_roles(df, columns, client, features, target, entity)
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
    where = _client_of_row(df, client)
    uniq, order, bounds = client_row_order(ids.to_numpy())
    row_client = np.empty(len(df), dtype=np.intp)
    row_client[order] = np.repeat(np.arange(len(uniq)), np.diff(bounds))
    encoding = _encoding(df, features, categorical, row_client, uniq, categorical_columns)
    encoded = set() if encoding is None else set(encoding.levels)
    # Text, complex, dates: name the column and the first client holding one.
    dtypes = df.dtypes
    for f in features:
        dt = dtypes[f]
        if f in encoded or (isinstance(dt, np.dtype) and dt.kind in "biuf"):
            continue  # plain numbers: nothing to convert (wide tables stay fast)
        try:
            df[f] = frame_column(df[f], f, where, "column",
                                 "convert it to numbers or leave it out of features")
        except DataValidationError as err:
            if "is not numeric" not in str(err) or not _all_text(df[f]):
                raise
            raise DataValidationError(f"{err}{CATEGORICAL_HINT}") from None
    if target is not None:
        df[target] = frame_column(df[target], target, where, "target column",
                                  "encode it as numbers")
    if encoding is None:
        names = list(features)
        Xall = df[features].to_numpy(dtype=np.float64)
    else:
        Xall, names = encode_columns(df, features, encoding, where, handle_unknown)
    yall = df[target].to_numpy() if target is not None else None
    eall = df[entity].to_numpy() if entity is not None else None
    clients: dict[str, ClientData] = {}
    for j, cid in enumerate(uniq):  # one step per client, not per row
        rows = order[bounds[j] : bounds[j + 1]]
        y = yall[rows] if yall is not None else None
        if y is not None:
            y = np.asarray(y)
            if y.dtype == object:
                y = pd.to_numeric(pd.Series(y)).to_numpy()
            # NaN (a missing target) is kept: the fit refuses it for the models that cannot
            # leave those rows out (FederatedDataset.refuse_missing_target)
        ent = eall[rows] if eall is not None else None
        if ent is not None and pd.isna(ent).any():
            raise DataValidationError(
                f"client {cid!r}: entity column {entity!r} has {int(pd.isna(ent).sum())} "
                "missing values; every event needs an entity id"
            )
        clients[str(cid)] = ClientData(Xall[rows], y, ent, rows=rows.astype(np.int64))
    if entity is not None:  # 1 and "1" would pool into one entity
        check_entity_ids(pd.unique(df[entity]), where=f"entity column {entity!r}: ")
    return {"clients": clients, "feature_names": names, "target_name": target,
            "entity_name": entity, "source_index": source_index, "encoding": encoding}
