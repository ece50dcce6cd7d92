"""Checks of a loaded model's fitted arrays, for the estimators' ``_check_loaded`` hooks.

:meth:`FederatedEstimator.load <fedlatent.engine.estimation.estimator.FederatedEstimator.load>`
checks what every model shares (the saved arrays are the expected ones, plain numbers, finite); each
estimator's ``_check_loaded`` then states its own invariants with these functions: shapes
consistent with the saved settings, weights on the simplex, matrices positive definite,
values positive, labels in range. Checks of one model family live in that model's package.
Each raises ValueError naming the field; ``load`` adds the file.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "check_saved",
    "expect_labels",
    "expect_pd",
    "expect_positive",
    "expect_shape",
    "expect_simplex",
]

def _get(est, name: str) -> np.ndarray:
    return np.asarray(getattr(est, name))


def expect_shape(est, name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The field ``name`` of ``est``, which must have ``shape``."""
    a = _get(est, name)
    if a.shape != tuple(int(s) for s in shape):
        raise ValueError(f"field {name!r} has shape {a.shape}, the saved settings need "
                         f"{tuple(shape)}")
    return a


def expect_simplex(est, name: str, atol: float = 1e-6) -> None:
    """Non-negative weights summing to 1 (within ``atol``) along the last axis."""
    a = _get(est, name)
    if np.any(a < 0):
        raise ValueError(f"field {name!r} has negative weights ({a.min():.6g}); weights are "
                         "probabilities")
    total = a.sum(axis=-1)
    if np.any(np.abs(total - 1.0) > atol):
        raise ValueError(f"field {name!r} does not sum to 1 (sum {np.ravel(total)[0]:.12g}); "
                         "weights are probabilities")


def expect_positive(est, name: str, *, strict: bool = True) -> None:
    """Values > 0 (``strict``) or >= 0."""
    a = _get(est, name)
    bad = a <= 0 if strict else a < 0
    if np.any(bad):
        raise ValueError(f"field {name!r} has values {'<=' if strict else '<'} 0 "
                         f"({a[bad].ravel()[0]:.6g}); they must be {'>' if strict else '>='} 0")


def expect_pd(est, name: str) -> None:
    """Symmetric positive definite matrices (the last two axes): Cholesky must succeed."""
    a = _get(est, name)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"field {name!r} of shape {a.shape} is not a stack of square matrices")
    sym = np.abs(a - np.swapaxes(a, -1, -2)).max(initial=0.0)
    if sym > 1e-6 * max(1.0, np.abs(a).max(initial=0.0)):
        raise ValueError(f"field {name!r} is not symmetric (asymmetry {sym:.3g})")
    try:
        np.linalg.cholesky(a)
    except np.linalg.LinAlgError:
        raise ValueError(f"field {name!r} is not positive definite (its Cholesky factorization "
                         "fails)") from None


def expect_labels(est, name: str, n: int, *, low: int = 0) -> None:
    """Integer labels in ``[low, n)``."""
    a = _get(est, name)
    if a.dtype.kind not in "iu":
        raise ValueError(f"field {name!r} holds {a.dtype} values, not integer labels")
    if a.size and (a.min() < low or a.max() >= n):
        raise ValueError(f"field {name!r} has labels outside [{low}, {n - 1}] "
                         f"(min {a.min()}, max {a.max()})")


#: the fitted attributes a saved model's JSON may set (``n_rounds_``: files before ``n_iter_``)
_FITTED = {"n_iter_": int, "n_rounds_": int, "converged_": bool, "seed_": int,
           "feature_names_in_": list, "client_ids_": list}


def check_saved(cls, arrays: dict[str, np.ndarray], meta: dict, npz, js) -> None:
    """What every saved model must satisfy before an estimator is built from it: the arrays
    are exactly ``cls._save_arrays``, plain numbers (text only in the fields of
    ``cls._load_text``: ids, class labels; never objects), finite (except the fields in
    ``cls._load_nonfinite``); the JSON's fitted fields are the known ones with the
    right types. ValueError naming the file and the field otherwise."""
    want = set(cls._save_arrays)
    missing = sorted(want - set(arrays))
    if missing:
        raise ValueError(f"{npz}: array(s) {missing} are missing (a {cls.__name__} saves "
                         f"{sorted(want)})")
    extra = sorted(set(arrays) - want)
    if extra:
        raise ValueError(f"{npz}: unexpected array(s) {extra[:5]} (a {cls.__name__} saves "
                         f"{sorted(want)})")
    text = set(getattr(cls, "_load_text", ()))
    for name, a in arrays.items():
        kinds, what = ("biufU", "numbers or text") if name in text else ("biuf", "numbers")
        if a.dtype.kind not in kinds:
            raise ValueError(f"{npz}: field {name!r} has dtype {a.dtype}, not {what} (a "
                             f"{cls.__name__} saves {what} there); the file was edited or is "
                             "not this model's")
        if a.dtype.kind in "fc" and name not in cls._load_nonfinite and \
                not np.all(np.isfinite(a)):
            raise ValueError(f"{npz}: field {name!r} has NaN or infinite values")
    for key in ("params", "fitted", "history"):
        if not isinstance(meta.get(key), dict if key != "history" else list):
            raise ValueError(f"{js}: entry {key!r} is missing or malformed")
    for key, value in meta["fitted"].items():
        typ = _FITTED.get(key)
        if typ is None:
            raise ValueError(f"{js}: unknown fitted field {key!r} (known: {sorted(_FITTED)})")
        ok = isinstance(value, typ) and (typ is not int or not isinstance(value, bool))
        if not ok or (typ is list and not all(isinstance(v, str) for v in value)):
            raise ValueError(f"{js}: fitted field {key!r} is {value!r}, not a "
                             f"{'list of str' if typ is list else typ.__name__}")
    if "feature_names_in_" not in meta["fitted"]:
        raise ValueError(f"{js}: fitted field 'feature_names_in_' is missing")
