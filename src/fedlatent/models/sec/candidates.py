"""SEC's Select step: the candidate regressors and the choice among them (eq. 1).

Candidates are scikit-learn regressors (or pipelines ending in one), named by
:data:`BUILTIN_CANDIDATES` and grouped in :data:`CANDIDATE_SETS`; :func:`make_candidates` resolves
a specification, :func:`select_model` runs half-half cross-validation on one learner's data.

References
----------
Ye, Ghanadan and Ding, "Meta Clustering for Collaborative Learning" (2023), Section 3, eq. (1).
"""

from __future__ import annotations

import importlib
import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

__all__ = [
    "BUILTIN_CANDIDATES",
    "CANDIDATE_SETS",
    "common_spec",
    "make_candidates",
    "per_learner_candidates",
    "select_model",
    "standardize_xy",
]

logger = logging.getLogger(__name__)


def _construct(module: str, name: str, **params: Any) -> Any:
    """A fresh, unfitted ``module.name(**params)`` (scikit-learn is imported on first use)."""
    return getattr(importlib.import_module(module), name)(**params)


#: Built-in candidate regressors by name (a fresh unfitted estimator per call).
BUILTIN_CANDIDATES: dict[str, Callable[[], Any]] = {
    # "LASSO with built-in half-half cross-validation to select the tuning parameter" (Sec. 5.1)
    "lasso_cv": partial(_construct, "sklearn.linear_model", "LassoCV", cv=2, alphas=30),
    "rf": partial(_construct, "sklearn.ensemble", "RandomForestRegressor", n_estimators=50,
                  max_depth=3),
    "linear": partial(_construct, "sklearn.linear_model", "LinearRegression"),
    "ridge": partial(_construct, "sklearn.linear_model", "RidgeCV"),
    "enet": partial(_construct, "sklearn.linear_model", "ElasticNetCV", cv=2, alphas=30),
    "lars": partial(_construct, "sklearn.linear_model", "LarsCV", cv=2),
    "knn": partial(_construct, "sklearn.neighbors", "KNeighborsRegressor"),
    "svr": partial(_construct, "sklearn.svm", "SVR"),
    "gb": partial(_construct, "sklearn.ensemble", "GradientBoostingRegressor", n_estimators=50,
                  max_depth=3),
    "mlp": partial(_construct, "sklearn.neural_network", "MLPRegressor",
                   hidden_layer_sizes=(32,), max_iter=300),
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



def _seed_estimator(est: Any, rng: np.random.Generator) -> Any:
    """Give every unset ``random_state`` (nested ones too) an integer drawn from ``rng``."""
    params = est.get_params(deep=True)
    upd = {k: int(rng.integers(2**31 - 1)) for k in sorted(params)
           if (k == "random_state" or k.endswith("__random_state")) and params[k] is None}
    if upd:
        est.set_params(**upd)
    return est


def standardize_xy(X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None):
    """Per-learner standardization of X (columns) and y (Section 5: "we standardize x and y"),
    with frequency weights the weighted means and standard deviations (a row of weight 2 as
    the row twice).

    Returns
    -------
    Xs, ys, x_mean, x_scale, y_mean, y_scale
        Constant columns get scale 1.
    """
    w = None if sample_weight is None else sample_weight / sample_weight.sum()
    xm = X.mean(0) if w is None else w @ X
    xs = X.std(0) if w is None else np.sqrt(w @ (X - xm) ** 2)
    xs = np.where(xs > 0, xs, 1.0)
    ym = float(y.mean() if w is None else w @ y)
    ys = float(y.std() if w is None else np.sqrt(w @ (y - ym) ** 2))
    ys = ys if ys > 0 else 1.0
    return (X - xm) / xs, (y - ym) / ys, xm, xs, ym, ys


#: the seed of candidates without their own ``random_state`` under ``split="systematic"``
SYSTEMATIC_SEED = 0


def select_model(
    X: np.ndarray, y: np.ndarray, candidates: Sequence[tuple[str, Any]], rng: np.random.Generator,
    split: str = "random", sample_weight: np.ndarray | None = None,
) -> tuple[int, Any, float, np.ndarray]:
    """Step 1 (Select): half-half cross-validation among candidates, refit on all data.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    y : ndarray of shape (n_samples,)
    candidates : list of (name, unfitted regressor)
    rng : Generator
        With ``split="random"``: draws the split and the seeds of candidates whose
        ``random_state`` is unset. Unused with ``split="systematic"``.
    split : {"random", "systematic"}
        "random": a random half split (the paper's eq. 1). "systematic": rows 0, 2, 4, ... fit
        and rows 1, 3, 5, ... validate (a systematic sample: both halves span the rows' order,
        e.g. every period of a time-ordered learner), and candidates without a
        ``random_state`` get :data:`SYSTEMATIC_SEED`; the learner's model is then a function
        of its data alone.
    sample_weight : ndarray of shape (n_samples,) or None
        Frequency weights: candidates are fitted with them (``sample_weight``; a candidate
        that does not take them is skipped, with a warning naming it) and every MSE is
        weighted. The half split still splits rows (a row and its weight go to one half), so
        the selection equals the duplicated rows' only in distribution; with one candidate the
        refit, ``e`` and the model are the duplicated rows' (to rounding).

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
    if split == "systematic":
        tr, te = np.arange(0, n, 2), np.arange(1, n, 2)
        rng = np.random.default_rng(SYSTEMATIC_SEED)
    elif split == "random":
        perm = rng.permutation(n)
        tr, te = perm[: n // 2], perm[n // 2 :]
    else:
        raise ValueError(f"split must be 'random' or 'systematic', got {split!r}")
    seeds = [int(s) for s in rng.integers(2**31 - 1, size=len(candidates))]
    cv = np.full(len(candidates), np.inf)
    for k, (name, cand) in enumerate(candidates):
        est = _seed_estimator(clone(cand), np.random.default_rng(seeds[k]))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _fit(est, X[tr], y[tr], None if sample_weight is None else sample_weight[tr])
                pred = np.asarray(est.predict(X[te]), dtype=np.float64).reshape(-1)
        except Exception as e:  # a candidate unable to fit this learner is skipped
            logger.warning("candidate %r failed on a half-split: %s", name, e)
            continue
        mse = _mse(y[te], pred, None if sample_weight is None else sample_weight[te])
        cv[k] = mse if np.isfinite(mse) else np.inf
    if not np.isfinite(cv).any():
        raise ValueError("no candidate could be fitted on this learner's data")
    best = int(np.argmin(cv))
    model = _seed_estimator(clone(candidates[best][1]), np.random.default_rng(seeds[best]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _fit(model, X, y, sample_weight)
    e = _mse(y, np.asarray(model.predict(X), dtype=np.float64).reshape(-1), sample_weight)
    return best, model, e, cv


#: folds of the learners' validation of collaboration (``collaboration="validated"``)
VALIDATION_FOLDS = 5


def out_of_fold(model: Any, X: np.ndarray, y: np.ndarray, split: str, rng: np.random.Generator,
                sample_weight: np.ndarray | None = None,
                n_folds: int = VALIDATION_FOLDS) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``model``'s settings (unfitted: :func:`sklearn.base.clone`) fitted ``n_folds`` times,
    each time without one fold of the rows, and every row predicted by the fit that did not
    see it: out-of-fold predictions, close to the error of the model fitted on all rows (a half
    split, as Select's, fits on half the rows and overstates it). Folds: row ``i`` in fold
    ``i % n_folds`` (``split="systematic"``), or a random assignment from ``rng``. Integer
    frequency weights count as repeated rows, each copy next to its row: a row of weight 3 may
    sit in up to three folds, so the result is that of the rows repeated.

    Returns
    -------
    rows, predictions, weights, folds : ndarrays (m,)
        The row of each (row, fold) pair that holds some of its weight, the prediction of the
        fit without that fold, the weight it holds there (each row once, weight 1, without
        integer weights) and the fold.
    """
    from sklearn.base import clone

    w = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    integer = w is not None and np.all(w == np.round(w)) and np.all(w >= 0)
    reps = w.astype(np.int64) if integer else np.ones(X.shape[0], dtype=np.int64)
    N = int(reps.sum())
    k = int(min(n_folds, max(N // 2, 2)))
    fold = np.arange(N) % k if split == "systematic" else rng.permutation(np.arange(N) % k)
    T = np.zeros((X.shape[0], k))  # each row's weight in each fold
    np.add.at(T, (np.repeat(np.arange(X.shape[0]), reps), fold), 1.0)
    if w is not None and not integer:
        T *= w[:, None]
    P = np.zeros_like(T)
    total = T.sum(axis=1)
    for f in range(k):
        train = total - T[:, f]
        keep = train > 0
        est = clone(model)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _fit(est, X[keep], y[keep], None if w is None else train[keep])
        held = T[:, f] > 0
        if held.any():
            P[held, f] = np.asarray(est.predict(X[held]), dtype=np.float64).reshape(-1)
    rows, folds = np.nonzero(T)
    return rows, P[rows, folds], T[rows, folds], folds


def _fit(est: Any, X: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None) -> None:
    """``est.fit`` with frequency weights passed as ``sample_weight`` (to a pipeline's last
    step); a candidate that does not take them raises TypeError."""
    if sample_weight is None:
        est.fit(X, y)
        return
    steps = getattr(est, "steps", None)
    key = f"{steps[-1][0]}__sample_weight" if steps else "sample_weight"
    est.fit(X, y, **{key: sample_weight})


def _mse(y: np.ndarray, pred: np.ndarray, sample_weight: np.ndarray | None) -> float:
    """Mean squared error, weighted by the frequency weights when given."""
    r2 = (y - pred) ** 2
    return float(np.mean(r2) if sample_weight is None else sample_weight @ r2
                 / sample_weight.sum())


def _final(est: Any) -> Any:
    """The last step of a pipeline (the estimator itself otherwise)."""
    steps = getattr(est, "steps", None)
    return steps[-1][1] if steps else est


def _is_per_learner(spec: Any, cids: Sequence[str]) -> bool:
    return isinstance(spec, Mapping) and bool(spec) and all(str(k) in set(cids) for k in spec)


def common_spec(spec: Any, cids: Sequence[str]) -> Any:
    """The candidate spec of learners without their own (the default when ``spec`` is a dict
    ``{client_id: spec}`` of learners ``cids``)."""
    return None if _is_per_learner(spec, cids) else spec


def per_learner_candidates(spec: Any, cids: Sequence[str], warn: bool = False
                           ) -> dict[str, list[tuple[str, Any]]]:
    """Each learner's candidates, ``{client: [(name, unfitted regressor), ...]}``.

    ``spec`` is what :func:`make_candidates` takes, or a dict ``{client_id: spec}`` (learners not
    listed get the default). Learners without their own share one list. With ``warn``, a
    UserWarning names candidates whose fitted models store training samples.
    """
    per: dict[str, Any] = {}
    if _is_per_learner(spec, cids):
        per = {str(k): v for k, v in spec.items()}
    common = make_candidates(common_spec(spec, cids))
    out = {c: (make_candidates(per[c]) if c in per else common) for c in cids}
    mem = sorted({type(_final(e)).__name__ for lst in out.values() for _, e in lst
                  if type(_final(e)).__name__ in _MEMORIZING})
    if mem and warn:
        warnings.warn(
            f"candidates {mem} store training samples inside the fitted model; shipping "
            "such a model in the Exchange step ships samples", UserWarning, stacklevel=6,
        )
    return out
