"""Fitted models as messages: safe skops files (never pickle) and fast prediction of many models.

A fitted model crosses as the bytes of a skops file in a ``np.uint8`` array. Before anything in
it is built, every type it names is checked against :data:`TRUSTED_TYPES`, an explicit list of
exact names: the scikit-learn classes SEC's candidates produce, NumPy arrays and scalar types and
the plain containers skops writes. There is no wildcard and no function on the list, so a file
cannot make the loader call ``exec``, ``eval``, ``os.system``... A model whose types are all
trusted is then checked for structure (tree and neighbour indices in range) before it is used.

Users extend the list for their own candidate estimators with ``SEC(extra_trusted_types=[...])``
(names of :class:`sklearn.base.BaseEstimator` subclasses, JSON-able, so a deployment's learners
get the same list). :func:`predict_many` evaluates many received models on one learner's data at
once (linear models by one matrix product, random forests by one vectorized descent of all their
trees).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
import sys
import threading
import weakref
import zipfile
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "TRUSTED_TYPES",
    "UntrustedModelError",
    "check_extra_types",
    "check_model",
    "dumps_model",
    "loads_model",
    "predict_many",
]


class UntrustedModelError(ValueError):
    """A skops file names a type outside the allow-list, or is malformed; it was not loaded."""


_SK = "sklearn."
#: The exact type names a model file may contain (found by dumping every candidate of
#: :data:`~.candidates.CANDIDATE_SETS`, fitted and not, alone and in a scaling pipeline).
TRUSTED_TYPES: frozenset[str] = frozenset(
    [f"builtins.{t}" for t in ("dict", "list", "tuple", "str", "int", "float", "bool")]
    + ["numpy.ndarray", "numpy.random.mtrand.RandomState"]
    + [f"numpy.{t}" for t in ("bool", "float16", "float32", "float64", "int8", "int16", "int32",
                              "int64", "uint8", "uint16", "uint32", "uint64")]
    + [_SK + t for t in (
        # the candidates (and their plain versions)
        "linear_model._coordinate_descent.LassoCV", "linear_model._coordinate_descent.Lasso",
        "linear_model._coordinate_descent.ElasticNetCV",
        "linear_model._coordinate_descent.ElasticNet", "linear_model._base.LinearRegression",
        "linear_model._ridge.RidgeCV", "linear_model._ridge.Ridge",
        "linear_model._least_angle.LarsCV", "linear_model._least_angle.Lars",
        "linear_model._least_angle.LassoLars", "linear_model._least_angle.LassoLarsCV",
        "ensemble._forest.RandomForestRegressor", "ensemble._forest.ExtraTreesRegressor",
        "ensemble._gb.GradientBoostingRegressor", "tree._classes.DecisionTreeRegressor",
        "tree._classes.ExtraTreeRegressor", "neighbors._regression.KNeighborsRegressor",
        "svm._classes.SVR", "neural_network._multilayer_perceptron.MLPRegressor",
        "pipeline.Pipeline", "preprocessing._data.StandardScaler",
        # what they hold
        "tree._tree.Tree", "dummy.DummyRegressor", "neighbors._kd_tree.KDTree",
        "neighbors._ball_tree.BallTree", "metrics._dist_metrics.EuclideanDistance64",
        "metrics._dist_metrics.ManhattanDistance64", "metrics._dist_metrics.ChebyshevDistance64",
        "metrics._dist_metrics.MinkowskiDistance64",
        "neural_network._stochastic_optimizers.AdamOptimizer",
        "neural_network._stochastic_optimizers.SGDOptimizer",
        "_loss.link.IdentityLink", "_loss.link.Interval",
        "_loss.loss.HalfSquaredError", "_loss.loss.AbsoluteError", "_loss.loss.HuberLoss",
        "_loss.loss.PinballLoss", "_loss._loss.CyHalfSquaredError", "_loss._loss.CyAbsoluteError",
        "_loss._loss.CyHuberLoss", "_loss._loss.CyPinballLoss",
    )]
)

# skops node kinds that only rebuild data; the others (FunctionNode, MethodNode, PartialNode,
# OperatorFuncNode, ConstructorFromReduceNode, DefaultDictNode...) hand out or call callables
_LOADERS = frozenset({"ObjectNode", "DictNode", "ListNode", "TupleNode", "JsonNode", "TypeNode",
                      "NdArrayNode", "RandomStateNode", "TreeNode", "LossNode", "CachedNode",
                      "SetNode", "SliceNode", "BytesNode", "BytearrayNode"})
#: Largest uncompressed size of a model file (a compressed file cannot unpack into more).
MAX_MODEL_BYTES = 1 << 30
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)+$")

_CACHE_SIZE = 4096
_cache: OrderedDict[tuple[bytes, frozenset[str]], Any] = OrderedDict()
_cache_lock = threading.Lock()
#: one file parsed at a time: numpy's .npy header parse calls ast.literal_eval, and CPython
#: 3.11's AST constructor keeps its recursion depth in shared state, so two threads parsing at
#: once (SEC's threaded exchange) can fail with 'AST constructor recursion depth mismatch'
#: (python/cpython#106905)
_parse_lock = threading.Lock()


def dumps_model(est: Any) -> np.ndarray:
    """Serialize an estimator to the bytes of a skops file, as a ``uint8`` array.

    Parameters
    ----------
    est : scikit-learn estimator (fitted or not)

    Returns
    -------
    ndarray of shape (n_bytes,), dtype uint8
    """
    import skops.io as sio

    # deflate level 1: a forest's file shrinks ~9x for little time (less to copy and to hash)
    data = sio.dumps(est, compression=zipfile.ZIP_DEFLATED, compresslevel=1)
    return np.frombuffer(data, dtype=np.uint8).copy()


@functools.lru_cache(maxsize=256)
def _extra_type_problem(name: str) -> str | None:
    """Why ``name`` cannot be added to the allow-list (None if it can)."""
    if not isinstance(name, str) or not _NAME.match(name):
        return f"{name!r} is not a dotted 'module.Class' name"
    module, _, attr = name.rpartition(".")
    if module.split(".")[0] in sys.stdlib_module_names:
        return f"{name!r} is in the standard library, which defines no scikit-learn estimator"
    import importlib

    from sklearn.base import BaseEstimator

    try:
        obj = getattr(importlib.import_module(module), attr)
    except Exception as e:  # not importable here
        return f"{name!r} cannot be imported here ({type(e).__name__}: {e})"
    if not (isinstance(obj, type) and issubclass(obj, BaseEstimator)):
        return f"{name!r} is not a scikit-learn estimator class (a BaseEstimator subclass)"
    if f"{obj.__module__}.{obj.__qualname__}" != name:
        return (f"{name!r} is defined as {obj.__module__}.{obj.__qualname__}; give that name "
                "(the one skops writes)")
    return None


def check_extra_types(names: Iterable[str] | None) -> tuple[str, ...]:
    """Validate a user's additions to :data:`TRUSTED_TYPES` (``SEC(extra_trusted_types=...)``).

    Each name must be the full name skops writes, ``type(est).__module__ + "." +
    type(est).__qualname__``, of a :class:`sklearn.base.BaseEstimator` subclass importable here:
    functions, standard-library types and anything else stay refused, so a list that comes from
    a file or a server cannot open the loader to code.

    Returns
    -------
    tuple of str
        The names, sorted.

    Raises
    ------
    ValueError
        Naming the first bad entry and why.
    """
    if names is None:
        return ()
    if isinstance(names, str) or not isinstance(names, Iterable):
        raise ValueError(f"extra_trusted_types must be a list of class names, got {names!r}")
    out = sorted(set(names))
    for n in out:
        why = _extra_type_problem(n)
        if why is not None:
            raise ValueError(f"extra_trusted_types: {why}; only estimator classes can be added")
    return tuple(out)


def _as_bytes(arr: np.ndarray | bytes) -> bytes:
    return arr if isinstance(arr, bytes) else bytes(np.asarray(arr, dtype=np.uint8).tobytes())


def _schema_types(data: bytes) -> set[str]:
    """Every type name the ``schema.json`` of a skops file names, built from nothing."""
    from skops.io._protocol import PROTOCOL

    from ...engine.protocol.bounds import check_zip

    check_zip(data, "the file", MAX_MODEL_BYTES)  # every member's declared size, .npy headers
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        schema = json.loads(z.read("schema.json"))
    if not isinstance(schema, dict) or schema.get("protocol") != PROTOCOL:
        raise ValueError(f"it is not a skops protocol {PROTOCOL} file (protocol "
                         f"{schema.get('protocol') if isinstance(schema, dict) else None!r})")
    names: set[str] = set()
    todo: list[Any] = [schema]
    while todo:
        o = todo.pop()
        if isinstance(o, list):
            todo.extend(o)
        elif isinstance(o, dict):
            todo.extend(o.values())
            if "__module__" in o or "__class__" in o or "__loader__" in o:
                mod, cls, loader = o.get("__module__"), o.get("__class__"), o.get("__loader__")
                if not (isinstance(mod, str) and isinstance(cls, str)):
                    names.add(f"{mod!r}.{cls!r} (not a type name)")
                    continue
                names.add(f"{mod}.{cls}")
                if loader not in _LOADERS:
                    names.add(f"{mod}.{cls} (loaded by {loader!r})")
    return names


def check_model(arr: np.ndarray | bytes, *, source: str = "received model",
                extra_types: Iterable[str] | None = ()) -> list[str]:
    """Check a skops file against the allow-list without building anything from it.

    Parameters
    ----------
    arr : ndarray of uint8 or bytes
    source : str
        What the file is, for the error ("learner 'l03''s model", "candidate 'rf' from the
        server").
    extra_types : list of str
        The user's additions (:func:`check_extra_types`).

    Returns
    -------
    list of str
        The type names in the file, all trusted.

    Raises
    ------
    UntrustedModelError
        The file is not a skops file, or names a type outside the allow-list.
    """
    data = _as_bytes(arr)
    try:
        names = _schema_types(data)
    except (ValueError, KeyError, zipfile.BadZipFile, RecursionError, OSError) as e:
        raise UntrustedModelError(f"{source} is not a valid skops file ({e}); nothing was "
                                  "loaded") from e
    extra = set(extra_types or ())
    bad = sorted(n for n in names if n not in TRUSTED_TYPES
                 and not (n in extra and _extra_type_problem(n) is None))
    if bad:
        raise UntrustedModelError(
            f"{source} contains types outside the allow-list: {bad}; nothing was loaded. Only "
            "the scikit-learn, NumPy and container types of fedlatent.models.sec.TRUSTED_TYPES "
            "load; add your own estimator classes with SEC(extra_trusted_types=[...])"
        )
    return sorted(names)


def loads_model(arr: np.ndarray | bytes, *, source: str = "received model",
                extra_types: Iterable[str] | None = ()) -> Any:
    """Load an estimator from skops bytes after :func:`check_model` and before any use.

    Nothing is built from a file that names a type outside :data:`TRUSTED_TYPES` (plus
    ``extra_types``); a loaded model whose trees or neighbour structures index out of range is
    refused too (scikit-learn does not bounds-check them). Loads are cached by content hash and
    trust list (a load is a pure function of both), so a process holding many learners
    deserializes each distinct model once. The returned object is shared: use it read-only
    (predict), clone it before fitting.

    Parameters
    ----------
    arr : ndarray of uint8 or bytes
    source : str
        What the file is, for errors.
    extra_types : list of str
        The user's additions to the allow-list.

    Returns
    -------
    estimator

    Raises
    ------
    UntrustedModelError
    """
    import skops.io as sio

    data = _as_bytes(arr)
    extra = frozenset(extra_types or ())
    key = (hashlib.sha256(data).digest(), extra)
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    with _parse_lock:
        names = check_model(data, source=source, extra_types=extra)
        try:
            est = sio.loads(data, trusted=names)
        except Exception as e:  # a well-typed but inconsistent file
            raise UntrustedModelError(f"{source} could not be loaded "
                                      f"({type(e).__name__}: {e})") from e
    _check_structure(est, source)
    with _cache_lock:
        _cache[key] = est
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return est


# ---- structure of loaded models: indices scikit-learn's compiled code follows unchecked ----------
def _bad(source: str, what: str) -> UntrustedModelError:
    return UntrustedModelError(f"{source} is malformed: {what}; it was not used")


def _check_tree(t: Any, n_features: int, source: str) -> None:
    n = int(t.node_count)
    left, right = np.asarray(t.children_left), np.asarray(t.children_right)
    feat, value = np.asarray(t.feature), np.asarray(t.value)
    if n < 1 or left.shape != (n,) or right.shape != (n,) or feat.shape != (n,) or (
            value.shape[0] != n):
        raise _bad(source, f"a tree's node arrays do not have its {n} nodes")
    if int(t.n_features) != n_features:
        raise _bad(source, f"a tree has {t.n_features} features, its model {n_features}")
    idx = np.arange(n)
    inner = left != -1
    if np.any(right[~inner] != -1):
        raise _bad(source, "a tree node has one child")
    # children come after their parent (as scikit-learn builds trees): no cycle, no escape
    if np.any((left[inner] <= idx[inner]) | (left[inner] >= n) | (right[inner] <= idx[inner])
              | (right[inner] >= n)) or np.any((feat[inner] < 0) | (feat[inner] >= n_features)):
        raise _bad(source, "a tree node points outside the tree or the features")


def _check_neighbors(tree: Any, n_features: int, source: str) -> None:
    data, idx, nodes, bounds = (np.asarray(a) for a in tree.get_arrays())
    n, m = data.shape[0], nodes.shape[0]
    if data.ndim != 2 or data.shape[1] != n_features or not np.array_equal(
            np.sort(idx), np.arange(n)):
        raise _bad(source, "a neighbour tree's data or index array is inconsistent")
    start, end = nodes["idx_start"], nodes["idx_end"]
    leaf = nodes["is_leaf"].astype(bool)
    if (m < 1 or np.any((start < 0) | (start > end) | (end > n))
            or not leaf[np.arange(m) * 2 + 1 >= m].all() or bounds.shape[1:] != (m, n_features)):
        raise _bad(source, "a neighbour tree's nodes point outside it")


def _check_structure(est: Any, source: str, depth: int = 0) -> None:
    """Walk a loaded estimator (and the estimators it holds) and check its index structures."""
    from sklearn.base import BaseEstimator

    if depth > 20:
        raise _bad(source, "estimators nested more than 20 deep")
    nf = getattr(est, "n_features_in_", None)
    tree = getattr(est, "tree_", None)
    if tree is not None and not isinstance(tree, (int, float)):
        if type(tree).__name__ == "Tree":
            _check_tree(tree, int(nf if nf is not None else tree.n_features), source)
        elif type(tree).__name__ in ("KDTree", "BallTree"):
            _check_neighbors(tree, int(nf), source)
    nb = getattr(est, "_tree", None)
    if nb is not None and type(nb).__name__ in ("KDTree", "BallTree"):
        _check_neighbors(nb, int(nf), source)
        if int(getattr(est, "n_samples_fit_", -1)) != np.asarray(nb.data).shape[0] or (
                np.asarray(est._y).shape[0] != np.asarray(nb.data).shape[0]):
            raise _bad(source, "a neighbours model's sample counts disagree")
    if hasattr(est, "support_vectors_"):
        sv = np.asarray(est.support_vectors_)
        ns = np.asarray(est._n_support)
        # libsvm: a classifier's support vectors are split by class; a regressor uses them all
        counts = ns.sum() if getattr(est, "_estimator_type", "") == "classifier" else ns.max(
            initial=0)
        if (sv.ndim != 2 or sv.shape[1] != nf or ns.size < 1 or int(counts) > sv.shape[0]
                or np.any(ns < 0) or np.asarray(est._dual_coef_).shape != (1, sv.shape[0])
                or np.asarray(est.support_).shape != (sv.shape[0],)):
            raise _bad(source, "a support vector model's arrays disagree")
    subs: list[tuple[Any, bool]] = []  # (sub-model, must have the same features)
    for s in getattr(est, "steps", None) or ():
        subs.append((s[1], False))
    for name in ("estimators_", "init_"):
        v = getattr(est, name, None)
        if isinstance(v, BaseEstimator):
            subs.append((v, True))
        elif isinstance(v, (list, tuple, np.ndarray)):
            subs += [(e, True) for e in np.asarray(v, dtype=object).reshape(-1)]
    for sub, same in subs:
        if not isinstance(sub, BaseEstimator):
            continue
        snf = getattr(sub, "n_features_in_", None)
        if same and nf is not None and snf is not None and int(snf) != int(nf):
            raise _bad(source, f"a sub-model has {snf} features, its model {nf}")
        _check_structure(sub, source, depth + 1)


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
