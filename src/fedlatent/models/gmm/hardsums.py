"""Compiled kernels of the "kmeans-sums" start's client query (``hard_stats``) for many
in-process clients at once: each row's nearest centre with small cells merged
(:func:`~fedlatent.models.gmm.model.hard_labels`, client by client), and the statistics of
each (client, centre) cell. One pass over the rows: a row adds its terms to its own cell
only, where the dense one-hot products (:func:`~fedlatent.models.gmm.math.gmm_statistics`)
would multiply every row by every centre's zero.

Compiled because they pay at scale: in NumPy (:func:`~fedlatent.models.gmm.batched.
hard_labels_numpy`, each merging pass over the rows of the cells just left out;
:func:`~fedlatent.models.gmm.batched.cell_sums_numpy`, a pass a row of the clients) the labels
take about 1.2 times as long at 20,000 clients of 10 rows and 32 candidate centres, the cells'
sums 3 to 8 times. A small federation does not pay numba's set-up: below
:data:`~fedlatent.engine.protocol.compiled.MIN_WORK` rows the start runs NumPy, the same
labels and sums bit for bit. The kernels are scalar
loops, which numba compiles in about 3 CPU seconds on a fresh machine (an empty on-disk cache;
:func:`~fedlatent.engine.protocol.compiled.kernels` says so); the server's check of the replies
(:func:`live_cells`) is NumPy.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .batched import live_cells  # noqa: F401  (NumPy: the server's check, named here too)

__all__ = ["hard_cell_sums", "hard_labels_many", "hard_labels_products", "live_cells"]


@njit(cache=True)
def _argmin_row(work, i, labels_c):
    """``labels_c[i] = argmin(work[i])`` (the first minimum, or the first NaN, as
    ``numpy.argmin``)."""
    M = work.shape[1]
    best, at = work[i, 0], 0
    if math.isnan(best):
        labels_c[i] = 0
        return
    for k in range(1, M):
        v = work[i, k]
        if math.isnan(v):
            labels_c[i] = k
            return
        if v < best:
            best, at = v, k
    labels_c[i] = at


@njit(cache=True)
def _merge_small(work, real_c, need, labels_c, counts, gone, small):
    """:func:`~fedlatent.models.gmm.model.hard_labels`'s merging of one client's cells of
    ``0 < rows < need`` into their rows' nearest cells left, in place, until none is small.

    A cell left out stays out, so only the rows of the cells just left out look for their
    nearest cell again (every other row's nearest is unchanged), and only the cells they
    move to can become small: each round costs the rows that move, not every row."""
    m, M = work.shape
    for k in range(M):  # (scalar loops throughout: numba compiles them in a second, where
        counts[k] = 0  # slice and fancy assignments cost it ten seconds on a fresh machine)
        gone[k] = False
    for i in range(m):
        if real_c[i]:
            counts[labels_c[i]] += 1
    n_full, n_small = 0, 0
    for k in range(M):
        if counts[k] > 0:
            n_full += 1
            if counts[k] < need:
                small[n_small] = k
                n_small += 1
    while n_small > 0:
        if n_small == n_full:  # no cell holds enough: every row to the largest
            big = 0
            for k in range(1, M):
                if counts[k] > counts[big]:
                    big = k
            for i in range(m):
                labels_c[i] = big
            return
        for j in range(n_small):
            gone[small[j]] = True
            for i in range(m):
                work[i, small[j]] = np.inf
        n_small = 0
        for i in range(m):
            old = labels_c[i]
            if not gone[old]:
                continue
            _argmin_row(work, i, labels_c)
            if real_c[i]:
                new = labels_c[i]
                counts[old] -= 1
                if counts[old] == 0:
                    n_full -= 1
                if counts[new] == 0:
                    n_full += 1
                counts[new] += 1
        for i in range(m):  # the cells rows moved to: small ones listed once
            k = labels_c[i]
            if real_c[i] and 0 < counts[k] < need and not gone[k]:
                listed = False
                for j in range(n_small):
                    listed = listed or small[j] == k
                if not listed:
                    small[n_small] = k
                    n_small += 1


@njit(cache=True)
def _label_client(work, real_c, need, labels_c, nearest_c, counts, gone, small):
    """One client's labels from its squared distances ``work`` (m, M), filled by the caller
    (consumed: left-out cells become inf): each row's nearest centre into ``nearest_c`` (a
    padding row's: its label), its label after :func:`_merge_small` into ``labels_c``."""
    m = work.shape[0]
    for i in range(m):
        _argmin_row(work, i, labels_c)
        nearest_c[i] = labels_c[i]
    if need > 1:
        _merge_small(work, real_c, need, labels_c, counts, gone, small)
    for i in range(m):
        if not real_c[i]:
            nearest_c[i] = labels_c[i]


@njit(cache=True)
def hard_labels_many(d2, real, need):
    """Labels (C, m) of rows with squared distances ``d2`` (C, m, M) to M centres, rows of
    ``real`` (C, m) counted (False: padding), cells of ``0 < rows < need`` merged as
    :func:`~fedlatent.models.gmm.model.hard_labels` merges them client by client."""
    C, m, M = d2.shape
    labels = np.empty((C, m), dtype=np.int64)
    nearest = np.empty(m, dtype=np.int64)  # (not returned)
    work = np.empty((m, M))
    counts = np.empty(M, dtype=np.int64)
    gone = np.empty(M, dtype=np.bool_)
    small = np.empty(M, dtype=np.int64)
    for c in range(C):
        for i in range(m):
            for k in range(M):
                work[i, k] = d2[c, i, k]
        _label_client(work, real[c], need, labels[c], nearest, counts, gone, small)
    return labels


@njit(cache=True)
def hard_labels_products(P, xx, cc, real, need):
    """:func:`hard_labels_many` of the squared distances ``((P * -2) + xx) + cc`` (the
    query's ``d2``, each entry made as NumPy makes it there, where the kernel reads it: the
    (C, m, M) array of distances is never built), from the products ``P = X @ centers.T``
    (C, m, M), the rows' ``xx`` (C, m) and the centres' ``cc`` (M,) squared norms. Returns
    the labels (C, m) and each row's nearest centre before any merging (C, m; a padding
    row's is its label), which :func:`~fedlatent.models.gmm.math.merged_rows` reads."""
    C, m, M = P.shape
    labels = np.empty((C, m), dtype=np.int64)
    nearest = np.empty((C, m), dtype=np.int64)
    work = np.empty((m, M))
    counts = np.empty(M, dtype=np.int64)
    gone = np.empty(M, dtype=np.bool_)
    small = np.empty(M, dtype=np.int64)
    for c in range(C):
        for i in range(m):
            for k in range(M):
                work[i, k] = (P[c, i, k] * -2.0 + xx[c, i]) + cc[k]
        _label_client(work, real[c], need, labels[c], nearest[c], counts, gone, small)
    return labels, nearest


@njit(cache=True)
def hard_cell_sums(X, labels, w, center, nk, sx, sxx, mode, centers, nearest):
    """Add to ``nk`` (C, M), ``sx`` (C, M, d) and ``sxx`` the terms of rows ``X`` (C, m, d)
    of weight ``w`` (C, m) at hard ``labels`` about ``center``: ``mode`` 0 full (``sxx``
    (C, M, d, d)), 2 diagonal (``sxx`` (C, M, d, 1)), 1 tied (``sxx`` left alone: the
    caller's one product over every row). A row whose label is not its ``nearest`` (C, m)
    of ``centers`` (M, d) is taken translated by the two centres' difference, as
    :func:`~fedlatent.models.gmm.math.merged_rows` translates it (the same operations)."""
    C, m, d = X.shape
    xc = np.empty(d)
    for c in range(C):
        for i in range(m):
            wt = w[c, i]
            if wt == 0.0:
                continue
            k = labels[c, i]
            near = nearest[c, i]
            nk[c, k] += wt
            for a in range(d):
                if near == k:
                    xc[a] = X[c, i, a] - center[a]
                else:
                    xc[a] = (X[c, i, a] + (centers[k, a] - centers[near, a])) - center[a]
                sx[c, k, a] += wt * xc[a]
            if mode == 0:
                for a in range(d):
                    for b in range(d):
                        sxx[c, k, a, b] += wt * xc[a] * xc[b]
            elif mode == 2:
                for a in range(d):
                    sxx[c, k, a, 0] += wt * xc[a] * xc[a]
