"""The FedEM client update, written once for one client and for a batch of clients (a batch of
one is the per-client case).

Given each client's statistic (sums over its rows, or already means), the round's ``S_hat``
and the clients' control variates ``V_c``::

    Delta_c = S_c - S_hat - V_c ;  Q_c = Quant(Delta_c) ;  V_c += alpha Q_c

(the initialization round sends ``S_c`` itself). :class:`~fedlatent.engine.node.client.ClientNode`
calls it with one row, :class:`~fedlatent.engine.node.batched.BatchedClients` with a chunk of rows;
the operations, element by element, are the same, so the two paths give the same bits.
"""

from __future__ import annotations

import numpy as np

from fedlatent.engine.fedem.streams import quantize_flat

__all__ = ["fedem_rows"]


def fedem_rows(d: np.ndarray, n: np.ndarray | None, S_flat: np.ndarray | None,
               V: np.ndarray | None, had: np.ndarray | None, *, levels: int = 0,
               sizes: list[int] | None = None, uniforms: np.ndarray | None = None,
               alpha: float = 1.0, cv: bool = False,
               out: np.ndarray | None = None) -> np.ndarray | None:
    """Make the rows ``d`` of statistics into the rows of the reply, in place; return the
    clients' new control variates (None without control variates).

    Parameters
    ----------
    d : ndarray of shape (A, F)
        The clients' statistics: sums (divided here by ``n``) or, with ``n`` None, means.
    n : ndarray of shape (A,) or None
        Units summed per client (None: ``d`` holds means already).
    S_flat : ndarray of shape (1, F) or None
        ``S_hat`` flattened (None: the initialization round, ``d`` is sent as it is).
    V : ndarray of shape (A, F) or None
        The clients' control variates (rows of those that have none are ignored).
    had : ndarray of bool, shape (A,) or None
        Which clients have a control variate.
    levels : int
        Quantizer levels (0: none); ``sizes`` are the blocks' sizes and ``uniforms`` (A, F)
        the clients' counter-based uniforms
        (:func:`~fedlatent.engine.fedem.streams.stream_uniforms`).
    alpha : float
        Control-variate step.
    cv : bool
        Whether to update the control variates (``V_c += alpha Q_c``; a client without one
        starts from 0).
    out : ndarray of shape (A, F) or None
        Where to write the new control variates (``V`` itself: updated in place).
    """
    if n is not None:
        d /= np.maximum(n, 1)[:, None]
    if S_flat is not None:
        d -= S_flat  # S_c - S_hat - V_c
        if V is not None:
            if had.all():
                d -= V
            elif had.any():
                d[had] -= V[had]
    if levels > 0:
        d[...] = quantize_flat(d, sizes, levels, uniforms)
    if not cv:
        return None
    step = alpha * d if alpha != 1.0 else d
    base = V if had.all() else np.where(had[:, None], V, 0.0)
    return base + step if out is None else np.add(base, step, out=out)
