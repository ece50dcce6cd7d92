"""Inference for the latent class regression: the observed information a client sends, the
reported parameters, and prediction intervals from the mixture predictive distribution.

Free parameters (the order of the information matrix): the weights ``pi_1..pi_{K-1}``
(``pi_K = 1 - sum``), then per component its coefficients (intercept last when fitted) and its
noise variance (raw, not its log). Per record and component the complete-data log-density is
``log pi_k - log(2 pi s2_k) / 2 - e^2 / (2 s2_k)``, ``e = y - x~^T beta_k``, with score
``(x~ e / s2, (e^2 / s2 - 1) / (2 s2))`` and minus Hessian
``[[x~ x~^T / s2, x~ e / s2^2], [., e^2 / s2^3 - 1 / (2 s2^2)]]``.
"""

from __future__ import annotations

import numpy as np
from scipy import special

from ...engine.estimation.inference import (
    InferenceLayout,
    InformationSums,
    louis_blocks,
    weight_row,
    weight_scores,
)
from .math import lcr_responsibilities

__all__ = ["degenerate_components", "lcr_information", "lcr_information_sums", "lcr_layout",
           "mixture_quantiles"]

#: rows per block of the per-record scores (bounds the memory at rows x K x P floats)
CHUNK = 2048


def _complete_block(Xt, e, r, var) -> np.ndarray:
    """``sum_i r_i (-H_i)`` of one component's (beta, s2) for rows ``Xt`` with residuals ``e``."""
    p = Xt.shape[1]
    out = np.empty((p + 1, p + 1))
    out[:p, :p] = (Xt * r[:, None]).T @ Xt / var
    out[:p, p] = out[p, :p] = (Xt * (r * e)[:, None]).sum(0) / var**2
    out[p, p] = float((r * (e**2 / var**3 - 0.5 / var**2)).sum())
    return out


def _chunk_information(Xt, y, weights, beta, var, fw):
    K, p = beta.shape
    q = p + 1
    P = K - 1 + K * q
    resp, ll = lcr_responsibilities(Xt, y, weights, beta, var)
    wresp = resp if fw is None else resp * fw[:, None]  # a row of weight 2 is the row twice
    e = y[:, None] - Xt @ beta.T
    a = weight_scores(weights)
    S = np.zeros((Xt.shape[0], K, P))
    S[:, :, :K - 1] = a[None]
    complete = np.zeros((P, P))
    complete[:K - 1, :K - 1] = np.einsum("k,ki,kj->ij", wresp.sum(0), a, a)
    for k in range(K):  # a loop over components, each vectorized over the rows
        o = K - 1 + k * q
        S[:, k, o:o + p] = Xt * (e[:, k] / var[k])[:, None]
        S[:, k, o + p] = (e[:, k] ** 2 / var[k] - 1.0) / (2.0 * var[k])
        complete[o:o + q, o:o + q] = _complete_block(Xt, e[:, k], wresp[:, k], var[k])
    info, scores = louis_blocks(resp, S, complete, fw)
    return info, scores, float(ll.sum() if fw is None else ll @ fw)


def lcr_information_sums(Xt: np.ndarray, y: np.ndarray, weights: np.ndarray,
                         beta: np.ndarray, noise_variance: np.ndarray,
                         sample_weight: np.ndarray | None = None,
                         entity: np.ndarray | None = None) -> InformationSums:
    """The information sums of the rows ``(Xt, y)`` (``Xt`` with its intercept column):
    Louis' observed information, the scores' outer products (per row, the rows' total, per
    entity) and the log-likelihood; ``sample_weight``: each row's frequency weight (a row of
    weight 2 counts twice); ``entity``: each row's entity (None: no entity level).

    P = K - 1 + K (p + 1) free parameters (module docstring)."""
    beta = np.asarray(beta, dtype=np.float64)
    var = np.asarray(noise_variance, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    K, p = beta.shape
    sums = InformationSums(K - 1 + K * (p + 1), entity)
    fw = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
    for start in range(0, Xt.shape[0], CHUNK):
        rows = slice(start, start + CHUNK)
        part = _chunk_information(Xt[rows], y[rows], w, beta, var,
                                  None if fw is None else fw[rows])
        sums.add(*part, weight=None if fw is None else fw[rows], rows=rows)
    return sums


def lcr_information(Xt: np.ndarray, y: np.ndarray, weights: np.ndarray, beta: np.ndarray,
                    noise_variance: np.ndarray,
                    sample_weight: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """Louis' observed information summed over the rows ``(Xt, y)`` (``Xt`` with its
    intercept column), and their log-likelihood; ``sample_weight``: each row's frequency
    weight (a row of weight 2 counts twice).

    Returns
    -------
    info : ndarray (P, P), P = K - 1 + K (p + 1)
    loglik : float
    """
    sums = lcr_information_sums(Xt, y, weights, beta, noise_variance, sample_weight)
    return 0.5 * (sums.info + sums.info.T), sums.loglik


def degenerate_components(S, params, reg_noise: float, name: str) -> list[int]:
    """The components whose noise variance the M-step held at its floor (a point mass,
    :mod:`fedlatent.engine.contract.degenerate`), with one UserWarning naming them; ``S`` the
    fit's final statistics (None or empty under the one-shot paths: none)."""
    from ...engine.contract.degenerate import DEGENERATE_FRACTION, at_floor, warn_degenerate
    from .math import pooled_residual_variance

    if S is None or "nk" not in S or float(np.sum(S["nk"])) <= 0:
        return []
    floor = DEGENERATE_FRACTION * pooled_residual_variance(S)
    var = np.asarray(params["noise_variance"], dtype=np.float64) - reg_noise
    held = [int(k) for k in np.flatnonzero(at_floor(var, floor)
                                           & (np.asarray(params["weights"]) > 0))]
    if held:
        warn_degenerate(name, held, f"noise variance {floor + reg_noise:.3g}, "
                        f"{DEGENERATE_FRACTION:g} of the pooled regression's residual variance")
    return held


def lcr_layout(weights, beta, noise_variance, names: list[str]) -> InferenceLayout:
    """The reported parameters per component (``weight``, one coefficient per name in
    ``names``, i.e. the features then ``intercept`` when fitted, ``noise_variance``) and
    their map from the free parameters."""
    beta = np.asarray(beta, dtype=np.float64)
    K, p = beta.shape
    q = p + 1
    P = K - 1 + K * q
    index, est, rows = [], [], []
    for k in range(K):
        index.append((str(k), "weight"))
        est.append(float(weights[k]))
        rows.append(weight_row(k, K, P))
        o = K - 1 + k * q
        for j, name in enumerate([*names, "noise_variance"]):
            index.append((str(k), name))
            est.append(float(beta[k, j]) if j < p else float(noise_variance[k]))
            rows.append(np.eye(P)[o + j])
    payload = {"params/weights": np.asarray(weights, float), "params/beta": beta,
               "params/noise_variance": np.asarray(noise_variance, float)}
    return InferenceLayout(index, np.asarray(est), np.vstack(rows), payload, n_scale=K,
                           sums=True)


def mixture_quantiles(means: np.ndarray, sds: np.ndarray, weights: np.ndarray,
                      probs: np.ndarray, n_iter: int = 80) -> np.ndarray:
    """Quantiles of the normal mixtures ``sum_k w_k N(means[i, k], sds[k]^2)``, one per row
    ``i`` and probability, by bisection on the mixture's distribution function (vectorized
    over the rows). Returns an array (n, len(probs))."""
    means = np.asarray(means, dtype=np.float64)
    lo0 = (means - 12.0 * sds[None, :]).min(1)
    hi0 = (means + 12.0 * sds[None, :]).max(1)
    out = np.empty((means.shape[0], len(probs)))
    for j, prob in enumerate(probs):
        lo, hi = lo0.copy(), hi0.copy()
        for _ in range(n_iter):
            mid = 0.5 * (lo + hi)
            cdf = special.ndtr((mid[:, None] - means) / sds[None, :]) @ weights
            below = cdf < prob
            lo = np.where(below, mid, lo)
            hi = np.where(below, hi, mid)
        out[:, j] = 0.5 * (lo + hi)
    return out
