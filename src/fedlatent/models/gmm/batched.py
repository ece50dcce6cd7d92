"""The Gaussian mixture's batched client step and its invariants checked for many clients at once.

``gmm_batched_stats`` is :func:`~fedlatent.models.gmm.math.gmm_statistics` at the E-step's
responsibilities for C clients whose rows are stacked as (C, m, d) (padding rows of weight 0):
per-client sums are batched matrix products over the rows axis, never a loop over clients or
rows. ``gaussian_suspects`` flags every client whose statistics may break
:func:`~fedlatent.models.gmm.model.gaussian_problem` (a superset: the engine then asks
``gaussian_problem`` itself for the reason). ``gmm_batched_query`` answers the initialization
queries (moments, hard-assignment sums) and the ``loglik`` query for C clients the same way.
"""

from __future__ import annotations

import numpy as np

from ...engine.node.batched import BatchStep
from ...engine.protocol.compiled import kernels, worth
from ...engine.protocol.numerics import logsumexp
from .math import estimate_log_gaussian_prob, merged_rows

__all__ = ["cell_sums_numpy", "gaussian_suspects", "gmm_batched_query", "gmm_batched_stats",
           "hard_labels_batched", "hard_labels_numpy", "live_cells"]


def gmm_log_resp(params, X: np.ndarray, cov_type: str):
    """Log responsibilities (C, m, K) and per-row log-likelihoods (C, m) of stacked rows."""
    C, m, d = X.shape
    flat = X.reshape(C * m, d)
    wlp = estimate_log_gaussian_prob(flat, params["means"], params["precisions_cholesky"],
                                     cov_type)
    wlp += np.log(params["weights"])  # (in place: the same operations, no new array)
    norm = logsumexp(wlp, axis=1)
    K = wlp.shape[1]
    wlp -= norm[:, None]
    return wlp.reshape(C, m, K), norm.reshape(C, m)


def gaussian_sums(X: np.ndarray, resp: np.ndarray, center: np.ndarray, cov_type: str,
                  w: np.ndarray, out: dict[str, np.ndarray] | None = None
                  ) -> dict[str, np.ndarray]:
    """Per-client ``nk`` (C, K), ``sx`` (C, K, d) and ``sxx`` of rows ``X`` (C, m, d) with
    responsibilities ``resp`` (C, m, K) already weighted by the rows' weights ``w`` (C, m);
    written into ``out`` (views of the reply buffer of those shapes, returned) if given."""
    o = out or {}
    Xc = X - center
    nk = resp.sum(axis=1, out=o.get("nk"))
    RT = np.ascontiguousarray(resp.transpose(0, 2, 1))  # (C, K, m)
    sx = np.matmul(RT, Xc, out=o.get("sx"))
    C, m, d = X.shape
    K = resp.shape[2]
    if cov_type == "full":  # one product (C, K d, m) @ (C, m, d): the K blocks at once
        WX = np.multiply(RT[:, :, None, :], Xc.transpose(0, 2, 1)[:, None, :, :],
                         out=np.empty((C, K, d, m)))  # (C order: reshaped without a copy)
        flat = None if out is None else np.reshape(out["sxx"], (C, K * d, d), copy=False)
        sxx = np.matmul(WX.reshape(C, K * d, m), Xc, out=flat).reshape(C, K, d, d)
        sxx = sxx if out is None else out["sxx"]  # (written there through ``flat``)
    elif cov_type == "tied":
        Xw = Xc * w[:, :, None]
        sxx = Xw.transpose(0, 2, 1) @ Xc
    else:
        sxx = RT @ (Xc * Xc)
    if out is not None:
        if sxx is not out["sxx"]:
            out["sxx"][...] = sxx
        return out
    return {"nk": nk, "sx": sx, "sxx": sxx}


def gmm_batched_stats(params, X: np.ndarray, w: np.ndarray, cov_type: str, state,
                      out: dict[str, np.ndarray] | None = None) -> BatchStep:
    """The GMM client step of C clients at once.

    Parameters
    ----------
    params : dict
        ``weights``, ``means``, ``precisions_cholesky``, ``center``.
    X : ndarray of shape (C, m, d)
    w : ndarray of shape (C, m)
        1 for the rows to sum, 0 for padding and rows outside the mini-batch.
    out : dict of str to ndarray or None
        Views of the reply buffer the statistics are written into (``nk`` (C, K), ``sx``
        (C, K, d), ``sxx``), returned as the step's ``stats``.

    Returns
    -------
    BatchStep with the blocks of ``gmm_statistics`` per client, the rows summed and the summed
    log-likelihood.
    """
    resp, norm = gmm_log_resp(params, X, cov_type)
    np.exp(resp, out=resp)  # (in place)
    resp *= w[:, :, None]
    stats = gaussian_sums(X, resp, params["center"], cov_type, w, out)
    objective = np.cumsum(norm * w, axis=1)[:, -1]  # in row order, as client_stats sums
    return BatchStep(stats, w.sum(axis=1), objective, state)


def gmm_batched_query(model, name: str, payload, X: np.ndarray, w: np.ndarray):
    """:meth:`GMMModel.client_query` of C clients at once for ``moments``, ``hard_stats`` and
    ``loglik``: rows ``X`` (C, m, d), ``w`` (C, m) 1 for a row, 0 for padding (padding rows
    are 0). Each entry stacked (C, ...)."""
    if name == "moments":
        XT = np.ascontiguousarray(X.transpose(0, 2, 1))
        return {"n": w.sum(axis=1), "sx": X.sum(axis=1), "sxx": XT @ X}
    if name == "hard_stats":
        centers = np.asarray(payload["centers"], dtype=np.float64)
        labels, nearest = _hard_labels_of(X, centers, w > 0,
                                          model.disclosure.min_records_per_block)
        # a merged row keeps its place about its own centre (not under differential privacy)
        moved = None if model.privacy is not None else (centers, nearest)
        st = hard_sums(X, labels, w, np.asarray(payload["center"], dtype=np.float64),
                       model.cov_type, centers.shape[0], bool(payload.get("second", 1)), moved)
        return {f"stat/{k}": v for k, v in st.items()}
    if name == "loglik":
        from ...engine.contract.model import payload_params

        _, norm = gmm_log_resp(payload_params(payload), X, model.cov_type)
        return {"n": w.sum(axis=1), "loglik": np.where(w > 0, norm, 0.0).sum(axis=1)}
    raise KeyError(f"model 'gmm' has no batched client query {name!r}")


def _hard_labels_of(X: np.ndarray, centers: np.ndarray, real: np.ndarray, need: int):
    """The labels (C, m) of rows ``X`` (C, m, d) among ``centers`` (M, d) (:func:`hard_labels_
    batched` of their squared distances ``|x|^2 - 2 x.c + |c|^2``) and each real row's nearest
    centre before merging (a padding row's: its label). Compiled where numba pays, reading
    the distances from the products (:func:`~.hardsums.hard_labels_products`: the (C, m, M)
    array of them is never built); else that array, in place (the same bits: -2 is exact)."""
    P = X @ centers.T  # (the clients' stacked products: each client's own, bit for bit)
    xx, cc = np.einsum("cmd,cmd->cm", X, X), np.einsum("ij,ij->i", centers, centers)
    if worth(real.size):
        return kernels("fedlatent.models.gmm.hardsums").hard_labels_products(
            P, xx, cc, np.ascontiguousarray(real, dtype=np.bool_), int(need))
    P *= -2.0
    P += xx[:, :, None]
    P += cc
    nearest = P.argmin(axis=2)
    labels = hard_labels_numpy(P, real, int(need), nearest)
    return labels, np.where(real, nearest, labels)


def hard_labels_batched(d2: np.ndarray, real: np.ndarray, need: int) -> np.ndarray:
    """:func:`~fedlatent.models.gmm.model.hard_labels` of C clients at once: ``d2`` (C, m, M)
    squared distances, ``real`` (C, m) the clients' rows (False: padding, not counted).
    Labels (C, m), vectorized over the clients: compiled (:mod:`.hardsums`) where numba pays
    (:func:`~fedlatent.engine.protocol.compiled.worth`: many rows), else NumPy
    (:func:`hard_labels_numpy`)."""
    if not worth(real.size):
        return hard_labels_numpy(d2, real, int(need))
    kernel = kernels("fedlatent.models.gmm.hardsums").hard_labels_many
    return kernel(np.ascontiguousarray(d2, dtype=np.float64),
                  np.ascontiguousarray(real, dtype=np.bool_), int(need))


def hard_labels_numpy(d2: np.ndarray, real: np.ndarray, need: int,
                      nearest: np.ndarray | None = None) -> np.ndarray:
    """:func:`hard_labels_batched` in NumPy: each client's small cells (``0 < rows < need``)
    left out and the rows labelled there sent to their nearest cell left, until no client
    has one; a client whose every cell is small puts all its rows in its largest (as each
    client does alone, and as the compiled :func:`~.hardsums.hard_labels_many` does). Each
    pass relabels only the rows of the cells just left out, of the clients that have one.
    ``nearest``: ``d2.argmin(axis=2)`` if already made. Labels (C, m); a padding row's label
    is of no use."""
    first = d2.argmin(axis=2) if nearest is None else nearest.copy()
    return _merged_labels(d2, real, need, first)


def _merged_labels(d2: np.ndarray, real: np.ndarray, need: int,
                   labels: np.ndarray) -> np.ndarray:
    """The merging of :func:`hard_labels_numpy` from the nearest ``labels`` (C, m),
    updated in place and returned."""
    C, m, M = d2.shape
    if need <= 1 or labels.size == 0:
        return labels
    cl = np.arange(C)[:, None]
    counts = np.bincount((cl * M + labels)[real], minlength=C * M).reshape(C, M)
    gone = np.zeros((C, M), dtype=bool)
    live = np.arange(C)
    while live.size:
        cnt = counts[live]
        small = (cnt > 0) & (cnt < need) & ~gone[live]
        bad = small.any(axis=1)
        live, small, cnt = live[bad], small[bad], cnt[bad]
        every = small.sum(axis=1) == (cnt > 0).sum(axis=1)
        labels[live[every]] = cnt[every].argmax(axis=1)[:, None]
        live, small = live[~every], small[~every]
        gone[live] |= small
        c, i = np.nonzero(gone[live][np.arange(live.size)[:, None], labels[live]])
        c = live[c]
        if not c.size:
            continue
        old = labels[c, i]
        new = np.where(gone[c], np.inf, d2[c, i]).argmin(axis=1)
        labels[c, i] = new
        r = real[c, i]
        np.subtract.at(counts, (c[r], old[r]), 1)
        np.add.at(counts, (c[r], new[r]), 1)
    return labels


def hard_sums(X: np.ndarray, labels: np.ndarray, w: np.ndarray, center: np.ndarray,
              cov_type: str, M: int, second: bool = True,
              moved: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """:func:`~fedlatent.models.gmm.math.gmm_statistics` of C clients at hard ``labels``
    (C, m) among ``M`` centres, rows of weight ``w``: each row's terms added into its own
    cell, row after row, compiled where numba pays
    (:func:`~fedlatent.models.gmm.hardsums.hard_cell_sums`), else by :func:`cell_sums_numpy`
    (the same additions in the same order: the same bits, whatever the process ran before);
    without ``second``, only ``nk`` and ``sx``. ``moved``: ``(centers, nearest)``, the rows
    taken as :func:`~fedlatent.models.gmm.math.merged_rows` translates them (in the kernel's
    pass, without a copy of the rows)."""
    C, m, d = X.shape
    X = np.ascontiguousarray(X, dtype=np.float64)
    center = np.asarray(center, dtype=np.float64)
    mode = {"full": 0, "tied": 1}.get(cov_type, 2) if second else 1
    nk, sx = np.zeros((C, M)), np.zeros((C, M, d))
    sxx = np.zeros((C, M, d, d) if mode == 0 else (C, M, d, 1) if mode == 2 else (0, 0, 0, 0))
    labels = np.ascontiguousarray(labels)
    compiled = worth(C * m)
    if moved is not None and (not compiled or (second and mode == 1)):  # (tied: one product
        X, moved = merged_rows(X, moved[0], labels, moved[1]), None  # over the rows moved)
    args = (X, labels, np.ascontiguousarray(w, dtype=np.float64), center, nk, sx, sxx, mode)
    if compiled:
        centers, nearest = (np.zeros((M, d)), labels) if moved is None else moved
        kernels("fedlatent.models.gmm.hardsums").hard_cell_sums(
            *args, np.ascontiguousarray(centers, dtype=np.float64),
            np.ascontiguousarray(nearest, dtype=labels.dtype))
    else:
        cell_sums_numpy(*args)
    if not second:
        return {"nk": nk, "sx": sx}
    if mode == 1:
        Xc = (X - center) * w[:, :, None]
        sxx = np.ascontiguousarray(Xc.transpose(0, 2, 1)) @ (X - center)
    elif mode == 2:
        sxx = sxx[..., 0]
    return {"nk": nk, "sx": sx, "sxx": sxx}


def cell_sums_numpy(X, labels, w, center, nk, sx, sxx, mode) -> None:
    """:func:`~fedlatent.models.gmm.hardsums.hard_cell_sums` in NumPy: the rows added into
    their cells in the kernel's order (row ``i`` of every client at once: each client has
    one cell a row, so no two rows of a pass meet), the rows of weight 0 skipped, each term
    the kernel's product: the same bits, in one pass a row of the clients."""
    C, m, d = X.shape
    M = nk.shape[1]
    cells = (np.arange(C) * M)[:, None] + labels  # (C, m): a row's cell, flat
    nk1, sx1 = nk.reshape(-1), sx.reshape(C * M, d)
    sxx1 = sxx.reshape(C * M, -1) if mode in (0, 2) else None
    for i in range(m):
        c = np.flatnonzero(w[:, i] != 0.0)
        at, wt = cells[c, i], w[c, i]
        xc = X[c, i] - center
        wx = wt[:, None] * xc
        nk1[at] += wt
        sx1[at] += wx
        if mode == 0:
            sxx1[at] += (wx[:, :, None] * xc[:, None, :]).reshape(c.size, d * d)
        elif mode == 2:
            sxx1[at] += wx * xc


def live_cells(nk, sx, sxx):
    """Which cells (rows of ``nk`` (n,), ``sx`` (n, d), ``sxx`` (n, d, d)) hold anything
    but zeros (NaN counts as something). The server's check of the replies: NumPy (as fast
    as a compiled pass here, and nothing to compile)."""
    n = nk.shape[0]
    return ((nk != 0.0) | (sx.reshape(n, -1) != 0.0).any(axis=1)
            | (sxx.reshape(n, -1) != 0.0).any(axis=1))


def hard_suspects(stats, n_units: np.ndarray, cov_type: str) -> np.ndarray:
    """:func:`gaussian_suspects` of hard-assignment statistics: most (client, centre) cells
    are empty, all zeros (a zero moment matrix is PSD), so only the other cells are screened
    ("full"; the other types: :func:`gaussian_suspects`)."""
    from ...engine.protocol.psd_screen import bordered_certified

    if cov_type != "full":
        return gaussian_suspects(stats, n_units, cov_type)
    nk, sx, sxx = (np.ascontiguousarray(stats[k], dtype=np.float64) for k in ("nk", "sx", "sxx"))
    C, M, d = sx.shape
    bad = count_suspects(nk, n_units, None)
    cells = np.flatnonzero(live_cells(nk.reshape(-1), sx.reshape(-1, d), sxx.reshape(-1, d, d)))
    ok = bordered_certified(nk.ravel()[cells], sx.reshape(-1, d)[cells],
                            sxx.reshape(-1, d, d)[cells], None, _RTOL)
    bad[cells[~ok] // M] = True
    return bad


def gaussian_row_suspects(rows) -> np.ndarray:
    """:func:`gaussian_suspects` of full covariances, for reply rows as the server rebuilds them
    (a :class:`~fedlatent.engine.protocol.reply_rows.ReplyRows`), read where they are: every
    moment matrix is certified by the compiled
    :func:`~fedlatent.engine.protocol.psd_kernel.reply_bordered_kernel` (with the rows'
    rounding slack when they are rebuilt), the counts tested without slack (a superset of
    their failures with it); only the rows something flags are built and judged by
    :func:`gaussian_suspects`. Nothing of the size of the rows' statistics is allocated."""
    from ...engine.protocol.compiled import kernels

    kernel = kernels("fedlatent.engine.protocol.psd_kernel").reply_bordered_kernel
    K, d = np.shape(rows.template["sx"])
    off = rows.offsets()
    R, F = len(rows), rows.Q.shape[1]
    has_s, has_v = rows.S is not None, rows.V is not None
    tally = rows.tally  # (the round's weighted sum, taken as the rows are read)
    ok = kernel(np.ascontiguousarray(rows.Q, dtype=np.float64), rows.rows.astype(np.int64),
                rows.S if has_s else np.zeros(F), rows.V if has_v else np.zeros((1, F)),
                rows.vrow.astype(np.int64) if has_v else np.zeros(R, dtype=np.int64),
                rows.n, rows.eps * (1.0 - 1e-9) * rows.n,
                np.array([off["nk"], off["sx"], off["sxx"]], dtype=np.int64), K, d, has_s,
                _RTOL, np.zeros(0) if tally is None else tally.weights,
                np.zeros(0) if tally is None else tally.total,
                np.zeros(0, dtype=bool) if tally is None else tally.big)
    if tally is not None:
        tally.count += R
    unsure = np.flatnonzero(~ok.all(axis=1) | count_suspects(rows.block("nk"), rows.n, None))
    out = np.zeros(R, dtype=bool)
    if unsure.size:
        sub = rows.take(unsure)
        out[unsure] = gaussian_suspects(sub.stats(), sub.n, "full",
                                        sub.slack if sub.has_slack else None)
    return out


def count_suspects(counts: np.ndarray, n_units: np.ndarray, slack: np.ndarray | None,
                   rtol: float = 1e-8) -> np.ndarray:
    """Clients (rows of ``counts``, (C, K)) that may fail
    :func:`fedlatent.engine.protocol.messages.count_problem` with ``total=True``."""
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


#: clients whose moment matrices are built and screened at once (a few MiB, in cache)
_SCREEN_CHUNK = 2048


def _certify(nk, sx, sxx, cov_type: str, rows=None, slack=None) -> np.ndarray:
    """The vectorized screen of the moment matrices of clients (all, or the matrices ``rows``
    of the stack ``gaussian_moments`` makes), with the blocks' ``slack`` (same layout) or
    None. "full" reads each matrix from the blocks; the others build the stack."""
    from ...engine.protocol.psd_screen import bordered_certified, psd_certified

    if cov_type == "full":
        C, K, d = sx.shape

        def parts(a, b, c):
            a, b, c = a.reshape(C * K), b.reshape(C * K, d), c.reshape(C * K, d, d)
            return (a, b, c) if rows is None else (a[rows], b[rows], c[rows])

        return bordered_certified(*parts(nk, sx, sxx),
                                  None if slack is None else parts(*slack), _RTOL)
    M = gaussian_moments(nk, sx, sxx, cov_type)
    E = None if slack is None else gaussian_moments(*slack, cov_type)
    if rows is not None:
        M, E = M[rows], (None if E is None else E[rows])
    return psd_certified(M, E, _RTOL)


_RTOL = 1e-8


def gaussian_suspects(stats, n_units, cov_type: str, slack=None) -> np.ndarray:
    """Clients whose Gaussian blocks may fail ``gaussian_problem`` (a mask of shape (C,)).

    ``slack`` is None, the blocks' rounding bounds, or a callable ``slack(clients)`` giving
    them for some clients only (asked only for the clients the test without slack flags).
    The moment matrices are screened by the vectorized
    :func:`~fedlatent.engine.protocol.psd_screen.psd_certified` in chunks of clients; the few it
    does not certify are judged by :func:`~fedlatent.engine.protocol.messages.psd_failures` itself.
    """
    from ...engine.protocol.messages import psd_failures

    nk, sx, sxx = (np.asarray(stats[k], dtype=np.float64) for k in ("nk", "sx", "sxx"))
    C = nk.shape[0]
    get = slack if callable(slack) or slack is None else \
        (lambda rows: {k: np.asarray(slack[k])[rows] for k in ("nk", "sx", "sxx")})
    bad = count_suspects(nk, n_units, None)
    if bad.any() and get is not None:
        rows = np.flatnonzero(bad)
        bad[rows] = count_suspects(nk[rows], np.asarray(n_units)[rows], get(rows)["nk"])
    per = 1 if cov_type == "tied" else (sx.shape[1] * sx.shape[2] if cov_type in
                                        ("diag", "spherical") else sx.shape[1])
    ok = np.empty(C * per, dtype=bool)
    for lo in range(0, C, _SCREEN_CHUNK):
        hi = min(lo + _SCREEN_CHUNK, C)
        ok[lo * per:hi * per] = _certify(nk[lo:hi], sx[lo:hi], sxx[lo:hi], cov_type)
    sel = np.flatnonzero(~ok)  # not certified without slack: with it, or judged exactly
    if sel.size:
        clients, inv = np.unique(sel // per, return_inverse=True)
        at = inv.ravel() * per + sel % per  # the matrices in the stack of ``clients``
        mine = (nk[clients], sx[clients], sxx[clients])
        E = None
        if get is not None:
            e = get(clients)
            E = tuple(np.abs(np.asarray(e[k], dtype=np.float64)) for k in ("nk", "sx", "sxx"))
            ok[sel] = _certify(*mine, cov_type, at, E)
        rest = np.flatnonzero(~ok[sel])
        if rest.size:
            Mr = gaussian_moments(*mine, cov_type)[at[rest]]
            Er = None if E is None else gaussian_moments(*E, cov_type)[at[rest]]
            ix = np.arange(Mr.shape[1])
            with np.errstate(invalid="ignore"):
                sane = np.all(np.isfinite(Mr), axis=(1, 2)) & (np.min(Mr[:, ix, ix], axis=1)
                                                                >= 0.0)
            good = sane.copy()
            good[psd_failures(Mr, Er, _RTOL)] = False
            ok[sel[rest]] = good
    return bad | (~ok).reshape(C, per).any(axis=1)
