"""Fitted models as messages: safe skops files (never pickle) and fast prediction of many models.

A fitted model crosses as the bytes of a skops file in a ``np.uint8`` array and is loaded only if
every type it contains is on an allow-list of scikit-learn, NumPy and SciPy types.
:func:`predict_many` evaluates many received models on one learner's data at once (linear models
by one matrix product, random forests by one vectorized descent of all their trees).
"""

from __future__ import annotations

import hashlib
import threading
import weakref
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "TRUSTED_PREFIXES",
    "UntrustedModelError",
    "dumps_model",
    "loads_model",
    "predict_many",
]


class UntrustedModelError(ValueError):
    """A received skops file contains a type outside the allow-list; it was not loaded."""


#: Module prefixes of the types a received model may contain.
TRUSTED_PREFIXES = ("sklearn.", "numpy.", "scipy.", "builtins.", "collections.")

_CACHE_SIZE = 4096
_cache: OrderedDict[bytes, Any] = OrderedDict()
_cache_lock = threading.Lock()


def dumps_model(est: Any) -> np.ndarray:
    """Serialize an estimator to the bytes of a skops file, as a ``uint8`` array.

    Parameters
    ----------
    est : scikit-learn estimator (fitted or not)

    Returns
    -------
    ndarray of shape (n_bytes,), dtype uint8
    """

    import zipfile

    import skops.io as sio

    # deflate level 1: a forest's file shrinks ~9x for little time (less to copy and to hash)
    data = sio.dumps(est, compression=zipfile.ZIP_DEFLATED, compresslevel=1)
    return np.frombuffer(data, dtype=np.uint8).copy()


def loads_model(arr: np.ndarray | bytes) -> Any:
    """Load an estimator from skops bytes after checking every type against the allow-list.

    Types whose module starts with one of :data:`TRUSTED_PREFIXES` (scikit-learn, NumPy,
    SciPy) are trusted; anything else raises :class:`UntrustedModelError` without loading.
    Loads are cached by content hash (a load is a pure function of the bytes), so a process
    holding many learners deserializes each distinct model once. The returned object is shared:
    use it read-only (predict), clone it before fitting.

    Parameters
    ----------
    arr : ndarray of uint8 or bytes

    Returns
    -------
    estimator
    """
    import skops.io as sio

    data = bytes(np.asarray(arr, dtype=np.uint8).tobytes()) if not isinstance(arr, bytes) else arr
    key = hashlib.sha256(data).digest()
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    try:
        untrusted = sio.get_untrusted_types(data=data)
    except Exception as e:  # not a skops file
        raise UntrustedModelError(f"received model is not a valid skops file ({e})") from e
    bad = [t for t in untrusted if not t.startswith(TRUSTED_PREFIXES)]
    if bad:
        raise UntrustedModelError(
            f"received model contains types outside the allow-list {TRUSTED_PREFIXES}: {bad}; "
            "only scikit-learn, NumPy and SciPy objects are loaded"
        )
    est = sio.loads(data, trusted=untrusted)
    with _cache_lock:
        _cache[key] = est
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return est


def _linear_coefs(est: Any) -> tuple[np.ndarray, float] | None:
    """``(coef, intercept)`` of a fitted scikit-learn linear model (predict = X @ coef + b)."""
    from sklearn.linear_model._base import LinearModel

    if isinstance(est, LinearModel) and hasattr(est, "coef_"):
        coef = np.asarray(est.coef_, dtype=np.float64)
        icpt = np.asarray(getattr(est, "intercept_", 0.0), dtype=np.float64)
        if coef.ndim == 1 and icpt.size == 1:
            return coef, float(icpt)
    return None


_forest_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _forest_arrays(est: Any):
    """Padded node arrays of a fitted scikit-learn random forest / extra-trees regressor.

    Returns ``(left, right, feature, threshold, value)`` each of shape (n_trees, max_nodes), or
    None if ``est`` is not a single-output forest regressor.
    """
    from sklearn.ensemble import ExtraTreesRegressor, RandomForestRegressor

    if type(est) not in (RandomForestRegressor, ExtraTreesRegressor) or not hasattr(
        est, "estimators_"
    ):
        return None
    try:
        return _forest_cache[est]
    except (KeyError, TypeError):
        pass
    trees = [t.tree_ for t in est.estimators_]
    if any(t.value.shape[1] != 1 for t in trees):
        return None
    T, M = len(trees), max(t.node_count for t in trees)
    left = np.full((T, M), -1, dtype=np.intp)
    right = np.full((T, M), -1, dtype=np.intp)
    feat = np.zeros((T, M), dtype=np.intp)
    thr = np.zeros((T, M))
    val = np.zeros((T, M))
    for i, t in enumerate(trees):
        n = t.node_count
        left[i, :n] = t.children_left
        right[i, :n] = t.children_right
        feat[i, :n] = np.maximum(t.feature, 0)
        thr[i, :n] = t.threshold
        val[i, :n] = t.value[:, 0, 0]
    arrs = (left, right, feat, thr, val)
    try:
        _forest_cache[est] = arrs
    except TypeError:
        pass
    return arrs


def _forests_predict(forests: Sequence[tuple], X: np.ndarray) -> np.ndarray:
    """Mean over trees for several forests at once (equals ``RandomForestRegressor.predict``).

    All trees of all forests descend together, one level per step; like scikit-learn, X is
    compared in float32 (``X[i, f] <= threshold``).
    """
    sizes = [f[0].shape[0] for f in forests]
    M = max(f[0].shape[1] for f in forests)

    def pad(a, fill):
        return np.pad(a, ((0, 0), (0, M - a.shape[1])), constant_values=fill)

    left = np.vstack([pad(f[0], -1) for f in forests])
    right = np.vstack([pad(f[1], -1) for f in forests])
    feat = np.vstack([pad(f[2], 0) for f in forests])
    thr = np.vstack([pad(f[3], 0.0) for f in forests])
    val = np.vstack([pad(f[4], 0.0) for f in forests])
    X32 = np.asarray(X, dtype=np.float32).astype(np.float64)
    Tt, n = left.shape[0], X.shape[0]
    rows = np.arange(Tt)[:, None]
    cols = np.arange(n)[None, :]
    node = np.zeros((Tt, n), dtype=np.intp)
    while True:
        lf = left[rows, node]
        inner = lf >= 0
        if not inner.any():
            break
        go_left = X32[cols, feat[rows, node]] <= thr[rows, node]
        node = np.where(inner, np.where(go_left, lf, right[rows, node]), node)
    leaf = val[rows, node]  # (total trees, n)
    bounds = np.cumsum([0] + sizes)
    return np.stack([leaf[bounds[k] : bounds[k + 1]].mean(0) for k in range(len(sizes))])


def predict_many(models: Sequence[Any], X: np.ndarray) -> np.ndarray:
    """Predictions of several fitted models on the same X.

    Linear models (LassoCV, LinearRegression, ...) are evaluated together by one matrix
    product, random forests by one vectorized descent of all their trees (both identical to
    the models' ``predict`` up to rounding); other models one by one.

    Returns
    -------
    ndarray of shape (n_models, n_samples)
    """
    X = np.asarray(X, dtype=np.float64)
    out = np.empty((len(models), X.shape[0]))
    lin_idx, coefs, icpts = [], [], []
    for_idx, forests = [], []
    for k, m in enumerate(models):
        lc = _linear_coefs(m)
        if lc is not None and lc[0].shape[0] == X.shape[1]:
            lin_idx.append(k)
            coefs.append(lc[0])
            icpts.append(lc[1])
            continue
        fa = _forest_arrays(m) if getattr(m, "n_features_in_", -1) == X.shape[1] else None
        if fa is not None:
            for_idx.append(k)
            forests.append(fa)
            continue
        out[k] = np.asarray(m.predict(X), dtype=np.float64).reshape(-1)
    if lin_idx:
        out[lin_idx] = np.asarray(coefs) @ X.T + np.asarray(icpts)[:, None]
    if for_idx:
        out[for_idx] = _forests_predict(forests, X)
    return out
