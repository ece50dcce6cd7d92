"""A bound on FedGMM's learner Hessians ``lH`` from the other statistics of the same rows: what
the reply screen checks beyond positive semi-definiteness.

Learner ``m``'s Hessian (:func:`~fedlatent.models.logistic.weighted_grad_hess`) has, for each
class ``k``, the diagonal block

    H_kk = sum_i s_ik xa_i xa_i^T,   s_ik = w_im p_ik (1 - p_ik),   0 <= s_ik <= w_im / 4

(``xa = [x, 1]``, the intercept last; ``w_im`` the row's weight for learner ``m``, summed in
``lw[m]``). Two facts follow that hold for every data set:

- the intercept entry ``H_kk[1, 1] = sum_i s_ik <= lw[m] / 4``;
- for each feature ``a``, the Schur complement ``H_kk[a, a] - H_kk[a, 1]^2 / H_kk[1, 1] =
  sum_i s_ik (x_ia - xbar)^2`` (``xbar`` the ``s``-weighted mean) is at most
  ``sum_i s_ik (x_ia - c_a)^2 <= (1/4) sum_i w_im (x_ia - c_a)^2`` for the statistics'
  centre ``c``; over the learners, whose weights sum to each row's mass, at most a quarter of
  the input components' summed second moments about ``c``, ``sum_m1 sxx[m1, a, a]`` (rows
  with missing values: their completions' squares are at most the conditional second
  moments ``sxx`` carries).

A diagonal entry of ``lH`` moved alone stays positive semi-definite, and a ring element
shifted in transit decodes there in range; these bounds refuse it instead (by about six
orders of magnitude at the secure encoding's cap). Each side carries its fixed-point slack
and a relative ``1e-8``; an intercept entry within its slack of zero leaves its features
unchecked (the complement is then not determined).
"""

from __future__ import annotations

import numpy as np

__all__ = ["hessian_bound_problem"]

_RTOL = 1e-8


def _diag_sum(sxx: np.ndarray, cov_type: str, slack) -> tuple[np.ndarray, np.ndarray]:
    """``sum_m1 sxx[m1, a, a]`` (d,) for each covariance layout, and its slack."""
    def one(s):
        s = np.asarray(s, dtype=np.float64)
        if cov_type == "full":
            return np.einsum("maa->a", s)
        if cov_type == "tied":
            return np.diagonal(s).copy()
        return s.sum(axis=0)  # diag, spherical: (M1, d)

    return one(sxx), (np.zeros(1) if slack is None else np.abs(one(slack)))


def hessian_bound_problem(sxx: np.ndarray, lH: np.ndarray, lw: np.ndarray, cov_type: str,
                          slack=None) -> str | None:
    """Why ``lH`` (M2, P, P), ``P = (K - 1) (d + 1)``, cannot be the learners' Hessians of
    the rows whose second moments about the centre are ``sxx`` (the input components',
    layout by ``cov_type``) and whose learner weights are ``lw`` (M2,) (None: it can).
    ``slack``: each statistic's fixed-point slack (a mapping with ``sxx``, ``lH``, ``lw``)."""
    H = np.asarray(lH, dtype=np.float64)
    M2, P, _ = H.shape
    total, e_total = _diag_sum(sxx, cov_type, None if slack is None else slack["sxx"])
    D = total.size + 1
    if P % D or M2 == 0:
        return None  # (not the logistic learner's layout: nothing to bound it by)
    eH = np.zeros_like(H) if slack is None else np.abs(np.asarray(slack["lH"], np.float64))
    ew = np.zeros(M2) if slack is None else np.abs(np.asarray(slack["lw"], np.float64))
    idx = np.arange(P).reshape(-1, D)  # (K - 1, D): class k's rows of the Hessian
    diag = np.diagonal(H, axis1=1, axis2=2)[:, idx]  # (M2, K - 1, D)
    e_diag = np.diagonal(eH, axis1=1, axis2=2)[:, idx]
    ii, e_ii = diag[..., -1], e_diag[..., -1]  # (M2, K - 1)
    cap = np.asarray(lw, dtype=np.float64)[:, None] / 4 + ew[:, None] / 4 + e_ii
    high = np.argwhere(ii > cap + _RTOL * np.maximum(np.abs(cap), 1.0))
    if high.size:
        m, k = (int(v) for v in high[0])
        return (f"the Hessian 'lH' of learner {m} has intercept entry {ii[m, k]:.6g} (class "
                f"{k + 1}), above a quarter of its weight 'lw' ({lw[m]:.6g}): no rows give it")
    cross = H[:, idx[:, :-1], idx[:, -1:]]  # (M2, K - 1, d): each feature with the intercept
    e_cross = eH[:, idx[:, :-1], idx[:, -1:]]
    firm = (ii - e_ii) > 0
    low = np.where(firm, ii - e_ii, 1.0)[..., None]
    schur = np.where(firm[..., None], diag[..., :-1] - e_diag[..., :-1]
                     - (np.abs(cross) + e_cross) ** 2 / low, 0.0)
    spread = np.maximum(schur, 0.0).sum(axis=0)  # (K - 1, d), over the learners
    bound = (total + e_total) / 4
    over = np.argwhere(spread > bound + _RTOL * np.maximum(bound + spread, 1.0))
    if over.size:
        k, a = (int(v) for v in over[0])
        return (f"the Hessians 'lH' spread feature {a} by {spread[k, a]:.6g} (class {k + 1}, "
                f"over the learners), above a quarter of its second moment in 'sxx' "
                f"({total[a]:.6g}): no rows give it")
    return None
