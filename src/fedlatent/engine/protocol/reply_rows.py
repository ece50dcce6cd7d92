"""Some rows of a round's replies as the statistics the server rebuilds from them, without
building them.

A reply row ``Q_c`` (a mean over the client's units) is, for the server, the statistic
``S_c = Q_c + S_hat + V_c`` (``S_hat`` None: the row is ``S_c``; ``V`` None: no control
variates), scaled to sums by the client's units ``n_c``; each entry carries a rounding bound
``REBUILD_EPS (|Q_c| + |S_hat| + |V_c|) n_c`` (a hair under it, as the screen uses it).
:class:`ReplyRows` holds the parts; :meth:`~ReplyRows.stats` and :meth:`~ReplyRows.slack`
build the blocks of a chunk of rows, and a model's compiled check can read the parts
directly (:meth:`~fedlatent.engine.contract.model.FederatedModel.check_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["MAX_SUM", "ReplyRows", "RowSum"]

#: sums beyond this magnitude cannot be aggregated (a weighted mean of them overflows): the
#: screen's bound on a reply's entries times its units
MAX_SUM = 1e306

#: rows whose statistics are built at once by :meth:`ReplyRows.chunks` (a few MiB, in cache)
CHUNK = 2048


class RowSum:
    """``sum_r w_r Q_r`` taken by a model's compiled check while it reads the rows (the
    round's weighted sum without a second pass over the replies): ``total`` (F,), begun at
    -0.0 (the first row added is then that row, bit for bit); ``count``: the rows added, in
    the order they were read. The screen uses it only when every row was added once, in
    order, and accepted; else the sum is taken apart, as without it. ``big`` (A,): the rows
    the check read that fail the screen's size test (an entry not finite, or beyond
    ``MAX_SUM`` times their units)."""

    def __init__(self, weights: np.ndarray, width: int):
        self.weights = np.ascontiguousarray(weights, dtype=np.float64)
        self.total = np.full(width, -0.0)
        self.big = np.zeros(self.weights.shape[0], dtype=bool)
        self.count = 0


@dataclass(frozen=True)
class ReplyRows:
    """The statistics ``S_c n_c`` of rows ``rows`` of the replies ``Q``.

    Attributes
    ----------
    Q : ndarray of shape (A, F)
        The round's reply rows (read only).
    rows : ndarray of int, shape (R,)
        The rows meant (indices into ``Q``).
    n : ndarray of shape (R,)
        Their units (the scale of the sums).
    S : ndarray of shape (F,) or None
        ``S_hat`` flattened; None when the rows are the statistics themselves (no slack).
    V : ndarray of shape (C, F) or None
        The clients' control variates as the server mirrors them; row ``vrow[i]`` is row
        ``i``'s client's.
    vrow : ndarray of int, shape (R,) or None
    template : Stats
        The blocks' names and shapes (the rows' layout).
    eps : float
        The rounding bound per unit of magnitude.
    work : int
        The rows of the whole screen these belong to (a model's check decides from it
        whether compiling pays; 0: these rows).
    tally : RowSum or None
        Where a compiled check that reads every row adds ``w_r Q_r`` (weights per row of
        ``Q``); None, and in any part of these rows (:meth:`take`): no sum.
    """

    Q: np.ndarray
    rows: np.ndarray
    n: np.ndarray
    S: np.ndarray | None
    V: np.ndarray | None
    vrow: np.ndarray | None
    template: object
    eps: float
    work: int = 0
    tally: RowSum | None = None

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    @property
    def has_slack(self) -> bool:
        """Whether the statistics are rebuilt (their entries carry a rounding slack)."""
        return self.S is not None

    def offsets(self) -> dict[str, int]:
        """The first column of each block in a row."""
        out, col = {}, 0
        for key, v in self.template.items():
            out[key] = col
            col += int(np.size(v))
        return out

    def take(self, at) -> ReplyRows:
        """Rows ``at`` of these (a slice or indices)."""
        return ReplyRows(self.Q, self.rows[at], self.n[at], self.S, self.V,
                         None if self.vrow is None else self.vrow[at], self.template,
                         self.eps, self.work)

    def chunks(self):
        """These rows, :data:`CHUNK` at a time."""
        return (self.take(slice(lo, min(lo + CHUNK, len(self))))
                for lo in range(0, len(self), CHUNK))

    def block(self, key: str) -> np.ndarray:
        """Block ``key`` of the statistics ``S_c n_c`` (R, ...), rebuilt from its columns
        only."""
        lo = self.offsets()[key]
        shape = np.shape(self.template[key])
        cols = slice(lo, lo + int(np.prod(shape, dtype=np.int64)))
        out = self.Q[self.rows, cols]
        if self.S is not None:
            out = out + self.S[None, cols]
            if self.V is not None:
                out += self.V[self.vrow, cols]
        out = out * self.n[:, None]
        return out.reshape(len(self), *shape)

    def flat(self) -> np.ndarray:
        """``S_c n_c`` of every row (R, F): ``((Q_c + S_hat) + V_c) n_c``, as the server
        rebuilds one reply."""
        if self.S is None:
            return self.Q[self.rows] * self.n[:, None]
        S_c = self.Q[self.rows] + self.S[None, :]
        if self.V is not None:
            S_c += self.V[self.vrow]
        S_c *= self.n[:, None]
        return S_c

    def stats(self) -> dict[str, np.ndarray]:
        """:meth:`flat` as blocks, each stacked (R, ...)."""
        return _blocks(self.template, self.flat())

    def slack(self, r: np.ndarray) -> dict[str, np.ndarray]:
        """The blocks' rounding bounds of rows ``r`` (indices into these rows):
        ``((|Q_c| + |S_hat|) + |V_c|) eps n_c``, a hair under the bound the exact check
        uses."""
        out = np.abs(self.Q[self.rows[r]]) + np.abs(self.S)[None, :]
        if self.V is not None:
            out += np.abs(self.V[self.vrow[r]])
        out *= (self.eps * (1.0 - 1e-9) * self.n[r])[:, None]
        return _blocks(self.template, out)


def _blocks(template, flat: np.ndarray) -> dict[str, np.ndarray]:
    """The columns of ``flat`` (R, F) as the template's blocks, each (R, ...)."""
    out, lo = {}, 0
    for key, v in template.items():
        size = int(np.size(v))
        out[key] = flat[:, lo:lo + size].reshape(flat.shape[0], *np.shape(v))
        lo += size
    return out
