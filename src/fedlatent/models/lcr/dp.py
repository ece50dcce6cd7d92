"""The latent class regression under differential privacy: the coordinates its statistics are
taken in, their per-record sensitivity, the M-step on noisy sums and the private start.

Under ``Federation(privacy=DifferentialPrivacy(epsilon, delta, clip=R, center=c,
target_range=(lo, hi)))`` every client clips its feature rows to the ball of radius ``R``
around ``c`` and its targets to ``[lo, hi]`` (the engine's default ``dp_clip``). With an
intercept the statistics are taken in shifted coordinates, ``x - c`` and ``y - m`` with
``m = (lo + hi) / 2`` (both public), so one record's design row has norm at most
``sqrt(R^2 + 1)`` and its target at most ``B = (hi - lo) / 2``; the model reads the
coefficients in those coordinates and back (:func:`to_shifted`, :func:`from_shifted`: the
predictions, the responsibilities and the weighted least-squares solution are unchanged by an
affine change of coordinates of this form). Without an intercept no shift is possible (it would
change the model): the bounds are widened to ``R + ||c||`` and ``B = max(|lo|, |hi|)``.

Sensitivity (add/remove one record, blocks jointly): :func:`regression_sensitivity
<fedlatent.engine.privacy.clipping.regression_sensitivity>` with those ``R`` and ``B``:
``nk`` 1, ``sxx`` ``a^2``, ``sxy`` ``a B``, ``syy`` ``B^2`` (``a^2 = R^2 + 1``), the record's
responsibilities being in the simplex.

The M-step on noisy sums (:meth:`LCRModel.noisy_m_step
<fedlatent.models.lcr.model.LCRModel.noisy_m_step>`) projects each component's moment matrix
onto the positive-definite cone (:func:`project_moments`) and solves its lines with an
adaptive ridge (AdaSSP's, in the swamped directions only) at the noise's spectral scale
(:func:`adaptive_ridge`, :func:`noise_scale`, carried in the public parameter ``dp_ridge``);
the start is :func:`initialize_private`.
"""

from __future__ import annotations

import logging

import numpy as np

from ...engine.privacy.clipping import regression_sensitivity
from ...engine.protocol.messages import bordered
from ...engine.protocol.numerics import lift_eigenvalues
from ...engine.stats import Stats

__all__ = [
    "adaptive_ridge",
    "from_shifted",
    "initialize_private",
    "lcr_dp_sensitivity",
    "noise_scale",
    "project_moments",
    "shift_for",
    "to_shifted",
]

logger = logging.getLogger(__name__)


def shift_for(dp, n_features: int, fit_intercept: bool) -> dict | None:
    """The public shift ``{"center": c (list), "target_center": m}`` the statistics are taken
    about (None without an intercept, where a shift would change the model)."""
    if not fit_intercept:
        return None
    lo, hi = dp.target_range
    return {"center": [float(v) for v in dp.center_for(n_features)],
            "target_center": 0.5 * (float(lo) + float(hi))}


def lcr_dp_sensitivity(dp, n_features: int, fit_intercept: bool) -> dict[str, float]:
    """Per-record L2 bounds of the blocks ``nk``, ``sxx``, ``sxy``, ``syy`` for data clipped
    by the engine's ``dp_clip`` (see the module docstring).

    Raises
    ------
    ValueError
        Without ``dp.target_range`` (the targets would be unbounded).
    """
    if dp.target_range is None:
        raise ValueError("LatentClassRegression under differential privacy needs "
                         "DifferentialPrivacy(target_range=(lo, hi)): the targets are clipped to "
                         "it so that one record's y is bounded; choose it from public knowledge "
                         "of y's range, never from the data")
    lo, hi = dp.target_range
    if fit_intercept:
        R, B = float(dp.clip), 0.5 * (float(hi) - float(lo))
    else:
        R = float(dp.clip) + float(np.linalg.norm(dp.center_for(n_features)))
        B = max(abs(float(lo)), abs(float(hi)))
    s = regression_sensitivity(R, B, fit_intercept=fit_intercept)
    return {"nk": s["n"], "sxx": s["xx"], "sxy": s["xy"], "syy": s["yy"]}


def to_shifted(beta: np.ndarray, center: np.ndarray, target_center: float) -> np.ndarray:
    """Coefficients ``(K, d + 1)`` (intercept last) in the coordinates ``(x - c, y - m)``:
    ``y - m = (x - c)^T b + (b_0 + c^T b - m)``."""
    out = np.array(beta, dtype=np.float64, copy=True)
    out[:, -1] = out[:, -1] + out[:, :-1] @ center - target_center
    return out


def from_shifted(beta: np.ndarray, center: np.ndarray, target_center: float) -> np.ndarray:
    """Inverse of :func:`to_shifted`."""
    out = np.array(beta, dtype=np.float64, copy=True)
    out[:, -1] = out[:, -1] - out[:, :-1] @ center + target_center
    return out


def project_moments(S: Stats, floor: float = 1e-9) -> tuple[Stats, np.ndarray]:
    """Noisy statistics made consistent: per component, the moment matrix
    ``[[sxx, sxy], [sxy^T, syy]]`` with its eigenvalues raised to ``floor`` times its mean
    eigenvalue (a projection onto the positive-definite cone; noise can leave it, and a
    weighted least-squares solve on an indefinite ``sxx`` has no minimum). Components already
    inside keep their statistics exactly. Post-processing: free under differential privacy.

    Parameters
    ----------
    S : Stats with ``nk`` (K,), ``sxx`` (K, p, p), ``sxy`` (K, p), ``syy`` (K,)

    Returns
    -------
    S : Stats
    projected : ndarray of bool, shape (K,)
        The components whose matrix was moved.
    """
    M = bordered(S["sxx"], S["sxy"], S["syy"])
    M = 0.5 * (M + np.transpose(M, (0, 2, 1)))
    vals, vecs = np.linalg.eigh(M)
    scale = np.maximum(np.abs(vals).mean(axis=1), np.finfo(float).tiny)
    low = vals < floor * scale[:, None]
    bad = low.any(axis=1)
    if not bad.any():
        return S, bad
    fixed = np.einsum("kij,kj,klj->kil", vecs, np.maximum(vals, floor * scale[:, None]), vecs)
    M = np.where(bad[:, None, None], fixed, M)
    p = M.shape[1] - 1
    return Stats({**S, "sxx": M[:, :p, :p], "sxy": M[:, :p, p], "syy": M[:, p, p]}), bad


def noise_scale(model, dp, noise_multiplier: float, n_clients: int,
                threshold: int | None) -> float:
    """The spectral scale ``tau`` of the noise a round's summed ``sxx`` carries (sum scale):
    ``sd * sqrt(2 p)`` with ``sd`` its entry standard deviation (``sqrt(n_clients)`` clients'
    local noise, or the calibrated noise times ``sqrt(n_clients / threshold)`` when
    distributed) and ``p`` the coefficients. Public quantities only (setting and plan)."""
    from ...engine.privacy.client_dp import matrix_noise_scale

    return matrix_noise_scale(lcr_dp_sensitivity(dp, model.n_features, model.fit_intercept),
                              "sxx", noise_multiplier, dp.noise, n_clients, threshold,
                              model.n_features + int(model.fit_intercept))


def adaptive_ridge(A: np.ndarray, tau: float) -> np.ndarray:
    """Each ``A_k`` (K, p, p) with its eigenvalues below ``tau`` raised to ``tau``: a ridge
    in the directions the noise can swamp only (eigenvalue below the noise's scale), so that
    they do not drive the solve, while well-determined directions keep their sums (AdaSSP's
    adaptive ridge lifts every direction by ``max(0, tau - lambda_min)``, which biases the
    well-determined ones too). A well-determined ``A_k`` is unchanged.

    References
    ----------
    Wang, "Revisiting differentially private linear regression: optimal and adaptive
    prediction & estimation in unbounded domain", UAI 2018 (AdaSSP).
    """
    if not tau > 0:
        return A
    return lift_eigenvalues(A, tau)[0]


def _spread(p: int, K: int, rng: np.random.Generator, per: int = 10) -> np.ndarray:
    """``K`` directions of ``R^p`` chosen among ``per * K`` standard normal draws by farthest
    point from a random first one, scaled by ``1 / sqrt(p)`` (unit mean square)."""
    Z = rng.standard_normal((per * K, p))
    picked = [int(rng.integers(per * K))]
    d2 = np.sum((Z - Z[picked[0]]) ** 2, axis=1)
    for _ in range(K - 1):
        picked.append(int(np.argmax(d2)))
        d2 = np.minimum(d2, np.sum((Z - Z[picked[-1]]) ** 2, axis=1))
    return Z[picked] / np.sqrt(p)


def initialize_private(ctx, n_components: int, n_coef: int, reg_noise: float) -> dict:
    """The start under differential privacy, from one release of summed statistics.

    flexmix's random memberships (the non-private start) begin at the symmetric point where
    every component is the pooled regression, and EM needs many rounds to leave it; under
    differential privacy every round costs budget. Instead every client sends its
    one-component sums (``pooled_stats``: ``n``, ``sum x~ x~^T``, ``sum x~ y``, ``sum y^2``,
    noised), the server fits the pooled regression (coefficients ``b``, residual variance
    ``s^2``) and spreads ``K`` lines around it: ``b_k = b + s A^(-1/2) z_k`` with ``A`` the
    mean of ``x~ x~^T`` (so a line's predictions differ from the pooled one's by about ``s``
    on the data) and ``z_k`` spread-out draws, each with variance ``s^2`` and weight
    ``1 / K``. Everything after the release is post-processing.

    The parameters carry ``dp_ridge``, the noise's scale :func:`noise_scale` of a round's
    sums, for the M-step's :func:`adaptive_ridge`.

    Returns
    -------
    dict with ``weights`` (K,), ``beta`` (K, n_coef), ``noise_variance`` (K,), ``dp_ridge`` ()
    """
    K, p = int(n_components), int(n_coef)
    shapes = {"nk": (1,), "sxx": (1, p, p), "sxy": (1, p), "syy": (1,)}
    tot = ctx.ask_sum("pooled_stats", shapes={f"stat/{k}": s for k, s in shapes.items()},
                      what="private initialization (pooled regression sums)")
    S, _ = project_moments(Stats({k: np.asarray(tot[f"stat/{k}"], dtype=np.float64)
                                  for k in shapes}))
    n = float(S["nk"][0])
    if not n > 0:
        raise ValueError(f"private initialization: the noisy pooled count is {n:.3g} <= 0 (the "
                         "noise swamps the data); use a larger epsilon or more records")
    model = ctx.model
    tau = noise_scale(model, ctx.federation.privacy, ctx.privacy.calibration.noise_multiplier,
                      len(ctx.client_ids),
                      None if ctx.secure is None else ctx.secure.config.threshold)
    pooled = model.noisy_m_step(S, None, tau)  # in the data's coordinates
    beta0 = pooled["beta"][0]
    shift = model.shift
    if shift is not None:
        beta0 = to_shifted(beta0[None], *shift)[0]
    s2 = float(pooled["noise_variance"][0])
    # A^(-1/2) z: predictions of the spread lines differ by about s on the data; eigenvalues
    # floored at the noise's scale (directions the noise swamps get no spread from it)
    vals, vecs = np.linalg.eigh(0.5 * (S["sxx"][0] + S["sxx"][0].T) / n)
    vals = np.maximum(vals, max(tau / n, 1e-12 * float(np.abs(vals).mean()), 1e-300))
    rng = np.random.default_rng(np.random.SeedSequence(ctx.seed, spawn_key=(0x1C7,)))
    Z = _spread(p, K, rng)
    delta = ((Z @ vecs) / np.sqrt(vals)) @ vecs.T * np.sqrt(s2) if K > 1 else np.zeros((1, p))
    beta = beta0[None] + delta
    if shift is not None:
        beta = from_shifted(beta, *shift)
    logger.info("differential privacy: the start is %d lines spread around the pooled "
                "regression (residual variance %.4g)", K, s2)
    return {"weights": np.full(K, 1.0 / K), "beta": beta, "noise_variance": np.full(K, s2),
            "dp_ridge": np.array(tau)}
