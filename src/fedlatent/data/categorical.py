"""One-hot encoding of categorical feature columns, with the levels agreed across clients.

``FederatedDataset.from_pandas(df, ..., categorical="onehot")`` turns every text, categorical
or boolean feature column ``c`` into indicator columns named ``c=level``. What the clients must
agree on is the set of levels of each column, and that is settled from what each client
*reports about its column* (its distinct labels: :func:`client_levels`), never from its rows:
the agreed set is the sorted union of the reports (:func:`agree_levels`). The labels do cross;
a label that only one client holds tells the others that this client has at least one row with
it, a disclosure risk for rare labels (merge rare levels into an "other" level before fitting
when that matters).

``"onehot"`` drops the first level of each column (in sorted order: the reference level, as R's
treatment contrasts and ``pandas.get_dummies(drop_first=True)`` do): the full set of indicators
sums to one on every row, so with an intercept (the latent class regression, HLCR) the design
would be rank deficient, and in a Gaussian mixture every covariance would be singular.
``"onehot-all"`` keeps every level (for a model without an intercept that wants one coefficient
per level). The encoding a dataset was built with is ``fd.encoding``; pass it as
``categorical=fd_train.encoding`` to encode new data with the training levels. A level unseen
at training is an error (``handle_unknown="error"``, the default) or all-zero indicators
(``handle_unknown="ignore"``: under ``"onehot"`` the coding of the reference level, under
``"onehot-all"`` no level at all).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .validation import DataValidationError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["ENCODINGS", "CategoricalEncoding", "agree_levels", "categorical_columns",
           "client_levels", "encode_columns", "level_counts"]

#: the values ``categorical=`` takes as text
ENCODINGS = ("onehot", "onehot-all")
HANDLE_UNKNOWN = ("error", "ignore")


@dataclass(frozen=True)
class CategoricalEncoding:
    """The agreed levels of each categorical feature column and how they are coded.

    Attributes
    ----------
    levels : dict of str to tuple of str
        Source column -> its levels (sorted text labels).
    drop_first : bool
        Whether the first level of each column has no indicator (the reference level).
    features : tuple of str
        The source feature columns, in order (categorical or not): what a table must hold to
        be encoded the same way (e.g. by ``fedlatent predict``).
    """

    levels: dict[str, tuple[str, ...]] = field(default_factory=dict)
    drop_first: bool = True
    features: tuple[str, ...] = ()

    def columns_of(self, column: str) -> list[str]:
        """The indicator column names of one source column: ``column=level``."""
        kept = self.levels[column][1:] if self.drop_first else self.levels[column]
        return [f"{column}={lev}" for lev in kept]

    def feature_names(self, source: Sequence[str]) -> list[str]:
        """The encoded feature names of the source feature columns, in their order."""
        out: list[str] = []
        for f in source:
            out.extend(self.columns_of(f) if f in self.levels else [f])
        return out

    def to_json(self) -> dict[str, Any]:
        return {"levels": {c: list(v) for c, v in self.levels.items()},
                "drop_first": bool(self.drop_first), "features": list(self.features)}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CategoricalEncoding:
        """The encoding :meth:`to_json` wrote; refuses anything else (ValueError)."""
        try:
            levels = {str(c): tuple(str(v) for v in lv) for c, lv in doc["levels"].items()}
            drop = doc["drop_first"]
            features = tuple(str(f) for f in doc.get("features", ()))
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a categorical encoding ({err!r}); expected "
                             "{'levels': {column: [levels]}, 'drop_first': bool}") from err
        if not isinstance(drop, bool) or any(len(set(v)) != len(v) or not v
                                             for v in levels.values()):
            raise ValueError("not a categorical encoding: drop_first must be true/false and "
                             "each column's levels distinct and not empty")
        if any(c not in features for c in levels) and features:
            raise ValueError("not a categorical encoding: an encoded column is not a feature")
        return cls(levels, drop, features)


def _is_categorical(series: pd.Series) -> bool:
    import pandas as pd

    t = pd.api.types
    dt = series.dtype
    return (isinstance(dt, pd.CategoricalDtype) or t.is_bool_dtype(dt)
            or t.is_string_dtype(dt) or t.is_object_dtype(dt))


def categorical_columns(df: pd.DataFrame, features: Sequence[str]) -> list[str]:
    """The feature columns ``"onehot"`` encodes: text, categorical and boolean columns. A
    numeric column stays numeric, and so does a text column most of whose values read as
    numbers (a stray "oops" there is an error naming it, not a level)."""
    import pandas as pd

    out = []
    for f in features:
        s = df[f]
        if not _is_categorical(s):
            continue
        if not isinstance(s.dtype, pd.CategoricalDtype) and not pd.api.types.is_bool_dtype(
                s.dtype) and 2 * pd.to_numeric(s, errors="coerce").notna().sum() > s.notna().sum():
            continue  # mostly numbers held as text ("1.5", a stray "oops"): numeric
        out.append(f)
    return out


def _labels(series: pd.Series) -> pd.Series:
    """The text label of every row (booleans ``"True"``/``"False"``; missing stays missing)."""
    return series.astype(str).astype(object).where(series.notna().to_numpy(), None)


def client_levels(labels: Mapping[str, pd.Series],
                  codes: np.ndarray, ids: np.ndarray) -> dict[str, dict[str, list[str]]]:
    """What each client reports: for each categorical column, its distinct labels, sorted.

    Parameters
    ----------
    labels : dict of str to Series
        Column -> the text label of every row of the table.
    codes : ndarray of shape (n_rows,)
        Client number of every row (an index into ``ids``).
    ids : ndarray of shape (n_clients,)
        The client ids.

    Returns
    -------
    dict client id -> {column: sorted distinct labels}. Only these sets cross, not rows.
    """
    import pandas as pd

    out: dict[str, dict[str, list[str]]] = {str(c): {} for c in ids}
    for col, lab in labels.items():
        pairs = pd.DataFrame({"c": codes, "v": lab.to_numpy()}).dropna().drop_duplicates()
        for j, vals in pairs.groupby("c")["v"]:
            out[str(ids[int(j)])][col] = sorted(vals.tolist())
    return out


def agree_levels(reports: Mapping[str, Mapping[str, Sequence[str]]],
                 columns: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The agreed levels of each column: the sorted union of the clients' reported labels."""
    return {col: tuple(sorted({v for rep in reports.values() for v in rep.get(col, ())}))
            for col in columns}


def encode_columns(df: pd.DataFrame, features: Sequence[str], encoding: CategoricalEncoding,
                   where: Callable[[int], str], handle_unknown: str = "error"
                   ) -> tuple[np.ndarray, list[str]]:
    """The feature matrix with every encoded column replaced by its indicators.

    Returns ``(X, names)``: ``X`` of shape (n_rows, n_encoded_features), float64, indicator
    columns in place of each categorical column (in the order of ``features``). A missing label
    is refused; an unknown label too unless ``handle_unknown="ignore"`` (all-zero indicators).
    """
    blocks: list[np.ndarray] = []
    names: list[str] = []
    for f in features:
        if f not in encoding.levels:
            blocks.append(df[f].to_numpy(dtype=np.float64, na_value=np.nan)[:, None])
            names.append(f)
            continue
        lab = _labels(df[f])
        missing = lab.isna().to_numpy()
        if missing.any():
            i = int(np.flatnonzero(missing)[0])
            raise DataValidationError(
                f"{where(i)}column {f!r} has {int(missing.sum())} missing values; give them a "
                "level of their own (e.g. df[col].fillna('missing')) or drop those rows")
        levels = encoding.levels[f]
        code = np.searchsorted(np.asarray(levels, dtype=object), lab.to_numpy(dtype=object))
        code = np.minimum(code, len(levels) - 1)
        known = np.asarray(levels, dtype=object)[code] == lab.to_numpy(dtype=object)
        if not known.all() and handle_unknown != "ignore":
            i = int(np.flatnonzero(~known)[0])
            raise DataValidationError(
                f"{where(i)}column {f!r} has level {lab.iloc[i]!r}, unseen when the encoding "
                f"was agreed (levels: {list(levels)}); pass handle_unknown='ignore' to code it "
                "as all zeros, or agree the encoding on data that hold it")
        onehot = (code[:, None] == np.arange(len(levels))[None, :]) & known[:, None]
        if encoding.drop_first:
            onehot = onehot[:, 1:]
        blocks.append(onehot.astype(np.float64))
        names.extend(encoding.columns_of(f))
    X = np.hstack(blocks) if blocks else np.empty((len(df), 0))
    return X, names


def level_counts(encoding: CategoricalEncoding | None, feature_names: Sequence[str],
                 X: np.ndarray, weight: np.ndarray | None = None
                 ) -> list[tuple[str, list[str], np.ndarray]]:
    """How many of one client's records hold each level of each encoded column.

    Parameters
    ----------
    encoding : CategoricalEncoding or None
        The dataset's encoding (None: no encoded column, an empty list).
    feature_names : sequence of str
        The encoded feature names (the columns of ``X``).
    X : ndarray of shape (n_samples, n_features)
        The client's encoded rows.
    weight : ndarray of shape (n_samples,) or None
        Frequency weights: a row of weight 0 is no record.

    Returns
    -------
    list of ``(column, level names, records holding each level)``; under ``drop_first`` the
    reference level's records are the rows with no indicator set.
    """
    if encoding is None or not encoding.levels:
        return []
    where = {name: j for j, name in enumerate(feature_names)}
    rec = np.ones(X.shape[0], dtype=bool) if weight is None else np.asarray(weight) > 0
    out = []
    for col, levels in encoding.levels.items():
        cols = [where.get(c) for c in encoding.columns_of(col)]
        if not cols or any(j is None for j in cols):
            continue
        ind = np.asarray(X[rec][:, cols], dtype=np.float64) != 0
        counts = ind.sum(axis=0).astype(np.float64)
        names = list(levels[1:] if encoding.drop_first else levels)
        if encoding.drop_first:
            counts = np.concatenate([[float((~ind.any(axis=1)).sum())], counts])
            names = [levels[0], *names]
        out.append((col, names, counts))
    return out
