"""Bounding one record's contribution, and the L2 sensitivity of each model family's statistics.

Adjacency is add/remove one record (what the accountant assumes). At fixed broadcast parameters
``theta``, a client's statistic is a sum over its records of a per-record term
``t(x_i, y_i; theta)`` whose weights (responsibilities) depend on that record only; adding or
removing record ``i`` therefore moves the sum by exactly ``t(x_i, y_i)``, and the sensitivity is
``sup ||t||``. Replacing a record moves it by at most twice that (``REPLACE_ONE_FACTOR``).

Norms: L2 for vectors, Frobenius for matrices, the joint norm of a collection over all its
blocks (:func:`.mechanisms.joint_sensitivity` combines the per-block bounds returned here; they
hold simultaneously, so the combination is valid). ``a`` below is the bound on the norm of a
design row: ``||x - c|| <= R`` after :func:`clip_rows`, and ``a^2 = R^2 + 1`` with an intercept.

Where the unit is not a record: HLCR samples an entity's cluster label from the entity's whole
data, so one event can move the entity's entire statistics to another cluster; the unit there is
the entity, with its number of events capped (:func:`regression_sensitivity`'s
``records_per_unit``). Its within-agent prior (the agent's other entities' labels) also depends
on each entity, which this bound does not cover: the integration must treat labels as
post-processing of private releases or take the agent as the unit.

Frequency weights (:mod:`fedlatent.data.weights`): a record of weight ``w`` contributes ``w``
times its term, so the bounds here hold only for ``w <= 1``. Under differential privacy a
client whose weights exceed 1 refuses at setup (:func:`weights_refusal`): a weight-2 row is two
people, and their privacy needs a bound twice as large, which the calibration does not give.
Weights in ``[0, 1]`` only shrink each term and keep every bound.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = [
    "REPLACE_ONE_FACTOR",
    "center_from_sums",
    "center_sensitivity",
    "clip_rows",
    "clip_targets",
    "logistic_sensitivity",
    "regression_sensitivity",
    "weights_refusal",
]

#: the sensitivity under replace-one adjacency is at most this times the add/remove one
REPLACE_ONE_FACTOR = 2.0


def _radius(name: str, value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return value


def weights_refusal(weight: np.ndarray | None, client: str) -> str:
    """Why a client with these frequency weights cannot run under differential privacy ("" when
    it can): a weight above 1 would multiply that record's contribution beyond the bound the
    noise is calibrated to."""
    if weight is None or weight.size == 0 or float(weight.max()) <= 1.0:
        return ""
    n = int(np.count_nonzero(weight > 1.0))
    return (f"client {client!r} refuses differential privacy: {n} of its rows have a frequency "
            f"weight above 1 (largest {float(weight.max()):g}), and a record's contribution is "
            "bounded only for weights <= 1; fit without privacy, or give weights in [0, 1]")


def clip_rows(X: np.ndarray, radius: float, center: np.ndarray | None = None) -> np.ndarray:
    """Project every row onto the L2 ball of ``radius`` around ``center``.

    Parameters
    ----------
    X : ndarray of shape (n_samples, n_features)
    radius : float
        ``R > 0``.
    center : ndarray of shape (n_features,) or None
        A public (or privately estimated) centre; ``None`` is the origin. The statistics'
        sensitivities below hold for statistics centred at this same point.

    Returns
    -------
    ndarray of shape (n_samples, n_features)
        ``c + (x - c) * min(1, R / ||x - c||)``; rows inside the ball are unchanged.
    """
    R = _radius("radius", radius)
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D (n_samples, n_features), got shape {X.shape}")
    c = np.zeros(X.shape[1]) if center is None else np.asarray(center, dtype=np.float64)
    if c.shape != (X.shape[1],):
        raise ValueError(f"center must have shape ({X.shape[1]},), got {c.shape}")
    if not (np.all(np.isfinite(X)) and np.all(np.isfinite(c))):
        raise ValueError("X and center must be finite before clipping (impute or drop NaN rows)")
    D = X - c
    norms = np.linalg.norm(D, axis=1)
    factor = np.minimum(1.0, R / np.maximum(norms, np.finfo(float).tiny))
    return c + D * factor[:, None]


def clip_targets(y: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Clip targets to ``[lo, hi]`` (finite, ``lo < hi``)."""
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"target bounds must be finite with lo < hi, got ({lo}, {hi})")
    y = np.asarray(y, dtype=np.float64)
    if not np.all(np.isfinite(y)):
        raise ValueError("y must be finite before clipping (impute or drop NaN targets)")
    return np.clip(y, lo, hi)


def center_sensitivity(radius: float) -> dict[str, float]:
    """Per-block L2 sensitivity of the sums that estimate a centre privately.

    To clip around a data-dependent centre without spending it in the clear, each client clips
    its rows to a loose public ball (radius ``R0`` around a public origin ``o``) and sends
    ``n = sum_i 1`` and ``sx = sum_i (x_i - o)``; one record moves them by ``1`` and ``R0``
    (joint ``sqrt(1 + R0^2)``). The server's centre is :func:`center_from_sums` of the noisy
    sums, post-processing of one initialization release.
    """
    R = _radius("radius", radius)
    return {"n": 1.0, "sx": R}


def center_from_sums(n: float, sx: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """``o + sx / max(n, 1)``: the centre from (noisy) summed counts and offsets.

    A noisy count can be tiny or negative; flooring it at 1 keeps the centre finite (free
    post-processing).
    """
    sx = np.asarray(sx, dtype=np.float64)
    return np.asarray(origin, dtype=np.float64) + sx / max(float(n), 1.0)


def regression_sensitivity(radius: float, target_bound: float, *, fit_intercept: bool = True,
                           records_per_unit: int = 1) -> dict[str, float]:
    """Per-block L2 sensitivity of linear-regression statistics.

    Blocks (``LatentClassRegression``: ``nk``, ``sxx``, ``sxy``, ``syy``, weighted by
    responsibilities ``r`` in the simplex; HLCR sends the same sums one-hot per cluster as
    ``n_events``, ``XtX``, ``Xty``, ``yty``): ``sum r``, ``sum r x~ x~^T``, ``sum r x~ y``,
    ``sum r y^2`` with ``x~ = [x - c, 1]`` (or ``x - c`` without intercept), ``||x - c|| <= R``
    and ``|y| <= B`` (after :func:`clip_targets`; centre the targets to make ``B`` small).

    Derivation for one record, ``a = ||x~|| <= sqrt(R^2 + 1)`` (``R`` without intercept):
    ``||r||_2 <= 1``; ``||r||_2 ||x~ x~^T||_F = ||r||_2 a^2``; ``||r||_2 a |y|``;
    ``||r||_2 y^2``. A unit of ``m <= M`` records (an HLCR entity, whose label is drawn from
    all its events) moves each block by at most ``M`` times the per-record bound (triangle
    inequality), which is what ``records_per_unit=M`` returns.

    Returns
    -------
    dict with keys ``"n"``, ``"xx"``, ``"xy"``, ``"yy"`` (map them onto the model's block names).
    """
    R = _radius("radius", radius)
    B = _radius("target_bound", target_bound)
    if isinstance(records_per_unit, bool) or not isinstance(records_per_unit, int) or (
            records_per_unit < 1):
        raise ValueError(f"records_per_unit must be a positive integer, got "
                         f"{records_per_unit!r}")
    M = float(records_per_unit)
    a2 = R * R + (1.0 if fit_intercept else 0.0)
    return {"n": M, "xx": M * a2, "xy": M * math.sqrt(a2) * B, "yy": M * B * B}


def logistic_sensitivity(radius: float, n_classes: int, *, fit_intercept: bool = True,
                         coef_norm: float | None = None) -> dict[str, float]:
    """Per-block L2 sensitivity of the weighted logistic Newton sums (FedGMM's learners).

    One record adds ``w (p - e_y) kron x~`` to the gradient and ``w (diag(p) - p p^T) kron
    x~ x~^T`` to the Hessian (``fedlatent.models.logistic.weighted_grad_hess``), with
    ``p`` the ``K - 1`` non-reference class probabilities, ``w`` in ``[0, 1]`` (a learner's
    responsibility; over learners they sum to 1, so the bounds hold jointly) and
    ``a = ||x~|| <= sqrt(R^2 + 1)``.

    - gradient: ``||p - e_y||_2^2`` is ``sum p_k^2 <= 1`` for the reference class and
      ``(1 - p_y)^2 + sum_{k != y} p_k^2 <= 2 (1 - p_y)^2 <= 2`` otherwise; binary (``K = 2``):
      ``|p - y| <= 1``. Bound ``g a`` with ``g = 1`` (binary) or ``sqrt(2)``;
    - Hessian: ``M = diag(p) - p p^T``; with ``a_2 = sum p_k^2`` and ``s = sum p_k <= 1``,
      ``||M||_F^2 = a_2 - 2 sum p_k^3 + a_2^2`` and ``sum p_k^3 >= a_2^2 / s >= a_2^2``
      (Cauchy-Schwarz), so ``||M||_F^2 <= a_2 - a_2^2 <= 1/4``: ``||M||_F <= 1/2``, attained at
      ``p = (1/2, 1/2, 0, ...)``; binary: ``p (1 - p) <= 1/4``. Times ``||x~ x~^T||_F = a^2``;
    - IRLS right-hand side ``b = H theta - g`` (if ``coef_norm = ||theta||_2`` is given, a public
      bound on the broadcast coefficients): ``hess * coef_norm + grad``.

    Returns
    -------
    dict with keys ``"grad"``, ``"hess"`` (and ``"b"`` when ``coef_norm`` is given).
    """
    R = _radius("radius", radius)
    if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 2:
        raise ValueError(f"n_classes must be an integer >= 2, got {n_classes!r}")
    a2 = R * R + (1.0 if fit_intercept else 0.0)
    g = 1.0 if n_classes == 2 else math.sqrt(2.0)
    h = 0.25 if n_classes == 2 else 0.5
    out = {"grad": g * math.sqrt(a2), "hess": h * a2}
    if coef_norm is not None:
        cn = float(coef_norm)
        if not (math.isfinite(cn) and cn >= 0):
            raise ValueError(f"coef_norm must be finite and >= 0, got {coef_norm!r}")
        out["b"] = out["hess"] * cn + out["grad"]
    return out
