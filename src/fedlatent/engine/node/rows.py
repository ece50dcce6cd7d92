"""Rows of a batch's reply: a run of client positions read as a slice (a view, no scatter),
and a batched step's statistics, counts, objectives and states written at its rows
(:class:`~fedlatent.engine.node.batched.BatchedClients`; the server's reply screen reads rows
the same way)."""

from __future__ import annotations

import numpy as np

__all__ = ["as_slice", "put_step"]


def as_slice(rows: np.ndarray):
    """``rows`` as a slice when they are consecutive and ascending (a view, no scatter)."""
    if rows.size and rows[-1] - rows[0] == rows.size - 1 and (
            rows.size < 2 or bool(np.all(np.diff(rows) == 1))):
        return slice(int(rows[0]), int(rows[-1]) + 1)
    return rows


def put_step(step, outs, rows, Q: np.ndarray, n: np.ndarray, obj: np.ndarray,
              new_state: dict[str, np.ndarray]) -> None:
    """A batched step written at ``rows`` of the reply ``Q``, ``n``, ``obj`` and ``new_state``
    (each (A, ...)), but for statistics it wrote into its views ``outs`` already."""
    col = 0
    for k, v in step.stats.items():
        written = outs is not None and v is outs.get(k)
        v = v.reshape(v.shape[0], -1)
        if not written:
            Q[rows, col:col + v.shape[1]] = v
        col += v.shape[1]
    n[rows], obj[rows] = step.n, step.objective
    for k, v in step.state.items():
        if k not in new_state:
            new_state[k] = np.empty((n.size, *v.shape[1:]), dtype=v.dtype)
        new_state[k][rows] = v
