"""SEC: meta clustering of learners by Select-Exchange-Cluster.

Each learner (client) holds a supervised regression data set. SEC groups the learners whose
X -> Y relationship is the same, without moving samples:

1. **Select** -- each learner splits its data half-half, fits every candidate scikit-learn regressor
   on one half, keeps the one with the lowest MSE on the other half (eq. 1), refits it on all its
   data and records its in-sample MSE ``e_i``.
2. **Exchange** -- learner i's fitted model crosses to learner j (as a skops file, never pickle),
   who returns the scalar loss ``e_{i->j}``; the dissimilarity is eq. (2)
   ``v_ij = |e_{i->j} - e_j| + |e_{j->i} - e_i|``.
3. **Cluster** -- ``S = exp(-a V)``, normalized affinity ``D^-1/2 S D^-1/2``, top-K eigenvectors,
   row normalization, k-means with restarts (Ng, Jordan and Weiss, 2002). K is given, or chosen by
   the gap statistic or by the penalty of Remark 2.

SEC is a one-shot protocol, not EM: it does not use the federated round loop. It runs through the
same runtime abstraction as the engine (``Runtime.call`` -> ``ClientNode`` -> the registered
model's ``client_query``), so any runtime (in-process, Flower) can carry it. Messages hold only
arrays, scalars and strings: fitted models travel as the bytes of a skops file in a ``np.uint8``
array, and are loaded only if every type they contain is on an allow-list of scikit-learn,
NumPy and SciPy types.

References
----------
Ye, Ghanadan and Ding, "Meta Clustering for Collaborative Learning", Journal of Computational and
Graphical Statistics (2023): Section 3 (Algorithm 1, eqs. 1-4, Remarks 1-3).
Ng, Jordan and Weiss, "On spectral clustering: analysis and an algorithm", NIPS 2002.
Tibshirani, Walther and Hastie, "Estimating the number of clusters in a data set via the gap
statistic", JRSS-B 63 (2001).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import linalg

from ..data.dataset import ClientData, DataValidationError, FederatedDataset
from ..engine.loop import setup_clients
from ..engine.model import ClientStep, FederatedModel, Params, register_model
from ..engine.registry import register_estimator
from ..engine.runtime import Runtime
from ..engine.stats import Stats
from .base import NotFittedError, resolve_seed

__all__ = [
    "BUILTIN_CANDIDATES",
    "CANDIDATE_SETS",
    "SEC",
    "SECModel",
    "UntrustedModelError",
    "affinity",
    "auto_affinity_scale",
    "clustering_accuracy",
    "dissimilarity",
    "dumps_model",
    "gap_statistic",
    "kmeans",
    "loads_model",
    "make_candidates",
    "normalized_affinity",
    "penalty_selection",
    "select_model",
    "selection_embedding",
    "spectral_clustering",
    "spectral_embedding",
    "weighted_prediction",
    "within_cluster_dispersion",
]

logger = logging.getLogger(__name__)

MIN_SAMPLES = 4


# ---------------------------------------------------------------------------------------------
# Candidates
# ---------------------------------------------------------------------------------------------
def _lasso_cv():
    from sklearn.linear_model import LassoCV

    # "LASSO with built-in half-half cross-validation to select the tuning parameter" (Sec. 5.1)
    return LassoCV(cv=2, alphas=30)


def _rf():
    from sklearn.ensemble import RandomForestRegressor

    return RandomForestRegressor(n_estimators=50, max_depth=3)


def _linear():
    from sklearn.linear_model import LinearRegression

    return LinearRegression()


def _ridge():
    from sklearn.linear_model import RidgeCV

    return RidgeCV()


def _enet():
    from sklearn.linear_model import ElasticNetCV

    return ElasticNetCV(cv=2, alphas=30)


def _lars():
    from sklearn.linear_model import LarsCV

    return LarsCV(cv=2)


def _knn():
    from sklearn.neighbors import KNeighborsRegressor

    return KNeighborsRegressor()


def _svr():
    from sklearn.svm import SVR

    return SVR()


def _gb():
    from sklearn.ensemble import GradientBoostingRegressor

    return GradientBoostingRegressor(n_estimators=50, max_depth=3)


def _mlp():
    from sklearn.neural_network import MLPRegressor

    return MLPRegressor(hidden_layer_sizes=(32,), max_iter=300)


#: Built-in candidate regressors by name (a fresh unfitted estimator per call).
BUILTIN_CANDIDATES: dict[str, Callable[[], Any]] = {
    "lasso_cv": _lasso_cv,
    "rf": _rf,
    "linear": _linear,
    "ridge": _ridge,
    "enet": _enet,
    "lars": _lars,
    "knn": _knn,
    "svr": _svr,
    "gb": _gb,
    "mlp": _mlp,
}

#: Named candidate sets: the default of Simulation 1, the fairness example and Table 2's rows.
CANDIDATE_SETS: dict[str, tuple[str, ...]] = {
    "default": ("lasso_cv", "rf"),
    "fairness": ("rf", "linear"),
    "table2-1": ("gb",),
    "table2-3": ("rf", "gb", "lasso_cv"),
    "table2-5": ("rf", "knn", "gb", "lasso_cv", "lars"),
    "table2-7": ("rf", "knn", "svr", "gb", "lasso_cv", "lars", "enet"),
    "table2-9": ("rf", "knn", "svr", "mlp", "gb", "lasso_cv", "lars", "enet", "ridge"),
}

# Fitted models of these kinds store training samples inside the model (support vectors,
# neighbours, kernel centres): shipping them ships samples.
_MEMORIZING = ("KNeighborsRegressor", "RadiusNeighborsRegressor", "SVR", "NuSVR",
               "KernelRidge", "GaussianProcessRegressor")


def make_candidates(spec: Any = None) -> list[tuple[str, Any]]:
    """Resolve a candidate specification into ``[(name, unfitted estimator), ...]``.

    Parameters
    ----------
    spec : None, str, sequence or mapping
        None: the default set (LassoCV and a random forest of 50 trees of depth 3). A string: a
        set of :data:`CANDIDATE_SETS` or one name of :data:`BUILTIN_CANDIDATES`. A sequence of
        names and/or scikit-learn regressors (or pipelines ending in one). A mapping
        ``{name: regressor}``.

    Returns
    -------
    list of (str, estimator)

    Raises
    ------
    ValueError
        Unknown name, empty set, duplicate names, or a candidate that is not a regressor.
    """
    if spec is None:
        spec = "default"
    if isinstance(spec, str):
        names = CANDIDATE_SETS.get(spec, (spec,))
        items: list[tuple[str, Any]] = [(n, n) for n in names]
    elif isinstance(spec, Mapping):
        items = [(str(k), v) for k, v in spec.items()]
    elif isinstance(spec, Sequence):
        items = []
        for c in spec:
            items.append((c, c) if isinstance(c, str) else (type(c).__name__, c))
    else:
        items = [(type(spec).__name__, spec)]
    if not items:
        raise ValueError("the candidate set is empty; give at least one regressor")
    out: list[tuple[str, Any]] = []
    for name, c in items:
        if isinstance(c, str):
            if c not in BUILTIN_CANDIDATES:
                raise ValueError(
                    f"unknown candidate {c!r}; built-in candidates: {sorted(BUILTIN_CANDIDATES)}, "
                    f"candidate sets: {sorted(CANDIDATE_SETS)}"
                )
            c = BUILTIN_CANDIDATES[c]()
        _check_regressor(name, c)
        out.append((name, c))
    names = [n for n, _ in out]
    if len(set(names)) != len(names):
        # make names unique (two LinearRegression objects, say)
        seen: dict[str, int] = {}
        fixed = []
        for n, c in out:
            seen[n] = seen.get(n, 0) + 1
            fixed.append((n if seen[n] == 1 else f"{n}_{seen[n]}", c))
        out = fixed
    return out


def _check_regressor(name: str, est: Any) -> None:
    from sklearn.base import is_regressor

    ok = hasattr(est, "fit") and hasattr(est, "predict") and hasattr(est, "get_params")
    if not ok or not is_regressor(est):
        raise ValueError(
            f"candidate {name!r} ({type(est).__name__}) is not a scikit-learn regressor; give "
            "regressors such as LassoCV() or RandomForestRegressor(), or pipelines ending in one"
        )


# ---------------------------------------------------------------------------------------------
# Models as skops files
# ---------------------------------------------------------------------------------------------
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


def _seed_estimator(est: Any, rng: np.random.Generator) -> Any:
    """Give every unset ``random_state`` (nested ones too) an integer drawn from ``rng``."""
    params = est.get_params(deep=True)
    upd = {k: int(rng.integers(2**31 - 1)) for k in sorted(params)
           if (k == "random_state" or k.endswith("__random_state")) and params[k] is None}
    if upd:
        est.set_params(**upd)
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


# ---------------------------------------------------------------------------------------------
# Select and exchange (client-side math)
# ---------------------------------------------------------------------------------------------
def standardize_xy(X: np.ndarray, y: np.ndarray):
    """Per-learner standardization of X (columns) and y (Section 5: "we standardize x and y").

    Returns
    -------
    Xs, ys, x_mean, x_scale, y_mean, y_scale
        Constant columns get scale 1.
    """
    xm = X.mean(0)
    xs = X.std(0)
    xs = np.where(xs > 0, xs, 1.0)
    ym = float(y.mean())
    ys = float(y.std())
    ys = ys if ys > 0 else 1.0
    return (X - xm) / xs, (y - ym) / ys, xm, xs, ym, ys


def select_model(
    X: np.ndarray, y: np.ndarray, candidates: Sequence[tuple[str, Any]], rng: np.random.Generator
) -> tuple[int, Any, float, np.ndarray]:
    """Step 1 (Select): half-half cross-validation among candidates, refit on all data.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)
    candidates : list of (name, unfitted regressor)
    rng : Generator
        Draws the split and the seeds of candidates whose ``random_state`` is unset.

    Returns
    -------
    best : int
        Index of the candidate minimizing the validation MSE, eq. (1).
    model : fitted estimator
        The selected candidate refitted on all ``n_samples``.
    e : float
        Its in-sample MSE ``e_i``.
    cv_mse : ndarray of shape (n_candidates,)
        Validation MSE of each candidate (inf where a candidate failed to fit).
    """
    from sklearn.base import clone

    n = X.shape[0]
    perm = rng.permutation(n)
    tr, te = perm[: n // 2], perm[n // 2 :]
    seeds = [int(s) for s in rng.integers(2**31 - 1, size=len(candidates))]
    cv = np.full(len(candidates), np.inf)
    for k, (name, cand) in enumerate(candidates):
        est = _seed_estimator(clone(cand), np.random.default_rng(seeds[k]))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                est.fit(X[tr], y[tr])
                pred = np.asarray(est.predict(X[te]), dtype=np.float64).reshape(-1)
        except Exception as e:  # a candidate unable to fit this learner is skipped
            logger.warning("candidate %r failed on a half-split: %s", name, e)
            continue
        mse = float(np.mean((y[te] - pred) ** 2))
        cv[k] = mse if np.isfinite(mse) else np.inf
    if not np.isfinite(cv).any():
        raise ValueError("no candidate could be fitted on this learner's data")
    best = int(np.argmin(cv))
    model = _seed_estimator(clone(candidates[best][1]), np.random.default_rng(seeds[best]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(X, y)
    e = float(np.mean((y - np.asarray(model.predict(X), dtype=np.float64).reshape(-1)) ** 2))
    return best, model, e, cv


def dissimilarity(E: np.ndarray, e: np.ndarray) -> np.ndarray:
    """Eq. (2): ``v_ij = |e_{i->j} - e_j| + |e_{j->i} - e_i|``, ``v_ii = 0``.

    Parameters
    ----------
    E : ndarray of shape (L, L)
        ``E[i, j] = e_{i->j}``, the MSE of learner i's model on learner j's data.
    e : ndarray of shape (L,)
        In-sample MSE of each learner's own model.

    Returns
    -------
    V : ndarray of shape (L, L), symmetric, zero diagonal
    """
    E = np.asarray(E, dtype=np.float64)
    e = np.asarray(e, dtype=np.float64)
    D = np.abs(E - e[None, :])
    V = D + D.T
    np.fill_diagonal(V, 0.0)
    return V


def auto_affinity_scale(V: np.ndarray) -> float:
    """The ``a`` of ``S = exp(-a V)`` chosen from the scale of V: ``a = 1 / mean(v_ij, i < j)``.

    The mean off-diagonal dissimilarity gets similarity ``exp(-1)``, so S is well spread
    whatever the units of the response (the paper's remark that a fixed ``a = 1`` can make all
    ``S_ij`` underflow when V is large). The mean, unlike the median, is set by the
    between-cluster dissimilarities even when one cluster holds most learners, so small
    within-cluster differences (learners selecting different candidates) are not magnified
    into spurious clusters. If V is all zero, ``a = 1``.

    Parameters
    ----------
    V : ndarray of shape (L, L)

    Returns
    -------
    float
    """
    V = np.asarray(V, dtype=np.float64)
    iu = np.triu_indices(V.shape[0], 1)
    v = V[iu]
    if v.size == 0:
        return 1.0
    mean = float(np.mean(v))
    return 1.0 / mean if mean > 0 else 1.0


def affinity(V: np.ndarray, a: float) -> np.ndarray:
    """``S_ij = exp(-a v_ij)`` (Algorithm 1, step 1). Returns ndarray of shape (L, L)."""
    return np.exp(-float(a) * np.asarray(V, dtype=np.float64))


def normalized_affinity(S: np.ndarray) -> np.ndarray:
    """``D^-1/2 S D^-1/2`` with ``D = diag(row sums of S)`` (Algorithm 1, step 2a)."""
    S = np.asarray(S, dtype=np.float64)
    d = S.sum(1)
    if np.any(d <= 0):
        raise ValueError("a learner has zero total similarity; the affinity scale is too large")
    r = 1.0 / np.sqrt(d)
    return r[:, None] * S * r[None, :]


def _eigh_desc(M: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    w, U = linalg.eigh(0.5 * (M + M.T))
    order = np.argsort(w)[::-1]
    return w[order], U[:, order]


def _row_normalize(U: np.ndarray) -> np.ndarray:
    nrm = np.linalg.norm(U, axis=1, keepdims=True)
    return U / np.where(nrm > 0, nrm, 1.0)


def spectral_embedding(S: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of the top-k eigenvectors of the normalized affinity, each scaled to unit norm.

    Parameters
    ----------
    S : ndarray of shape (L, L)
    k : int

    Returns
    -------
    U_star : ndarray of shape (L, k)
        Algorithm 1, steps 2b-2c.
    eigenvalues : ndarray of shape (L,)
        All eigenvalues of ``D^-1/2 S D^-1/2``, largest first.
    """
    w, U = _eigh_desc(normalized_affinity(S))
    return _row_normalize(U[:, :k]), w


def selection_embedding(S: np.ndarray, max_clusters: int) -> np.ndarray:
    """The embedding on which K is chosen: top ``max_clusters`` eigenvectors weighted by their
    (non-negative) eigenvalues, rows scaled to unit norm.

    The top-K embedding of Algorithm 1 changes dimension with K (its rows are all equal for
    K = 1), so within-cluster dispersions of different K are compared on one fixed embedding.
    Weighting by the eigenvalue (a diffusion-map step) keeps the directions of eigenvalue ~0,
    which are arbitrary for a block-diagonal S, from scattering the rows.

    Returns
    -------
    ndarray of shape (L, max_clusters)
    """
    w, U = _eigh_desc(normalized_affinity(S))
    k = min(int(max_clusters), U.shape[0])
    return _row_normalize(U[:, :k] * np.clip(w[:k], 0.0, None)[None, :])


def _kmeans_batch(Y: np.ndarray, k: int, n_init: int, rng: np.random.Generator,
                  max_iter: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Lloyd's k-means with k-means++ seeding on a batch of data sets, all restarts at once.

    Y : (B, n, d). Returns labels (B, n) and inertia (B,) of the best restart of each set.
    """
    B, n, d = Y.shape
    R = max(int(n_init), 1)
    k = int(k)
    bi = np.arange(B)[:, None]
    sq = np.einsum("bnd,bnd->bn", Y, Y)  # (B, n)
    C = np.empty((B, R, k, d))
    idx = rng.integers(n, size=(B, R))
    C[:, :, 0] = Y[bi, idx]
    d2 = ((Y[:, None, :, :] - C[:, :, 0][:, :, None, :]) ** 2).sum(-1)  # (B, R, n)
    for c in range(1, k):
        tot = d2.sum(-1, keepdims=True)
        p = np.where(tot > 0, d2 / np.where(tot > 0, tot, 1.0), 1.0 / n)
        cum = np.cumsum(p, -1)
        u = rng.random((B, R, 1)) * cum[..., -1:]
        idx = np.minimum((cum < u).sum(-1), n - 1)
        C[:, :, c] = Y[bi, idx]
        d2 = np.minimum(d2, ((Y[:, None, :, :] - C[:, :, c][:, :, None, :]) ** 2).sum(-1))
    labels = None
    for _ in range(max_iter):
        D = (sq[:, None, :, None] - 2.0 * np.einsum("bnd,brkd->brnk", Y, C)
             + np.einsum("brkd,brkd->brk", C, C)[:, :, None, :])
        new = D.argmin(-1)  # (B, R, n)
        if labels is not None and np.array_equal(new, labels):
            break
        labels = new
        M = (labels[..., None] == np.arange(k)).astype(np.float64)  # (B, R, n, k)
        cnt = M.sum(2)  # (B, R, k)
        sums = np.einsum("brnk,bnd->brkd", M, Y)
        C = np.where(cnt[..., None] > 0, sums / np.maximum(cnt, 1.0)[..., None], C)
    assert labels is not None
    # exact inertia at the final assignment, centres = means of the assigned points
    M = (labels[..., None] == np.arange(k)).astype(np.float64)
    cnt = M.sum(2)
    sums = np.einsum("brnk,bnd->brkd", M, Y)
    C = sums / np.maximum(cnt, 1.0)[..., None]
    resid = Y[:, None, :, :] - np.take_along_axis(C, labels[..., None], axis=2)
    inertia = (resid**2).sum((-1, -2))  # (B, R)
    best = inertia.argmin(1)
    return labels[np.arange(B), best], inertia[np.arange(B), best]


def _canonical(labels: np.ndarray) -> np.ndarray:
    """Relabel clusters 0, 1, ... in order of first appearance."""
    _, first = np.unique(labels, return_index=True)
    order = np.argsort(first)
    mapping = np.empty(order.size, dtype=np.int64)
    mapping[np.unique(labels)[order]] = np.arange(order.size)
    return mapping[labels]


def kmeans(Y: np.ndarray, k: int, n_init: int = 10, rng: np.random.Generator | None = None,
           max_iter: int = 100) -> tuple[np.ndarray, float]:
    """k-means (Lloyd, k-means++ seeding) with ``n_init`` restarts; the best inertia wins.

    Parameters
    ----------
    Y : ndarray of shape (n, d)
    k : int
    n_init : int
    rng : Generator

    Returns
    -------
    labels : ndarray of shape (n,)
        Clusters numbered in order of first appearance.
    inertia : float
        Sum of squared distances to the cluster means.
    """
    rng = np.random.default_rng(rng)
    Y = np.asarray(Y, dtype=np.float64)
    lab, inertia = _kmeans_batch(Y[None], k, n_init, rng, max_iter)
    return _canonical(lab[0]), float(inertia[0])


def within_cluster_dispersion(Y: np.ndarray, labels: np.ndarray) -> float:
    """First term of eq. (3): ``sum_t sum_{i,j in S_t} ||u_i - u_j||^2 / (2 |S_t|)``.

    Equal to the within-cluster sum of squares around the cluster means.
    """
    Y = np.asarray(Y, dtype=np.float64)
    total = 0.0
    for t in np.unique(labels):
        Z = Y[labels == t]
        total += float(((Z - Z.mean(0)) ** 2).sum())
    return total


def gap_statistic(
    Y: np.ndarray,
    max_clusters: int = 10,
    n_refs: int = 20,
    n_init: int = 10,
    rng: np.random.Generator | None = None,
    rule: str = "tibshirani",
) -> tuple[int, dict[str, np.ndarray]]:
    """Number of clusters by the gap statistic (Tibshirani, Walther and Hastie, 2001).

    ``Gap(K) = E*[log W*_K] - log W_K`` with W the within-cluster dispersion of k-means, and
    reference data drawn uniformly in the box aligned with the principal axes of Y (their
    method "b"), ``s_K = sd*(log W*_K) sqrt(1 + 1/B)``.

    ``rule="tibshirani"`` (default, their eq. 5.1): the smallest K with
    ``Gap(K) >= Gap(K+1) - s_{K+1}``. It cannot see past K = 1 when three or more clusters are
    equally far apart (vertices of a simplex, as for a block-diagonal similarity with equal
    blocks: merging two of three clusters halves W as it does for uniform data).
    ``rule="global"``: the smallest K within one standard error of the largest gap (R's
    ``cluster::clusGap`` "globalSEmax", after Dudoit and Fridlyand, 2002); it finds equidistant
    clusters but follows within-cluster structure to large K on noisy SEC embeddings.

    Parameters
    ----------
    Y : ndarray of shape (n, d)
    max_clusters : int
    n_refs : int
        B, the number of reference data sets.
    n_init : int
        k-means restarts.
    rng : Generator
    rule : {"tibshirani", "global"}

    Returns
    -------
    k : int
    info : dict with arrays ``k``, ``W``, ``gap``, ``s`` of length max_clusters
    """
    rng = np.random.default_rng(rng)
    Y = np.asarray(Y, dtype=np.float64)
    n = Y.shape[0]
    kmax = max(1, min(int(max_clusters), n))
    mu = Y.mean(0)
    Yc = Y - mu
    _, _, Vt = np.linalg.svd(Yc, full_matrices=False)
    P = Yc @ Vt.T
    lo, hi = P.min(0), P.max(0)
    refs = rng.uniform(lo, hi, size=(int(n_refs), n, P.shape[1])) @ Vt + mu
    # a floor for log W so exact clusterings (W = 0) give a large, finite gap
    floor = 1e-12 * max(float((Yc**2).sum()), 1e-300)
    W = np.empty(kmax)
    logW_ref = np.empty((kmax, int(n_refs)))
    for k in range(1, kmax + 1):
        _, wk = _kmeans_batch(Y[None], k, n_init, rng)
        _, wr = _kmeans_batch(refs, k, n_init, rng)
        W[k - 1] = wk[0]
        logW_ref[k - 1] = np.log(np.maximum(wr, floor))
    logW = np.log(np.maximum(W, floor))
    gap = logW_ref.mean(1) - logW
    s = logW_ref.std(1) * np.sqrt(1.0 + 1.0 / int(n_refs))
    if rule == "tibshirani":
        k_hat = kmax
        for k in range(1, kmax):
            if gap[k - 1] >= gap[k] - s[k]:
                k_hat = k
                break
    elif rule == "global":
        best = int(np.argmax(gap))
        k_hat = int(np.flatnonzero(gap >= gap[best] - s[best])[0]) + 1
    else:
        raise ValueError(f"rule must be 'tibshirani' or 'global', got {rule!r}")
    return k_hat, {"k": np.arange(1, kmax + 1), "W": W, "gap": gap, "s": s}


def penalty_selection(
    Y: np.ndarray,
    max_clusters: int,
    penalty: float,
    n_init: int = 10,
    rng: np.random.Generator | None = None,
) -> tuple[int, dict[str, np.ndarray]]:
    """Number of clusters by Remark 2: minimize ``W_K + K * lambda_n`` (eq. 3) over K.

    Parameters
    ----------
    Y : ndarray of shape (n, d)
    max_clusters : int
    penalty : float
        ``lambda_n``.

    Returns
    -------
    k : int
    info : dict with arrays ``k``, ``W``, ``objective``
    """
    rng = np.random.default_rng(rng)
    Y = np.asarray(Y, dtype=np.float64)
    kmax = max(1, min(int(max_clusters), Y.shape[0]))
    W = np.array([_kmeans_batch(Y[None], k, n_init, rng)[1][0] for k in range(1, kmax + 1)])
    obj = W + float(penalty) * np.arange(1, kmax + 1)
    return int(np.argmin(obj)) + 1, {"k": np.arange(1, kmax + 1), "W": W, "objective": obj}


def spectral_clustering(
    S: np.ndarray, k: int, n_init: int = 10, rng: np.random.Generator | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Algorithm 1, step 2 (Ng, Jordan and Weiss): labels of the L learners for a given K.

    Parameters
    ----------
    S : ndarray of shape (L, L)
    k : int
    n_init : int
    rng : Generator

    Returns
    -------
    labels : ndarray of shape (L,)
    U_star : ndarray of shape (L, k)
    eigenvalues : ndarray of shape (L,), largest first
    """
    U, w = spectral_embedding(S, k)
    labels, _ = kmeans(U, k, n_init=n_init, rng=rng)
    return labels, U, w


def weighted_prediction(preds: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Eq. (4): ``sum_i n_i / (sum_j n_j) f_i(x)``.

    Parameters
    ----------
    preds : ndarray of shape (n_models, n_samples)
    n : ndarray of shape (n_models,)

    Returns
    -------
    ndarray of shape (n_samples,)
    """
    w = np.asarray(n, dtype=np.float64)
    return (w / w.sum()) @ np.asarray(preds, dtype=np.float64)


def clustering_accuracy(true: np.ndarray, pred: np.ndarray) -> float:
    """Fraction of learners correctly labelled under the best matching of cluster labels.

    Uses the Hungarian algorithm on the contingency table (clusters in excess stay unmatched).
    """
    from scipy.optimize import linear_sum_assignment

    t = np.unique(true, return_inverse=True)[1]
    p = np.unique(pred, return_inverse=True)[1]
    C = np.zeros((t.max() + 1, p.max() + 1))
    np.add.at(C, (t, p), 1.0)
    r, c = linear_sum_assignment(-C)
    return float(C[r, c].sum() / t.size)


# ---------------------------------------------------------------------------------------------
# The model on the clients
# ---------------------------------------------------------------------------------------------
def _payload_models(payload: Mapping[str, Any], prefix: str) -> list[np.ndarray]:
    keys = sorted((k for k in payload if k.startswith(prefix + "/")),
                  key=lambda k: int(k[len(prefix) + 1 :]))
    return [np.asarray(payload[k], dtype=np.uint8) for k in keys]


def check_learner(client: str, X: np.ndarray, y: np.ndarray | None, target: str = "y") -> None:
    """Raise DataValidationError if a learner cannot take part (no y, < 4 samples, constant y)."""
    if y is None:
        raise DataValidationError(
            f"client {client!r} has no target; SEC clusters regressions and needs y "
            "(build the dataset with target=...)"
        )
    n = X.shape[0]
    if n < MIN_SAMPLES:
        raise DataValidationError(
            f"client {client!r} has {n} samples; SEC needs at least {MIN_SAMPLES} per learner "
            "(half to fit and half to validate each candidate); merge it with another or drop it"
        )
    y = np.asarray(y, dtype=np.float64)
    if np.ptp(y) == 0:
        raise DataValidationError(
            f"client {client!r}: target {target!r} is constant (every value is {y[0]:g}); SEC "
            "compares regression fits and needs a varying response; drop this learner"
        )


@register_model
class SECModel(FederatedModel):
    """The client half of SEC. Not an EM model: it answers two queries and nothing else.

    ``client_query("select", payload)``: the candidates arrive as skops bytes
    (``payload["candidate/<k>"]``) with their names (``payload["candidate_names"]``, JSON);
    the learner runs :func:`select_model` on its (standardized) data, keeps the fitted model in
    its private state and replies ``model`` (skops bytes, uint8), ``e`` (in-sample MSE), ``n``,
    ``selected`` (index), ``cv_mse`` (validation MSE per candidate) and, when standardizing, its
    scaling constants ``x_mean``, ``x_scale`` (p-vectors), ``y_mean``, ``y_scale`` (so the
    server can express the model on the raw scale for prediction).

    ``client_query("exchange", payload)``: other learners' fitted models arrive as
    ``payload["model/<k>"]``; the learner replies ``loss`` (one MSE per model on its own
    data). Only models and scalar losses cross; samples never do.

    SEC does not use the federated EM loop: ``client_stats`` returns empty statistics,
    ``stat_shapes`` is empty and ``server_step`` returns its parameters unchanged.

    Parameters
    ----------
    standardize : bool
        Standardize X and y within each learner before fitting and evaluating (Section 5).
    """

    name = "sec"

    def __init__(self, standardize: bool = True):
        super().__init__(standardize=bool(standardize))
        self.standardize = bool(standardize)

    def _xy(self, data: ClientData):
        X = np.asarray(data.X, dtype=np.float64)
        if data.y is None:
            raise ValueError("SEC needs a target y on every learner")
        y = np.asarray(data.y, dtype=np.float64).reshape(-1)
        if self.standardize:
            return standardize_xy(X, y)
        return X, y, None, None, None, None

    # ---- EM hooks: unused ------------------------------------------------------------------
    def client_stats(self, params, data, state, rng, rows=None) -> ClientStep:
        """SEC has no sufficient statistics: an empty step (SEC does not run the EM loop)."""
        return ClientStep(Stats({}), int(data.n_samples), 0.0, dict(state))

    def stat_shapes(self, params: Params) -> dict[str, tuple[int, ...]]:
        return {}

    def server_step(self, S: Stats, params: Params, n_total: float) -> Params:
        return dict(params)

    # ---- the protocol ----------------------------------------------------------------------
    def client_query(self, name, payload, data, state, rng):
        if name == "select":
            return self._select(payload, data, state, rng)
        if name == "exchange":
            return self._exchange(payload, data, state)
        return super().client_query(name, payload, data, state, rng)

    def _select(self, payload, data, state, rng):
        check_learner("this learner", np.asarray(data.X), data.y)
        X, y, xm, xs, ym, ys = self._xy(data)
        names = json.loads(str(payload["candidate_names"]))
        blobs = _payload_models(payload, "candidate")
        if len(names) != len(blobs) or not blobs:
            raise ValueError(f"select: {len(blobs)} candidates for {len(names)} names")
        cands = []
        for nm, b in zip(names, blobs):
            est = loads_model(b)
            _check_regressor(nm, est)
            cands.append((nm, est))
        best, model, e, cv = select_model(X, y, cands, rng)
        blob = dumps_model(model)
        reply: dict[str, Any] = {
            "model": blob,
            "e": float(e),
            "n": int(X.shape[0]),
            "selected": int(best),
            "cv_mse": np.asarray(cv, dtype=np.float64),
        }
        if self.standardize:
            reply.update(x_mean=xm, x_scale=xs, y_mean=float(ym), y_scale=float(ys))
        new_state = dict(state)
        new_state["model"] = blob
        new_state["e"] = np.array(e)
        return reply, new_state

    def _exchange(self, payload, data, state):
        X, y, *_ = self._xy(data)
        models = [loads_model(b) for b in _payload_models(payload, "model")]
        P = predict_many(models, X)
        loss = np.mean((y[None, :] - P) ** 2, axis=1)
        return {"loss": loss}, state


# ---------------------------------------------------------------------------------------------
# The estimator
# ---------------------------------------------------------------------------------------------
def _parallel_calls(runtime: Runtime, jobs: list[tuple[str, dict[str, Any]]], n_jobs):
    """The replies to (client, message) jobs: serially in waves of one message per client
    (one ``runtime.call`` each), or one call per job in joblib threads when ``n_jobs`` != 1.

    Returns the replies in the order of ``jobs``; a client that does not answer raises.
    """
    def one(cid, msg):
        rep = runtime.call([cid], "query", {cid: msg})
        if cid not in rep:
            raise RuntimeError(f"client {cid!r} did not answer the SEC {msg['query']!r} query")
        return rep[cid]

    if n_jobs in (None, 1) or len(jobs) <= 1:
        # waves of one message per client: one runtime call (one network exchange on Flower,
        # where the learners work in parallel) per wave
        out: list[Any] = [None] * len(jobs)
        todo = list(range(len(jobs)))
        while todo:
            wave: dict[str, int] = {}
            for i in todo:
                wave.setdefault(jobs[i][0], i)
            rep = runtime.call(list(wave), "query", {c: jobs[i][1] for c, i in wave.items()})
            for c, i in wave.items():
                if c not in rep:
                    raise RuntimeError(
                        f"client {c!r} did not answer the SEC {jobs[i][1]['query']!r} query")
                out[i] = rep[c]
            done = set(wave.values())
            todo = [i for i in todo if i not in done]
        return out
    from joblib import Parallel, delayed

    return Parallel(n_jobs=n_jobs, prefer="threads")(delayed(one)(c, m) for c, m in jobs)


@register_estimator(
    "sec", target=True,
    description="SEC: meta clustering of learners by select-exchange-cluster (Ye et al.)",
)
class SEC:
    """Meta clustering of learners by Select-Exchange-Cluster.

    Parameters
    ----------
    candidates : None, str, list or dict
        Candidate regressors of the Select step. None: LassoCV (half-half CV for its penalty,
        30 penalties) and a random forest of 50 trees of depth 3 (Simulation 1). A name of
        :data:`CANDIDATE_SETS` or :data:`BUILTIN_CANDIDATES`, a list of names and/or
        scikit-learn regressors (pipelines too), a dict ``{name: regressor}``, or a dict
        ``{client_id: any of the above}`` when learners differ (clients not listed use the
        default). Unfitted candidates travel to the learners as skops bytes. Instance-based
        regressors (KNN, SVR, kernel ridge, GP) carry training samples inside the fitted model;
        a warning says so when they are used.
    n_clusters : int or None
        K. None: chosen by ``k_selection``.
    k_selection : {"gap", "penalty"}
        Gap statistic (default; Tibshirani's rule) or the penalty ``W_K + K * lambda_n`` of
        Remark 2, both on the eigenvalue-weighted spectral embedding
        (:func:`selection_embedding`). The gap statistic misses three or more equidistant
        clusters (see :func:`gap_statistic`); the penalty finds them.
    max_clusters : int
        Largest K considered when K is chosen (also at most ``max(2, L // 2)``).
    affinity_scale : "auto" or float
        ``a`` in ``S = exp(-a V)``. "auto": ``1 / median`` of the off-diagonal dissimilarities
        (:func:`auto_affinity_scale`).
    standardize : bool
        Standardize X and y within each learner (Section 5). Turn off when the learners'
        response levels are the signal (the fairness example: standardizing y removes the
        learner-level intercept ``b R_i``).
    penalty : float or None
        ``lambda_n`` for ``k_selection="penalty"``. None: ``L / mean(n_i)`` (Remark 2 suggests
        ``lambda_n = O(max(1/n, u_n^4))`` per learner; the dispersion sums over L learners).
    n_init : int
        k-means restarts.
    n_refs : int
        Reference data sets of the gap statistic.
    gap_rule : {"tibshirani", "global"}
        Rule of the gap statistic (:func:`gap_statistic`). "global" suits learners spread along
        a continuum (the fairness example), where Tibshirani's rule often stops at K = 1.
    n_jobs : int or None
        Threads for the Select and Exchange queries (joblib, one runtime call per learner);
        None or 1: serial. In process the work is mostly GIL-bound (benchmarks/bench_sec.py
        measures threads 1.3-2.3x slower); a runtime whose learners are remote gains from it.
    exchange_batch : int
        Models per exchange message.
    random_state : int, Generator or None

    Attributes
    ----------
    learner_ids_ : list of str
    labels_ : ndarray of shape (L,)
    n_clusters_ : int
    dissimilarity_ : ndarray of shape (L, L)
        V, eq. (2).
    similarity_ : ndarray of shape (L, L)
        S = exp(-a V).
    affinity_scale_ : float
    eigenvalues_ : ndarray of shape (L,)
        Eigenvalues of the normalized affinity, largest first.
    embedding_ : ndarray of shape (L, n_clusters_)
        Row-normalized top eigenvectors (Algorithm 1, step 2c).
    exchange_losses_ : ndarray of shape (L, L)
        ``E[i, j] = e_{i->j}``.
    errors_ : ndarray of shape (L,)
        In-sample MSE ``e_i`` of each learner's selected model.
    n_samples_ : ndarray of shape (L,)
    selected_ : list of str
        Name of the candidate each learner selected.
    cv_mse_ : ndarray of shape (L, n_candidates) (NaN-padded when learners differ)
    models_ : list of ndarray (uint8)
        Each learner's fitted model as skops bytes.
    k_selection_info_ : dict
        Per-K dispersion and gap (or penalized objective), when K was chosen.

    References
    ----------
    Ye, Ghanadan and Ding, "Meta Clustering for Collaborative Learning" (2023), Section 3:
    Select eq. (1), Exchange eq. (2), Cluster Algorithm 1, K by Remark 2, prediction eq. (4).
    """

    def __init__(
        self,
        candidates: Any = None,
        n_clusters: int | None = None,
        k_selection: str = "gap",
        max_clusters: int = 10,
        affinity_scale: str | float = "auto",
        standardize: bool = True,
        penalty: float | None = None,
        n_init: int = 10,
        n_refs: int = 20,
        gap_rule: str = "tibshirani",
        n_jobs: int | None = None,
        exchange_batch: int = 64,
        random_state: Any = None,
    ):
        self.candidates = candidates
        self.n_clusters = n_clusters
        self.k_selection = k_selection
        self.max_clusters = max_clusters
        self.affinity_scale = affinity_scale
        self.standardize = standardize
        self.penalty = penalty
        self.n_init = n_init
        self.n_refs = n_refs
        self.gap_rule = gap_rule
        self.n_jobs = n_jobs
        self.exchange_batch = exchange_batch
        self.random_state = random_state

    # ---- validation --------------------------------------------------------------------------
    def _validate_params(self) -> None:
        if self.gap_rule not in ("tibshirani", "global"):
            raise ValueError(f"gap_rule must be 'tibshirani' or 'global', got {self.gap_rule!r}")
        if self.k_selection not in ("gap", "penalty"):
            raise ValueError(f"k_selection must be 'gap' or 'penalty', got {self.k_selection!r}")
        if self.n_clusters is not None and (
            not isinstance(self.n_clusters, int | np.integer) or self.n_clusters < 1
        ):
            raise ValueError(
                f"n_clusters must be a positive integer or None, got {self.n_clusters!r}"
            )
        if not isinstance(self.max_clusters, int | np.integer) or self.max_clusters < 1:
            raise ValueError(f"max_clusters must be a positive integer, got {self.max_clusters!r}")
        if isinstance(self.affinity_scale, str):
            if self.affinity_scale != "auto":
                raise ValueError(
                    "affinity_scale must be 'auto' or a positive number, "
                    f"got {self.affinity_scale!r}"
                )
        elif not (float(self.affinity_scale) > 0):
            raise ValueError(f"affinity_scale must be positive, got {self.affinity_scale!r}")
        if self.penalty is not None and not float(self.penalty) >= 0:
            raise ValueError(f"penalty must be non-negative, got {self.penalty!r}")
        for nm in ("n_init", "n_refs", "exchange_batch"):
            v = getattr(self, nm)
            if not isinstance(v, int | np.integer) or v < 1:
                raise ValueError(f"{nm} must be a positive integer, got {v!r}")

    def _is_per_learner(self, cids: list[str]) -> bool:
        spec = self.candidates
        return isinstance(spec, Mapping) and bool(spec) and all(str(k) in set(cids) for k in spec)

    def _common_spec(self, cids: list[str]) -> Any:
        """The candidate spec of learners without their own (the default when per-learner)."""
        return None if self._is_per_learner(cids) else self.candidates

    def _per_learner(self, cids: list[str]) -> dict[str, list[tuple[str, Any]]]:
        per: dict[str, Any] = {}
        if self._is_per_learner(cids):
            per = {str(k): v for k, v in self.candidates.items()}
        common = make_candidates(self._common_spec(cids))
        out = {c: (make_candidates(per[c]) if c in per else common) for c in cids}
        mem = sorted({type(_final(e)).__name__ for lst in out.values() for _, e in lst
                      if type(_final(e)).__name__ in _MEMORIZING})
        if mem:
            warnings.warn(
                f"candidates {mem} store training samples inside the fitted model; shipping "
                "such a model in the Exchange step ships samples", UserWarning, stacklevel=3,
            )
        return out

    def _describe_local(self, fd: FederatedDataset) -> dict:
        """A node's checks of its own learner data (a deployment)."""
        self._validate_params()
        for cid, cd in fd.items():
            check_learner(cid, cd.X, cd.y, fd.target_name or "y")
        return {}

    def _validate_data(self, fd: FederatedDataset) -> None:
        remote = getattr(fd, "is_remote", False)
        if not isinstance(fd, FederatedDataset) and not remote:
            raise TypeError(
                f"fit expects a fl.FederatedDataset, got {type(fd).__name__}; build one with "
                "FederatedDataset.from_pandas or from_arrays"
            )
        if not remote:  # on a RemoteDataset every node ran check_learner (_describe_local)
            for cid, cd in fd.items():
                check_learner(cid, cd.X, cd.y, fd.target_name or "y")
        L = fd.n_clients
        if L < 2:
            raise DataValidationError(f"SEC clusters learners and needs at least 2, got {L}")
        if self.n_clusters is not None and self.n_clusters > L:
            raise ValueError(
                f"n_clusters={self.n_clusters} is larger than the number of learners ({L}); "
                f"give n_clusters <= {L} or None to choose K from the data"
            )

    # ---- protocol steps ----------------------------------------------------------------------
    def _setup(self, runtime: Runtime, cids: list[str]) -> SECModel:
        model = SECModel(standardize=bool(self.standardize))
        setup_clients(runtime, model)
        return model

    def _run_select(self, runtime, cids, cands, seed) -> dict[str, dict[str, Any]]:
        encoded: dict[int, dict[str, Any]] = {}
        jobs = []
        for c in cids:
            lst = cands[c]
            key = id(lst)
            if key not in encoded:
                msg: dict[str, Any] = {"query": "select", "seed": int(seed),
                                       "candidate_names": json.dumps([n for n, _ in lst])}
                for k, (_, est) in enumerate(lst):
                    msg[f"candidate/{k}"] = dumps_model(est)
                encoded[key] = msg
            jobs.append((c, encoded[key]))
        replies = _parallel_calls(runtime, jobs, self.n_jobs)
        out = {}
        for c, rep in zip(cids, replies):
            for key in ("model", "e", "n", "selected", "cv_mse"):
                if key not in rep:
                    raise RuntimeError(f"client {c!r}: select reply misses {key!r}")
            if not np.isfinite(float(rep["e"])):
                raise RuntimeError(f"client {c!r}: in-sample MSE is not finite")
            out[c] = rep
        return out

    def _run_exchange(self, runtime, receivers, blobs, seed) -> np.ndarray:
        """``E[i, j]``: loss of model i on receiver j (one message per receiver and batch)."""
        m = len(blobs)
        bsz = int(self.exchange_batch)
        jobs, where = [], []
        for j, c in enumerate(receivers):
            for s in range(0, m, bsz):
                msg = {"query": "exchange", "seed": int(seed), "offset": s}
                for k in range(s, min(s + bsz, m)):
                    msg[f"model/{k - s}"] = blobs[k]
                jobs.append((c, msg))
                where.append((j, s))
        replies = _parallel_calls(runtime, jobs, self.n_jobs)
        E = np.empty((m, len(receivers)))
        for (j, s), (c, _), rep in zip(where, jobs, replies):
            loss = np.asarray(rep.get("loss"), dtype=np.float64).reshape(-1)
            want = min(s + bsz, m) - s
            if loss.shape[0] != want or not np.all(np.isfinite(loss)):
                raise RuntimeError(
                    f"client {c!r}: exchange reply has {loss.shape[0]} losses (expected {want}) "
                    "or non-finite values"
                )
            E[s : s + want, j] = loss
        return E

    # ---- fit ---------------------------------------------------------------------------------
    def fit(self, fd: FederatedDataset, *, runtime: Runtime | None = None) -> SEC:
        """Run Select, Exchange and Cluster on the learners of ``fd``.

        Parameters
        ----------
        fd : FederatedDataset
            One client per learner, with a target.
        runtime : Runtime or None
            Transport to the learners; default: in-process learners built from ``fd``.

        Returns
        -------
        self
        """
        from ..engine.inprocess import InProcessRuntime

        self._validate_params()
        self._validate_data(fd)
        seed = resolve_seed(self.random_state)
        cids = fd.client_ids
        cands = self._per_learner(cids)
        runtime = runtime if runtime is not None else InProcessRuntime(fd)
        self._setup(runtime, cids)
        sel = self._run_select(runtime, cids, cands, seed)
        blobs = [np.asarray(sel[c]["model"], dtype=np.uint8) for c in cids]
        E = self._run_exchange(runtime, cids, blobs, seed)
        e = np.array([float(sel[c]["e"]) for c in cids])

        self.seed_ = seed
        self.learner_ids_ = list(cids)
        self.feature_names_in_ = list(fd.feature_names)
        self.n_features_in_ = fd.n_features
        self.models_ = blobs
        self.errors_ = e
        self.n_samples_ = np.array([int(sel[c]["n"]) for c in cids])
        self.selected_ = [cands[c][int(sel[c]["selected"])][0] for c in cids]
        width = max(len(cands[c]) for c in cids)
        self.cv_mse_ = np.full((len(cids), width), np.nan)
        for i, c in enumerate(cids):
            cv = np.asarray(sel[c]["cv_mse"], dtype=np.float64)
            self.cv_mse_[i, : cv.size] = cv
        self.candidate_names_ = [n for n, _ in cands[cids[0]]]
        if self.standardize:
            self.scalers_ = {c: (np.asarray(sel[c]["x_mean"], dtype=np.float64),
                                 np.asarray(sel[c]["x_scale"], dtype=np.float64),
                                 float(sel[c]["y_mean"]), float(sel[c]["y_scale"])) for c in cids}
        else:
            self.scalers_ = {}
        self.exchange_losses_ = E
        self._cluster(E, e, seed)
        return self

    def _cluster(self, E: np.ndarray, e: np.ndarray, seed: int) -> None:
        V = dissimilarity(E, e)
        a = auto_affinity_scale(V) if self.affinity_scale == "auto" else float(self.affinity_scale)
        S = affinity(V, a)
        L = S.shape[0]
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0x5EC,)))
        info: dict[str, Any] = {}
        if self.n_clusters is not None:
            k = int(self.n_clusters)
        else:
            # at most L/2 clusters: beyond, clusters are mostly singletons and the dispersion
            # of k-means on L points carries no information (W_L = 0 for data and references)
            kmax = min(int(self.max_clusters), max(2, L // 2))
            Y = selection_embedding(S, kmax)
            if self.k_selection == "gap":
                k, info = gap_statistic(Y, kmax, self.n_refs, self.n_init, rng, self.gap_rule)
            else:
                lam = (L / float(np.mean(self.n_samples_)) if self.penalty is None
                       else float(self.penalty))
                k, info = penalty_selection(Y, kmax, lam, self.n_init, rng)
        labels, U, w = spectral_clustering(S, k, self.n_init, rng)
        self.dissimilarity_ = V
        self.affinity_scale_ = float(a)
        self.similarity_ = S
        self.eigenvalues_ = w
        self.embedding_ = U
        self.labels_ = labels
        self.n_clusters_ = int(np.unique(labels).size)
        self.k_selection_info_ = info

    # ---- persistence (no pickle) ---------------------------------------------------------------
    _array_attrs = ("errors_", "n_samples_", "cv_mse_", "exchange_losses_", "dissimilarity_",
                    "similarity_", "eigenvalues_", "embedding_", "labels_")

    def save(self, path) -> None:
        """Write ``<path>.npz`` (arrays, the learners' skops bytes) and ``<path>.json``."""
        from ..engine.checkpoint import save_arrays_json
        from ..engine.registry import estimator_config

        self._check_fitted()
        arrays = {k: np.asarray(getattr(self, k)) for k in self._array_attrs}
        for i, b in enumerate(self.models_):
            arrays[f"models/{i}"] = np.asarray(b, dtype=np.uint8)
        for c, (m, sc, ym, ys) in self.scalers_.items():
            arrays[f"scalers/{c}/x_mean"] = m
            arrays[f"scalers/{c}/x_scale"] = sc
            arrays[f"scalers/{c}/y"] = np.array([ym, ys])
        info = {}
        for k, v in self.k_selection_info_.items():
            if isinstance(v, np.ndarray):
                arrays[f"kinfo/{k}"] = v
            else:
                info[k] = v.item() if hasattr(v, "item") else v
        try:
            params = estimator_config(self)[1]
        except ValueError:  # candidates given as objects: keep the names only
            params = {"candidates": None}
        meta = {
            "class": "SEC", "params": params, "k_selection_info": info,
            "fitted": {"seed_": int(self.seed_), "learner_ids_": list(self.learner_ids_),
                       "feature_names_in_": list(self.feature_names_in_),
                       "selected_": list(self.selected_),
                       "candidate_names_": list(self.candidate_names_),
                       "affinity_scale_": float(self.affinity_scale_),
                       "n_clusters_": int(self.n_clusters_)},
        }
        save_arrays_json(path, arrays, meta)

    @classmethod
    def load(cls, path) -> SEC:
        """Read what :meth:`save` wrote."""
        from ..engine.checkpoint import load_arrays_json

        arrays, meta = load_arrays_json(path)
        if meta.get("class") != "SEC":
            raise ValueError(f"{path} holds a {meta.get('class')}, not a SEC")
        est = cls(**{k: v for k, v in meta["params"].items() if k != "federation"})
        for k in cls._array_attrs:
            setattr(est, k, arrays[k])
        for k, v in meta["fitted"].items():
            setattr(est, k, v)
        est.n_features_in_ = len(est.feature_names_in_)
        n = len(est.learner_ids_)
        est.models_ = [arrays[f"models/{i}"] for i in range(n)]
        est.scalers_ = {}
        for c in est.learner_ids_:
            if f"scalers/{c}/y" in arrays:
                y = arrays[f"scalers/{c}/y"]
                est.scalers_[c] = (arrays[f"scalers/{c}/x_mean"], arrays[f"scalers/{c}/x_scale"],
                                   float(y[0]), float(y[1]))
        info = dict(meta["k_selection_info"])
        info.update({k[6:]: v for k, v in arrays.items() if k.startswith("kinfo/")})
        est.k_selection_info_ = info
        return est

    # ---- use ---------------------------------------------------------------------------------
    def _check_fitted(self) -> None:
        if not hasattr(self, "labels_"):
            raise NotFittedError("this SEC is not fitted yet; call fit(fd) before using it")

    @property
    def selected_models_(self) -> dict[str, Any]:
        """Each learner's fitted model (loaded from its skops bytes), by learner id."""
        self._check_fitted()
        return {c: loads_model(b) for c, b in zip(self.learner_ids_, self.models_)}

    def clusters(self) -> dict[int, list[str]]:
        """Cluster label -> learner ids."""
        self._check_fitted()
        return {int(k): [c for c, lab in zip(self.learner_ids_, self.labels_) if lab == k]
                for k in np.unique(self.labels_)}

    def _raw_predictions(self, X: np.ndarray, members: list[int], scale_of: str | None):
        """Predictions of the members' models on the raw scale: each model with its own
        learner's scaling, or all with learner ``scale_of``'s scaling."""
        models = [loads_model(self.models_[i]) for i in members]
        if not self.standardize:
            return predict_many(models, X)
        if scale_of is not None:
            xm, xs, ym, ys = self.scalers_[scale_of]
            return ym + ys * predict_many(models, (X - xm) / xs)
        out = np.empty((len(members), X.shape[0]))
        for r, (i, m) in enumerate(zip(members, models)):
            xm, xs, ym, ys = self.scalers_[self.learner_ids_[i]]
            out[r] = ym + ys * predict_many([m], (X - xm) / xs)[0]
        return out

    def predict(self, X, learner: str | None = None, cluster: int | None = None,
                pooled: bool = False) -> np.ndarray:
        """Collaborative prediction within a cluster.

        Parameters
        ----------
        X : array-like of shape (n_samples, n_features)
        learner : str, optional
            Predict for this learner: its cluster's models, applied the way the learner applies
            received models (on X standardized with its own constants, back on its y scale).
        cluster : int, optional
            Predict with this cluster's models, each on its own learner's raw scale.
        pooled : bool
            Use the cluster's model refitted on pooled data (:meth:`fit_pooled`) instead of
            eq. (4); only where pooling the learners' data is allowed.

        Returns
        -------
        ndarray of shape (n_samples,)
            Eq. (4): the sample-size weighted average of the cluster's models.
        """
        self._check_fitted()
        if (learner is None) == (cluster is None):
            raise ValueError("give exactly one of learner=... or cluster=...")
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X must have shape (n_samples, {self.n_features_in_}), got {X.shape}"
            )
        if learner is not None:
            learner = str(learner)
            if learner not in self.learner_ids_:
                raise ValueError(f"unknown learner {learner!r}; known: {self.learner_ids_[:5]}...")
            cluster = int(self.labels_[self.learner_ids_.index(learner)])
        cluster = int(cluster)
        if cluster not in set(int(k) for k in self.labels_):
            raise ValueError(f"unknown cluster {cluster}; clusters are 0..{self.n_clusters_ - 1}")
        if pooled:
            if not hasattr(self, "pooled_models_"):
                raise NotFittedError("pooled=True needs fit_pooled(fd) first")
            return np.asarray(self.pooled_models_[cluster].predict(X), dtype=np.float64)
        members = [i for i, lab in enumerate(self.labels_) if lab == cluster]
        P = self._raw_predictions(X, members, learner if self.standardize else None)
        return weighted_prediction(P, self.n_samples_[members])

    def fit_pooled(self, fd: FederatedDataset, estimator: Any = None) -> SEC:
        """Fit one model per cluster on the pooled data of its learners (Remark 3, case 2).

        This moves samples to one place: use it only where pooling is allowed. ``estimator``
        None selects among the candidates by half-half cross-validation on the pooled data.
        """
        from sklearn.base import clone

        self._check_fitted()
        rng = np.random.default_rng(np.random.SeedSequence(self.seed_, spawn_key=(0x9001,)))
        self.pooled_models_ = {}
        for k, members in self.clusters().items():
            X = np.vstack([fd[c].X for c in members])
            y = np.concatenate([np.asarray(fd[c].y, dtype=np.float64) for c in members])
            if estimator is None:
                cands = make_candidates(self._common_spec(self.learner_ids_))
                _, model, _, _ = select_model(X, y, cands, rng)
            else:
                model = clone(estimator).fit(X, y)
            self.pooled_models_[k] = model
        return self

    def assign(self, new_fd: FederatedDataset, runtime: Runtime | None = None) -> np.ndarray:
        """Place new learners in the fitted clusters (largest summed similarity, Section 4).

        The new learners run Select with the common candidates and evaluate every fitted
        learner's model on their data (``e_{i->t}``). If ``runtime`` reaches the fitted learners
        (for example ``InProcessRuntime(fd)`` or the runtime given to :meth:`fit`), the new
        models are also sent to them (``e_{t->i}``) and ``v_ti`` is eq. (2); otherwise the
        missing direction is replaced by the available one, ``v_ti = 2 |e_{i->t} - e_t|``.

        Parameters
        ----------
        new_fd : FederatedDataset
        runtime : Runtime or None

        Returns
        -------
        labels : ndarray of shape (n_new_learners,)
            In ``new_fd.client_ids`` order. ``assign_similarity_`` holds the (n_new, L)
            similarities to the fitted learners.
        """
        from ..engine.inprocess import InProcessRuntime

        self._check_fitted()
        if not isinstance(new_fd, FederatedDataset):
            raise TypeError(f"assign expects a fl.FederatedDataset, got {type(new_fd).__name__}")
        if new_fd.n_features != self.n_features_in_:
            raise DataValidationError(
                f"new learners have {new_fd.n_features} features; the fitted learners had "
                f"{self.n_features_in_}"
            )
        for cid, cd in new_fd.items():
            check_learner(cid, cd.X, cd.y, new_fd.target_name or "y")
        new_ids = new_fd.client_ids
        rt_new = InProcessRuntime(new_fd)
        self._setup(rt_new, new_ids)
        common = make_candidates(self._common_spec(self.learner_ids_))
        sel = self._run_select(rt_new, new_ids, {c: common for c in new_ids}, self.seed_ + 1)
        e_new = np.array([float(sel[c]["e"]) for c in new_ids])
        E_to_new = self._run_exchange(rt_new, new_ids, self.models_, self.seed_)  # (L, T)
        D1 = np.abs(E_to_new - e_new[None, :]).T  # (T, L): |e_{i->t} - e_t|
        if runtime is not None:
            blobs = [np.asarray(sel[c]["model"], dtype=np.uint8) for c in new_ids]
            self._setup(runtime, self.learner_ids_)
            E_from_new = self._run_exchange(runtime, self.learner_ids_, blobs, self.seed_)  # (T, L)
            V = D1 + np.abs(E_from_new - self.errors_[None, :])
        else:
            V = 2.0 * D1
        S = affinity(V, self.affinity_scale_)
        ks = np.unique(self.labels_)
        score = np.stack([S[:, self.labels_ == k].sum(1) for k in ks], axis=1)
        self.assign_similarity_ = S
        return ks[score.argmax(1)]


def _final(est: Any) -> Any:
    """The last step of a pipeline (the estimator itself otherwise)."""
    steps = getattr(est, "steps", None)
    return steps[-1][1] if steps else est
