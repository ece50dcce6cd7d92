"""The Gaussian mixture's batched client step and its invariants checked for many clients at once.

``gmm_batched_stats`` is :func:`~fedlatent.models.gmm.math.gmm_statistics` at the E-step's
responsibilities for C clients whose rows are stacked as (C, m, d) (padding rows of weight 0):
per-client sums are batched matrix products over the rows axis, never a loop over clients or
rows. ``gaussian_suspects`` flags every client whose statistics may break
:func:`~fedlatent.models.gmm.model.gaussian_problem` (a superset: the engine then asks
``gaussian_problem`` itself for the reason).
"""

from __future__ import annotations

import numpy as np

from ...engine.batched import BatchStep
from ...engine.numerics import logsumexp
from .math import estimate_log_gaussian_prob

__all__ = ["gaussian_suspects", "gmm_batched_stats"]


def gmm_log_resp(params, X: np.ndarray, cov_type: str):
    """Log responsibilities (C, m, K) and per-row log-likelihoods (C, m) of stacked rows."""
    C, m, d = X.shape
    flat = X.reshape(C * m, d)
    wlp = estimate_log_gaussian_prob(flat, params["means"], params["precisions_cholesky"],
                                     cov_type) + np.log(params["weights"])
    norm = logsumexp(wlp, axis=1)
    K = wlp.shape[1]
    return (wlp - norm[:, None]).reshape(C, m, K), norm.reshape(C, m)


def gaussian_sums(X: np.ndarray, resp: np.ndarray, center: np.ndarray, cov_type: str,
                  w: np.ndarray) -> dict[str, np.ndarray]:
    """Per-client ``nk`` (C, K), ``sx`` (C, K, d) and ``sxx`` of rows ``X`` (C, m, d) with
    responsibilities ``resp`` (C, m, K) already weighted by the rows' weights ``w`` (C, m)."""
    Xc = X - center
    nk = resp.sum(axis=1)
    RT = np.ascontiguousarray(resp.transpose(0, 2, 1))  # (C, K, m)
    sx = RT @ Xc
    C, m, d = X.shape
    K = resp.shape[2]
    if cov_type == "full":
        XcT = np.ascontiguousarray(Xc.transpose(0, 2, 1))  # (C, d, m)
        sxx = np.empty((C, K, d, d))
        for k in range(K):  # K products of (C, d, m) @ (C, m, d)
            sxx[:, k] = (XcT * RT[:, k, None, :]) @ Xc
    elif cov_type == "tied":
        Xw = Xc * w[:, :, None]
        sxx = Xw.transpose(0, 2, 1) @ Xc
    else:
        sxx = RT @ (Xc * Xc)
    return {"nk": nk, "sx": sx, "sxx": sxx}


def gmm_batched_stats(params, X: np.ndarray, w: np.ndarray, cov_type: str, state) -> BatchStep:
    """The GMM client step of C clients at once.

    Parameters
    ----------
    params : dict
        ``weights``, ``means``, ``precisions_cholesky``, ``center``.
    X : ndarray of shape (C, m, d)
    w : ndarray of shape (C, m)
        1 for the rows to sum, 0 for padding and rows outside the mini-batch.

    Returns
    -------
    BatchStep with the blocks of ``gmm_statistics`` per client, the rows summed and the summed
    log-likelihood.
    """
    log_resp, norm = gmm_log_resp(params, X, cov_type)
    resp = np.exp(log_resp) * w[:, :, None]
    stats = gaussian_sums(X, resp, params["center"], cov_type, w)
    objective = np.cumsum(norm * w, axis=1)[:, -1]  # in row order, as client_stats sums
    return BatchStep(stats, w.sum(axis=1), objective, state)


def count_suspects(counts: np.ndarray, n_units: np.ndarray, slack: np.ndarray | None,
                   rtol: float = 1e-8) -> np.ndarray:
    """Clients (rows of ``counts``, (C, K)) that may fail
    :func:`fedlatent.engine.messages.count_problem` with ``total=True``."""
    c = counts.reshape(counts.shape[0], -1)
    e = np.zeros_like(c) if slack is None else np.abs(slack.reshape(c.shape))
    n = np.asarray(n_units, dtype=np.float64)
    tol = (rtol * np.maximum(n, 1.0))[:, None]
    bad = np.any(c < -(e + tol), axis=1) | np.any(c > n[:, None] + e + tol, axis=1)
    return bad | (np.abs(c.sum(axis=1) - n) > tol[:, 0] + e.sum(axis=1) * (1 - 1e-12))


def gaussian_moments(nk, sx, sxx, cov_type: str) -> np.ndarray:
    """The moment matrices ``gaussian_problem`` tests, of C clients: (C * n_mats, p, p)."""
    C, K, d = sx.shape
    if cov_type == "full":
        M = np.empty((C, K, d + 1, d + 1))
        M[:, :, 0, 0], M[:, :, 0, 1:], M[:, :, 1:, 0], M[:, :, 1:, 1:] = nk, sx, sx, sxx
        return M.reshape(C * K, d + 1, d + 1)
    if cov_type == "tied":
        M = np.zeros((C, K + d, K + d))
        M[:, np.arange(K), np.arange(K)] = nk
        M[:, :K, K:], M[:, K:, :K], M[:, K:, K:] = sx, sx.transpose(0, 2, 1), sxx
        return M
    M = np.empty((C, K * d, 2, 2))
    M[:, :, 0, 0] = np.repeat(nk, d, axis=1)
    M[:, :, 0, 1] = M[:, :, 1, 0] = sx.reshape(C, -1)
    M[:, :, 1, 1] = sxx.reshape(C, -1)
    return M.reshape(-1, 2, 2)


def _cholesky_ok(B: np.ndarray) -> np.ndarray:
    """Which of the symmetric matrices ``B`` (N, p, p) a Cholesky factorization accepts (all
    pivots positive), vectorized over the matrices (one failure does not stop the others)."""
    N, p, _ = B.shape
    L = np.zeros_like(B)
    ok = np.ones(N, dtype=bool)
    with np.errstate(all="ignore"):
        for j in range(p):
            row = L[:, j, :j]
            piv = B[:, j, j] - np.einsum("nk,nk->n", row, row)
            ok &= piv > 0.0
            piv = np.sqrt(np.where(piv > 0.0, piv, 1.0))
            L[:, j, j] = piv
            if j + 1 < p:
                L[:, j + 1:, j] = (B[:, j + 1:, j] - np.einsum("nik,nk->ni", L[:, j + 1:, :j],
                                                               row)) / piv[:, None]
    return ok & np.isfinite(L).all(axis=(1, 2))


def gaussian_suspects(stats, n_units, cov_type: str, slack=None) -> np.ndarray:
    """Clients whose Gaussian blocks may fail ``gaussian_problem`` (a mask of shape (C,)).

    ``slack`` is None, the blocks' rounding bounds, or a callable ``slack(clients)`` giving
    them for some clients only (asked only for the clients the test without slack flags).
    """
    from ...engine.messages import psd_failures

    nk, sx, sxx = (np.asarray(stats[k], dtype=np.float64) for k in ("nk", "sx", "sxx"))
    C = nk.shape[0]
    get = slack if callable(slack) or slack is None else \
        (lambda rows: {k: np.asarray(slack[k])[rows] for k in ("nk", "sx", "sxx")})
    bad = count_suspects(nk, n_units, None)
    if bad.any() and get is not None:
        rows = np.flatnonzero(bad)
        bad[rows] = count_suspects(nk[rows], np.asarray(n_units)[rows], get(rows)["nk"])
    M = gaussian_moments(nk, sx, sxx, cov_type)
    per = M.shape[0] // C
    p = M.shape[1]
    ix = np.arange(p)
    tiny = np.finfo(np.float64).tiny
    rtol = 1e-8
    with np.errstate(all="ignore"):
        diag = M[:, ix, ix]
        sane = np.all(np.isfinite(M), axis=(1, 2)) & (np.min(diag, axis=1) >= 0.0)
        B = M.copy()
        B[:, ix, ix] += (0.5 * rtol * p) * (np.maximum(diag, 0.0) + tiny)
    ok = sane & _cholesky_ok(B)  # passes without slack: passes with it
    sel = np.flatnonzero(~ok)
    if sel.size and get is not None:
        clients = np.unique(sel // per)
        e = get(clients)
        E_all = gaussian_moments(*(np.abs(np.asarray(e[k], dtype=np.float64))
                                   for k in ("nk", "sx", "sxx")), cov_type)
        pos = {int(c): i for i, c in enumerate(clients)}
        E = E_all[[pos[int(c)] * per + int(m) % per for c, m in zip(sel // per, sel)]]
        with np.errstate(all="ignore"):
            d2 = np.maximum(diag[sel], 0.0) + E[:, ix, ix] + tiny
            sq = np.sqrt(d2)
            err = np.sqrt(np.sum((E / (sq[:, :, None] * sq[:, None, :])) ** 2, axis=(1, 2)))
            B2 = M[sel].copy()
            B2[:, ix, ix] += (0.5 * rtol * p + err)[:, None] * d2
        ok[sel] = sane[sel] & np.isfinite(err) & _cholesky_ok(B2)
        rest = np.flatnonzero(~ok)
        if rest.size:
            keep = np.isin(sel, rest)
            failed = np.zeros(len(ok), dtype=bool)
            failed[rest[psd_failures(M[rest], E[keep], rtol)]] = True
            ok[rest] = ~failed[rest] & sane[rest]
    elif sel.size:
        failed = np.zeros(len(ok), dtype=bool)
        failed[sel[psd_failures(M[sel], None, rtol)]] = True
        ok[sel] = ~failed[sel] & sane[sel]
    return bad | (~ok).reshape(C, per).any(axis=1)
