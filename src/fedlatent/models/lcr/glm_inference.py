"""Inference for the latent class regression with generalized linear components or
concomitant variables: the observed information a client sends (Louis' formula) and the
reported parameters.

Free parameters, in order: the class weights' (``pi_1..pi_{K-1}``, or with concomitant
variables the multinomial logit's ``gamma`` (K - 1, q), rows flattened), then per component its
coefficients (intercept last when fitted) and, for the Gaussian family, its noise variance.
Complete-data scores and minus Hessians per record and component:

- ``log pi_k(z)``: ``(e_k - pi)[1:] (x) z~`` and ``(diag p - p p^T) (x) z~ z~^T`` (the same for
  every k), or :func:`~fedlatent.engine.estimation.inference.weight_scores`' for constant weights;
- Poisson and binomial (canonical links): ``(y - mu_k) x~`` and ``v_k x~ x~^T``;
- Gaussian: as :mod:`fedlatent.models.lcr.inference` (of ``y - offset``).

With one component and no concomitant variables the information is the GLM's ``X^T W X``, so the
standard errors are statsmodels' ``GLM(...).fit().bse`` (scale 1 for Poisson and binomial).
"""

from __future__ import annotations

import numpy as np

from ...engine.estimation.inference import (
    InferenceLayout,
    louis_information,
    weight_row,
    weight_scores,
)
from ..concomitant import concomitant_statistics
from .families import glm_mean, glm_weight

__all__ = ["glm_information", "glm_layout"]

#: rows per block of the per-record scores (bounds the memory at rows x K x P floats)
CHUNK = 2048


def _prior_block(model, params, rp, lp, wresp, P0):
    """The prior's scores (n, K, P0) and complete information (P0, P0)."""
    n, K = lp.shape
    if rp.Zt is not None:
        d = np.eye(K)[None, :, 1:] - np.exp(lp)[:, None, 1:]  # (n, K, K - 1)
        S = (d[:, :, :, None] * rp.Zt[:, None, None, :]).reshape(n, K, P0)
        return S, concomitant_statistics(rp.Zt, lp, wresp, rp.freq)["chess"]
    a = weight_scores(np.asarray(params["weights"], dtype=np.float64))
    return (np.broadcast_to(a[None], (n, K, P0)),
            np.einsum("k,ki,kj->ij", wresp.sum(0), a, a))


def _component_block(model, params, rp, k: int, r: np.ndarray):
    """Component ``k``'s scores (n, q) and complete information (q, q), ``r`` its
    responsibilities times the frequency weights."""
    Xt = rp.Xt
    b = np.asarray(params["beta"], dtype=np.float64)[k]
    if model.gaussian:
        var = float(params["noise_variance"][k])
        e = rp.y - rp.offset - Xt @ b
        p = Xt.shape[1]
        S = np.empty((Xt.shape[0], p + 1))
        S[:, :p] = Xt * (e / var)[:, None]
        S[:, p] = (e**2 / var - 1.0) / (2.0 * var)
        C = np.empty((p + 1, p + 1))
        C[:p, :p] = (Xt * r[:, None]).T @ Xt / var
        C[:p, p] = C[p, :p] = (Xt * (r * e)[:, None]).sum(0) / var**2
        C[p, p] = float((r * (e**2 / var**3 - 0.5 / var**2)).sum())
        return S, C
    eta = (Xt @ b + rp.offset)[:, None]
    mu = glm_mean(model.family, eta, rp.trials)[:, 0]
    v = glm_weight(model.family, eta, rp.trials)[:, 0]
    return Xt * (rp.y - mu)[:, None], (Xt * (r * v)[:, None]).T @ Xt


def _chunk_information(model, params, rp) -> tuple[np.ndarray, float]:
    resp, ll, lp = model.e_step(params, rp)
    f = rp.freq
    wresp = resp if f is None else resp * f[:, None]
    n, K = resp.shape
    P0 = (K - 1) * (model.n_concomitant or 1)
    q = model.n_coef + int(model.gaussian)
    P = P0 + K * q
    S = np.zeros((n, K, P))
    complete = np.zeros((P, P))
    S[:, :, :P0], complete[:P0, :P0] = _prior_block(model, params, rp, lp, wresp, P0)
    for k in range(K):  # a loop over components, each vectorized over the rows
        o = P0 + k * q
        S[:, k, o:o + q], complete[o:o + q, o:o + q] = _component_block(
            model, params, rp, k, wresp[:, k])
    return louis_information(resp, S, complete, f), float(ll.sum() if f is None else ll @ f)


def glm_information(model, params, rp) -> tuple[np.ndarray, float]:
    """Louis' observed information summed over the rows ``rp`` (a
    :class:`~fedlatent.models.lcr.glm_model.RowParts` of ``model``, an ``LCRGLMModel``), and
    their log-likelihood.

    Returns
    -------
    info : ndarray (P, P)
    loglik : float
    """
    info, loglik = None, 0.0
    for s in range(0, max(rp.Xt.shape[0], 1), CHUNK):
        sl = slice(s, s + CHUNK)
        part = type(rp)(rp.Xt[sl], rp.y[sl], rp.trials[sl], rp.offset[sl],
                        None if rp.Zt is None else rp.Zt[sl],
                        None if rp.freq is None else rp.freq[sl])
        m, ll = _chunk_information(model, params, part)
        info = m if info is None else info + m
        loglik += ll
    return info, loglik


def glm_layout(model, params, names: list[str],
               concomitant_names: list[str]) -> InferenceLayout:
    """The reported parameters: per component its ``weight`` (constant weights) or, for
    classes 1..K-1, its concomitant coefficients (``concomitant:<name>``, the intercept
    ``concomitant:intercept``; class 0 is the reference), then its coefficients (``names``:
    the regressors then ``intercept``) and, Gaussian, ``noise_variance``."""
    beta = np.asarray(params["beta"], dtype=np.float64)
    K, p = beta.shape
    c = model.n_concomitant
    P0 = (K - 1) * (c or 1)
    q = p + int(model.gaussian)
    P = P0 + K * q
    eye = np.eye(P)
    index, est, rows = [], [], []
    cnames = [f"concomitant:{n}" for n in [*concomitant_names, "intercept"]]
    for k in range(K):
        if not c:
            index.append((str(k), "weight"))
            est.append(float(params["weights"][k]))
            rows.append(weight_row(k, K, P))
        elif k > 0:
            for j, name in enumerate(cnames):
                index.append((str(k), name))
                est.append(float(params["gamma"][k - 1, j]))
                rows.append(eye[(k - 1) * c + j])
        o = P0 + k * q
        labels = [*names, "noise_variance"] if model.gaussian else list(names)
        for j, name in enumerate(labels):
            index.append((str(k), name))
            est.append(float(beta[k, j]) if j < p else float(params["noise_variance"][k]))
            rows.append(eye[o + j])
    payload = {f"params/{k}": np.asarray(v, dtype=np.float64) for k, v in params.items()}
    return InferenceLayout(index, np.asarray(est), np.vstack(rows), payload)
