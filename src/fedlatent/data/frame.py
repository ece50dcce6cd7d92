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


def _check_roles(df, columns, client, features, target, entity, weight=None) -> list[str]:
    """The feature columns, after checking that every role names one column of the table."""
    named = (("client", client), ("target", target), ("entity", entity), ("weight", weight))
    for role, col in named:
        if col is not None and col not in columns:
            raise DataValidationError(
                f"{role} column {col!r} is not in the data; available columns: {columns}"
            )
    roles = [(r, c) for r, c in named if c is not None]
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
    reserved = {client, target, entity, weight} - {None}
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
                f"column {f!r} cannot be both a feature and the client/target/entity/weight "
                "column"
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


def _client_keys(df: pd.DataFrame, client: str) -> pd.Series:
    """The text of each row's client id, after checking that every row has one."""
    import pandas as pd

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
    return ids


def _numeric_features(df: pd.DataFrame, features: list[str], encoded: set, where) -> None:
    """Convert the feature columns that are not plain numbers in place, refusing text,
    complex values and dates with the column and the first client holding one."""
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


def _client_data(cid: str, rows: np.ndarray, Xall: np.ndarray, cols: dict[str, Any],
                 names: dict[str, str | None]):
    """One client's :class:`ClientData` from the table's arrays (``cols``: ``y``, ``entity``,
    ``weight``, each None or one value per row; ``names``: their columns)."""
    import pandas as pd

    from .client import ClientData
    from .weights import weight_array

    y, ent, w = (None if cols[k] is None else cols[k][rows] for k in ("y", "entity", "weight"))
    if y is not None:
        y = np.asarray(y)
        if y.dtype == object:
            y = pd.to_numeric(pd.Series(y)).to_numpy()
        # NaN (a missing target) is kept: the fit refuses it for the models that cannot
        # leave those rows out (FederatedDataset.refuse_missing_target)
    if ent is not None and pd.isna(ent).any():
        raise DataValidationError(
            f"client {cid!r}: entity column {names['entity']!r} has "
            f"{int(pd.isna(ent).sum())} missing values; every event needs an entity id"
        )
    if w is not None:
        w = weight_array(w, names["weight"], cid, len(rows))
    return ClientData(Xall[rows], y, ent, rows=rows.astype(np.int64), weight=w)


def frame_parts(df: pd.DataFrame, client: str, features: Sequence[str] | None,
                target: str | None, entity: str | None, categorical: Any = None,
                handle_unknown: str = "error", categorical_columns: Any = None,
                weight: str | None = None, formula: Any = None) -> dict[str, Any]:
    """The keyword arguments of the :class:`FederatedDataset` of a long table.

    Returns a dict with ``clients`` (id -> ClientData, each with its rows' positions in the
    table and, with ``weight``, their frequency weights), ``feature_names``, ``target_name``,
    ``entity_name``, ``weight_name``, ``source_index`` (the table's index) and ``encoding``
    (None without ``categorical``), and ``formula`` (the FormulaDesign, None without one).
    """
    import pandas as pd

    from .client import client_row_order

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
    if formula is not None:
        return _formula_parts(df, columns, client, features, target, entity, categorical,
                              weight, formula, source_index)
    if features is None and isinstance(categorical, CategoricalEncoding) and categorical.features:
        features = list(categorical.features)  # encode new data as the training data were
    features = _check_roles(df, columns, client, features, target, entity, weight)
    if len(features) == 0:
        raise DataValidationError("no feature columns: give features=[...]")
    ids = _client_keys(df, client)
    where = _client_of_row(df, client)
    uniq, order, bounds = client_row_order(ids.to_numpy())
    row_client = np.empty(len(df), dtype=np.intp)
    row_client[order] = np.repeat(np.arange(len(uniq)), np.diff(bounds))
    encoding = _encoding(df, features, categorical, row_client, uniq, categorical_columns)
    _numeric_features(df, features, set() if encoding is None else set(encoding.levels), where)
    if target is not None:
        df[target] = frame_column(df[target], target, where, "target column",
                                  "encode it as numbers")
    if encoding is None:
        names = list(features)
        Xall = df[features].to_numpy(dtype=np.float64)
    else:
        Xall, names = encode_columns(df, features, encoding, where, handle_unknown)
    return _assemble(df, Xall, names, target, entity, weight, (order, bounds, uniq),
                     {"source_index": source_index, "encoding": encoding})


def _assemble(df, Xall, names, target, entity, weight, rows, extra) -> dict[str, Any]:
    """The dataset's arguments from the table's feature matrix ``Xall`` (``rows``: the
    clients' row order, bounds and ids; ``extra``: more arguments)."""
    import pandas as pd

    order, bounds, uniq = rows
    cols = {"y": target, "entity": entity, "weight": weight}
    values = {k: None if c is None else df[c].to_numpy() for k, c in cols.items()}
    clients = {str(cid): _client_data(str(cid), order[bounds[j]:bounds[j + 1]], Xall, values,
                                      cols)
               for j, cid in enumerate(uniq)}  # one step per client, not per row
    if entity is not None:  # 1 and "1" would pool into one entity
        check_entity_ids(pd.unique(df[entity]), where=f"entity column {entity!r}: ")
    return {"clients": clients, "feature_names": names, "target_name": target,
            "entity_name": entity, "weight_name": weight, **extra}


def _formula_parts(df, columns, client, features, target, entity, categorical, weight, formula,
                   source_index) -> dict[str, Any]:
    """:func:`frame_parts` of a formula: the design's columns (and ``features``, kept as they
    are) as the features, the formula's response as the target."""
    from .client import client_row_order
    from .formula import formula_design

    if categorical is not None:
        raise DataValidationError("give either formula= or categorical=, not both: a formula "
                                  "codes its categorical variables itself (C(x), text columns)")
    spec = getattr(formula, "target", None) if not isinstance(formula, str) else None
    extra = [] if features is None else ([features] if isinstance(features, str)
                                          else [str(f) for f in features])
    _check_roles(df, columns, client, extra or None, target, entity, weight)
    ids = _client_keys(df, client)
    where = _client_of_row(df, client)
    uniq, order, bounds = client_row_order(ids.to_numpy())
    row_client = np.empty(len(df), dtype=np.intp)
    row_client[order] = np.repeat(np.arange(len(uniq)), np.diff(bounds))
    _numeric_features(df, extra, set(), where)
    design, Xall = formula_design(df, formula, row_client, uniq, extra, where)
    response = design.target if spec is None else spec
    if target is not None and response is not None and target != response:
        raise DataValidationError(f"target={target!r} but the formula's response is "
                                  f"{response!r}; leave target out (the formula names it)")
    if target is None and spec is not None and response not in columns:
        response = None  # new data coded with a fit's design: the response may be absent
    target = target or response
    if target is not None:
        if target not in columns:
            raise DataValidationError(f"the formula's response {target!r} is not in the data; "
                                      f"available columns: {columns}")
        df[target] = frame_column(df[target], target, where, "target column",
                                  "encode it as numbers")
    return _assemble(df, Xall, design.feature_names, target, entity, weight,
                     (order, bounds, uniq), {"source_index": source_index, "formula": design})
