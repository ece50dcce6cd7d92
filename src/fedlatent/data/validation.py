"""Checks of input values, shared by the data layer (fit) and ``check_features`` (predict).

Every check raises :class:`DataValidationError` (a ``ValueError``) whose message names the client
(when the data belong to one), the column and the fix. What is refused, and why:

- values whose magnitude exceeds :data:`MAX_ABS_VALUE` (1e150): every model sums squares and
  cross products of its values over rows (GMM's ``sum q x x^T``, the regressions' ``X^T X``,
  ``y^2``). At ``|x| <= 1e150`` one square is at most 1e300, so a sum over up to about 1.8e8
  rows stays below float64's maximum (1.8e308); a larger value overflows to ``inf`` inside the
  E-step or the server step, far from the column that caused it;
- complex values (casting to float would silently drop the imaginary part);
- dates, times, durations and periods (casting would silently give nanoseconds since 1970);
- text and other values that are not numbers; NaN and infinite values;
- duplicated column names (a table lookup would return several columns).

Booleans are numbers (0/1).
"""

from __future__ import annotations

import datetime as _dt
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # pandas is imported where a table is read (it is slow to import)
    import pandas as pd

__all__ = [
    "MAX_ABS_VALUE",
    "DataValidationError",
    "check_array_values",
    "check_client_ids",
    "check_entity_ids",
    "check_finite",
    "check_magnitude",
    "check_target_values",
    "check_unique_names",
    "frame_column",
    "name_list",
    "to_float_array",
    "to_float_target",
]

#: The largest magnitude a value may have (see the module docstring): 1e150 squared is 1e300,
#: which leaves room for sums over ~1.8e8 rows below float64's maximum, 1.8e308.
MAX_ABS_VALUE = 1e150

#: how many names an error message or a log line lists before "and N more"
NAMES_SHOWN = 10


def name_list(names: Sequence[object], limit: int = NAMES_SHOWN) -> str:
    """``"'a', 'b', ... and 333 more"``: at most ``limit`` names (repr), then the count of the
    others, so a message naming thousands of clients or columns stays one line.

    Parameters
    ----------
    names : sequence
        The names, in the order to show them.
    limit : int
        How many to show.

    Returns
    -------
    str
        ``"(none)"`` for no names.
    """
    names = list(names)
    if not names:
        return "(none)"
    shown = ", ".join(repr(str(v)) for v in names[:limit])
    rest = len(names) - limit
    return f"{shown} and {rest} more" if rest > 0 else shown


_DATE_FIX = "convert it to a number, e.g. (df[col] - df[col].min()).dt.total_seconds()"
_DURATION_FIX = "convert it to a number, e.g. df[col].dt.total_seconds()"
_COMPLEX_FIX = "fedlatent fits real numbers: take .real, .imag or abs() explicitly"
_DATE_TEXT_FIX = ("parse it and convert it to a number, e.g. t = pd.to_datetime(df[col]); "
                  "(t - t.min()).dt.total_seconds()")
_DATE_TEXT = re.compile(
    r"\d{4}-\d{1,2}-\d{1,2}([ T].*)?|\d{1,2}/\d{1,2}/\d{2,4}( .*)?|\d{1,2}:\d{2}(:\d{2}(\.\d*)?)?"
)


class DataValidationError(ValueError):
    """Bad federated input, found before any round runs. The message names client and column."""


# ---- messages ------------------------------------------------------------------------------
def _complex(where: str, what: str, name: str) -> DataValidationError:
    return DataValidationError(f"{where}{what} {name!r} is complex; {_COMPLEX_FIX}")


def _temporal(where: str, what: str, name: str, shown: str, duration: bool,
              fix: str | None = None) -> DataValidationError:
    """``shown``: ``"dtype datetime64[ns]"`` or ``"value Timestamp(...)"``."""
    noun = "durations" if duration else "dates/times"
    fix = fix or (_DURATION_FIX if duration else _DATE_FIX)
    return DataValidationError(f"{where}{what} {name!r} holds {noun} ({shown}), not numbers; {fix}")


def _temporal_dtype(where: str, what: str, name: str, dtype: object) -> DataValidationError:
    text = str(dtype)
    duration = getattr(dtype, "kind", None) == "m" or text.startswith(("timedelta", "duration"))
    return _temporal(where, what, name, f"dtype {text}", duration)


def _not_numeric(where: str, what: str, name: str, value: object, fix: str) -> DataValidationError:
    if isinstance(value, np.generic):  # np.str_('x') -> 'x'
        value = value.item()
    return DataValidationError(f"{where}{what} {name!r} is not numeric (value {value!r}); {fix}")


def _temporal_value(where: str, what: str, name: str, value: object) -> None:
    """Raise for a date/time-like Python value (``datetime``, ``Timestamp``, ``Period``...)."""
    if isinstance(value, _dt.timedelta | np.timedelta64):
        raise _temporal(where, what, name, f"value {value!r}", True)
    if isinstance(value, _dt.date | _dt.time | np.datetime64) or type(value).__name__ == "Period":
        raise _temporal(where, what, name, f"value {value!r}", False)


# ---- a column of a table ---------------------------------------------------------------------
def frame_column(values: pd.Series, name: str, where: Callable[[int], str], what: str = "column",
                 fix: str = "convert it to numbers") -> pd.Series:
    """The column as numbers (its dtype kept when it is already numeric), or an error.

    Parameters
    ----------
    values : Series
    name : str
        The column's name, for the message.
    where : callable
        ``where(i)`` is the message's prefix for row ``i`` (``"client 's1': "`` or ``""``).
    what, fix : str
        How the message calls the column, and what it tells the user to do with text.
    """
    import pandas as pd

    types = pd.api.types
    dtype = values.dtype
    notna = values.notna().to_numpy()
    first = int(np.flatnonzero(notna)[0]) if notna.any() else 0
    kind = getattr(dtype, "kind", None)  # also pyarrow-backed dtypes: duration[ns] is "m"
    if types.is_complex_dtype(dtype) or kind == "c":
        raise _complex(where(first), what, name)
    if (types.is_datetime64_any_dtype(dtype) or types.is_timedelta64_dtype(dtype)
            or isinstance(dtype, pd.PeriodDtype) or kind in ("m", "M")):
        raise _temporal_dtype(where(first), what, name, dtype)
    if isinstance(dtype, pd.IntervalDtype):
        raise _not_numeric(where(first), what, name, values.iloc[first], fix)
    if types.is_bool_dtype(dtype) or types.is_numeric_dtype(dtype):
        return values
    try:
        conv = pd.to_numeric(values, errors="coerce")
    except (OverflowError, TypeError, ValueError):  # e.g. a Python int beyond float64
        conv = None
    if conv is None or types.is_complex_dtype(conv.dtype) or not types.is_numeric_dtype(conv):
        for i, v in enumerate(values.to_numpy()):  # rare: name the first offending row
            _check_python_value(v, name, where(i), what, fix)
        raise _not_numeric(where(first), what, name, values.iloc[first], fix)
    # NaN where there was a value (pyarrow-backed results hold NaN apart from missing values)
    bad = np.isnan(conv.to_numpy(dtype=np.float64, na_value=np.nan)) & values.notna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        _check_python_value(values.iloc[i], name, where(i), what, fix)
        raise _not_numeric(where(i), what, name, values.iloc[i], fix)
    return conv


def _check_python_value(v: object, name: str, where: str, what: str, fix: str) -> None:
    if v is None or isinstance(v, bool | int | float | np.integer | np.floating | np.bool_):
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_ABS_VALUE:
            raise _too_large(where, what, name, 1, f"about 1e{len(str(abs(v))) - 1}")
        return
    if isinstance(v, complex | np.complexfloating):
        raise _complex(where, what, name)
    _temporal_value(where, what, name, v)
    try:
        float(v)  # e.g. "1.5"
    except (TypeError, ValueError, OverflowError):
        pass
    else:
        return
    if isinstance(v, str):  # text read from a CSV file: "(1+2j)", "2020-01-31", "12:30"
        text = v.strip()
        if _DATE_TEXT.fullmatch(text):
            raise _temporal(where, what, name, f"value {v!r}", False, _DATE_TEXT_FIX)
        try:
            complex(text.replace(" ", ""))
        except ValueError:
            pass
        else:
            raise _complex(where, what, name)
    raise _not_numeric(where, what, name, v, fix)


# ---- arrays ----------------------------------------------------------------------------------
def _refuse_complex_or_temporal(X: np.ndarray, names: Sequence[str] | Callable[[int], str],
                                where: str) -> None:
    """Raise for a complex (naming its first column with a non-zero imaginary part) or a
    date/time array: casting either to float would silently change the values."""
    kind = X.dtype.kind
    if kind not in "cmM":
        return
    j = 0
    if kind == "c":
        nonreal = np.flatnonzero((X.imag != 0).any(axis=0))
        j = int(nonreal[0]) if len(nonreal) else 0
    name = names(j) if callable(names) else (names[j] if j < len(names) else f"x{j}")
    if kind == "c":
        raise _complex(where, "column", name)
    raise _temporal_dtype(where, "column", name, X.dtype)


def to_float_array(X, names: Callable[[int], str], where: str = "",
                   fix: str = "convert it to numbers") -> np.ndarray:
    """A 2-D array-like as float64, refusing complex, date/time and text values.

    ``names(j)`` is the name of column ``j``; ``where`` prefixes the message (``"client 'a': "``).
    """
    X = np.asarray(X)
    kind = X.dtype.kind
    if kind in "biuf":
        return X.astype(np.float64)
    if X.ndim != 2:
        raise DataValidationError(f"{where}expected a 2-D array (n_samples, n_features), got "
                                  f"shape {X.shape}")
    _refuse_complex_or_temporal(X, names, where)
    try:
        return X.astype(np.float64)  # numbers held as objects or text ("1.5")
    except (TypeError, ValueError, OverflowError):
        pass
    for j in range(X.shape[1]):  # name the first column holding something else
        for v in X[:, j]:
            _check_python_value(v, names(j), where, "column", fix)
    raise DataValidationError(f"{where}X is not numeric (dtype {X.dtype}); {fix}")


def check_finite(X: np.ndarray, names: Sequence[str] | Callable[[int], str], where: str = "",
                 fix_nan: str = "drop or impute them before fitting",
                 fix_inf: str = "drop or clip them before fitting",
                 allow_nan: bool = False) -> None:
    """Refuse NaN (unless ``allow_nan``: missing values) and infinite values of a 2-D float
    array, naming the first bad column."""
    bad = np.isinf(X) if allow_nan else ~np.isfinite(X)
    if not bad.any():
        return
    col = int(np.flatnonzero(bad.any(axis=0))[0])
    name = names(col) if callable(names) else names[col]
    column = X[:, col]
    n_nan = 0 if allow_nan else int(np.isnan(column).sum())
    if n_nan:
        raise DataValidationError(f"{where}column {name!r} has {n_nan} NaN values; {fix_nan}")
    n_inf = int(np.isinf(column).sum())
    raise DataValidationError(f"{where}column {name!r} has {n_inf} infinite values; {fix_inf}")


def _too_large(where: str, what: str, name: str, n: int, largest: str) -> DataValidationError:
    return DataValidationError(
        f"{where}{what} {name!r} has {n} values of magnitude above {MAX_ABS_VALUE:g} (largest "
        f"{largest}); the models sum squares of values, which overflow float64 beyond that: "
        "rescale the column (divide it by a power of ten) or transform it (e.g. log)"
    )


def check_magnitude(X: np.ndarray, names: Sequence[str] | Callable[[int], str],
                    where: str = "", what: str = "column") -> None:
    """Refuse finite values with ``|x| > MAX_ABS_VALUE`` (2-D X), naming the first column."""
    if X.size == 0 or X.dtype.kind in "biu":  # integers of 64 bits stay below 1e20
        return
    big = np.abs(X) > MAX_ABS_VALUE
    if not big.any():
        return
    col = int(np.flatnonzero(big.any(axis=0))[0])
    name = names(col) if callable(names) else names[col]
    largest = float(np.abs(X[:, col]).max())
    raise _too_large(where, what, name, int(big[:, col].sum()), f"{largest:.3g}")


def check_array_values(X: np.ndarray, names: Sequence[str] | Callable[[int], str],
                       where: str = "", allow_nan: bool = False) -> None:
    """The data layer's checks of a client's X: real numbers, finite (NaN, missing values,
    allowed with ``allow_nan``: the fit refuses them for models that cannot take them), not
    too large."""
    _refuse_complex_or_temporal(X, names, where)
    if X.dtype.kind not in "biuf":
        raise DataValidationError(
            f"{where}X is not numeric (dtype {X.dtype}); convert it to numbers"
        )
    check_finite(X, names, where, allow_nan=allow_nan)
    check_magnitude(X, names, where)


def check_target_values(y, name: str, where: str = "", allow_nan: bool = False) -> None:
    """A target: refused when complex or date/time; when numeric, finite and not too large.

    Other targets (text labels of a classifier) are left to the model. The checks are those of
    :func:`to_float_target`, written once there.
    """
    if np.asarray(y).dtype.kind in "cmMf":
        to_float_target(y, name, where, fix="drop those rows before fitting",
                        allow_nan=allow_nan)


def to_float_target(y, name: str = "y", where: str = "", n: int | None = None,
                    fix: str = "drop those rows before predicting",
                    allow_nan: bool = False) -> np.ndarray:
    """A numeric target as a 1-D float64 array, or an error naming ``name``.

    Refuses what :func:`check_target_values` refuses (complex, date/time, NaN, infinite,
    ``|y| > MAX_ABS_VALUE``) and also text or other values that are not numbers; ``n`` is the
    number of rows the target must have.
    """
    if y is None:
        raise DataValidationError(f"{where}{name} is required (a number per row), got None")
    y = np.asarray(y)
    if y.dtype.kind == "c":
        raise _complex(where, "target", name)
    if y.dtype.kind in "mM":
        raise _temporal_dtype(where, "target", name, y.dtype)
    if y.dtype.kind not in "biuf":  # text, objects: name the first value that is no number
        try:
            y = y.astype(np.float64)
        except (TypeError, ValueError, OverflowError):
            fix = "encode it as numbers"
            for v in y.ravel():
                _check_python_value(v, name, where, "target", fix)
            raise _not_numeric(where, "target", name, y.ravel()[0], fix) from None
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    bad = np.isinf(y) if allow_nan else ~np.isfinite(y)  # allow_nan: missing targets
    if bad.any():
        raise DataValidationError(
            f"{where}target {name!r} has {int(bad.sum())} NaN or infinite values; {fix}")
    check_magnitude(y.reshape(-1, 1), [name], where, what="target")
    if n is not None and y.shape[0] != n:
        raise DataValidationError(f"{where}{name} has {y.shape[0]} values for {n} rows of X")
    return y


def _id_shown(v: object) -> object:
    return v.item() if isinstance(v, np.generic) else v


def check_client_ids(ids, where: str = "") -> None:
    """Refuse client ids that are missing (None, NaN), empty, or that two distinct ids become
    the same once written as text (``1`` and ``"1"``): fedlatent keeps ids as strings, so such
    clients would silently merge."""
    seen: dict[str, object] = {}
    for v in ids:
        v = _id_shown(v)
        if v is None or (isinstance(v, float) and v != v):
            raise DataValidationError(f"{where}a client id is missing ({v!r}); give every client "
                                      "an id")
        if not str(v).strip():
            raise DataValidationError(f"{where}client id {v!r} is empty; give every client a "
                                      "non-empty id")
        _check_same_text(v, seen, "client ids", where)


def check_entity_ids(ids, where: str = "") -> None:
    """Refuse two distinct entity ids that are the same once written as text (``1``, ``"1"``):
    HLCR keys entities by text, so their events would silently pool into one entity."""
    seen: dict[str, object] = {}
    for v in ids:
        _check_same_text(_id_shown(v), seen, "entity ids", where)


def _check_same_text(v: object, seen: dict[str, object], what: str, where: str) -> None:
    text = str(v)
    if text not in seen:
        seen[text] = v
        return
    other = seen[text]
    if type(other) is not type(v) or other != v:
        raise DataValidationError(f"{where}{what} {other!r} and {v!r} are the same once written "
                                  "as text; rename one")


def check_unique_names(columns: Sequence[str], used: Sequence[str] | None = None,
                       what: str = "column", where: str = "the data") -> None:
    """Refuse a name that appears more than once (among ``used``, or anywhere when None)."""
    counts = Counter(str(c) for c in columns)
    for c in (columns if used is None else used):
        if counts.get(str(c), 0) > 1:
            raise DataValidationError(
                f"{what} {str(c)!r} appears {counts[str(c)]} times in {where}; rename the "
                "copies so that every column name is unique"
            )
