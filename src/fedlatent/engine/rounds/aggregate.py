"""What a collector returns: the round's accepted replies summed, and the round's record."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fedlatent.engine.fedem.update import dominant_client
from fedlatent.engine.node.batched import BatchReply
from fedlatent.engine.stats import Stats

__all__ = ["EXCLUDED_SINCE", "Aggregate", "Stacked", "Accepted", "round_complete"]

#: how a round names a client excluded in an earlier round (secure aggregation leaves a client
#: that dropped or broke the checks out for the rest of the fit)
EXCLUDED_SINCE = "excluded since "


def round_complete(missing, errors, rejected) -> bool:
    """Whether a round had every reply of the clients still in the fit: none refused and
    none missing but those excluded in an earlier round (``errors``: ``excluded since ...``),
    so the rounds after an exclusion can meet a stopping rule."""
    return not rejected and all(str(errors.get(c, "")).startswith(EXCLUDED_SINCE)
                                for c in missing)


@dataclass
class Stacked:
    """The well-formed replies of one exchange as rows, and what became of the others.

    Attributes
    ----------
    rows : BatchReply or None
        One row per well-formed reply, in client order (None: none).
    missing : list of str
        Clients that did not answer or raised (``errors`` has the exception's text).
    errors : dict of str to str
    malformed : dict of int to str
        Position -> why the reply is not well formed (a block missing, a wrong shape, a
        non-finite value).
    """

    rows: BatchReply | None
    missing: list[str] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    malformed: dict[int, str] = field(default_factory=dict)


@dataclass
class Accepted:
    """The rows a round aggregated (what the mirror of the control variates follows).

    Attributes
    ----------
    rows : BatchReply or None
        The round's well-formed replies.
    mask : ndarray of bool
        Which rows were aggregated.
    refused : ndarray of int
        Positions of the clients whose reply was refused (malformed or breaking invariants).
    absent : ndarray of int
        Positions of the clients that did not answer (and did not raise).
    ids : list of str
        Every client of the run, by position.
    w : ndarray
        Every client's weight, by position.
    """

    rows: BatchReply | None
    mask: np.ndarray
    refused: np.ndarray
    absent: np.ndarray
    ids: list[str]
    w: np.ndarray

    def dominant(self) -> str | None:
        """Why the aggregate is one client's
        (:func:`~fedlatent.engine.fedem.update.dominant_client`)."""
        if self.rows is None:
            return None
        r = np.flatnonzero(self.mask)
        pos = self.rows.clients[r]
        return dominant_client([self.ids[i] for i in pos], self.rows.Q[r], self.w[pos]) \
            if r.size else None


@dataclass
class Aggregate:
    """One round's replies, screened and summed: the same small type from every collector.

    Attributes
    ----------
    total : Stats or None
        ``sum_c w_c Q_c`` over the accepted replies (the statistics themselves in the
        initialization round, the differences after); None when nothing was accepted.
    participants : int
        Replies aggregated.
    objective_sum : float
        Sum of their objectives.
    units : int
        Sum of their units.
    bytes_down, bytes_up : int
    missing : list of str
    rejected : dict of str to str
    errors : dict of str to str
    skipped : str
        Why nothing crossed ("" when the round ran).
    accepted : Accepted or None
        The rows aggregated (None when the server sees only a sum: secure aggregation).
    points : list of (Stats, float)
        A multi-point round's extra points ``x_j`` (:attr:`RoundPlan.points`), in order: the
        weighted sum ``sum_c w_c S_c(T(x_j))`` of the accepted clients' mean statistics (the
        EM map ``F(x_j)`` when every client is accepted) and the sum of their objectives at
        ``T(x_j)``, over the same clients as ``total``; empty for an ordinary round (and,
        as ``total`` is None, when no reply was accepted or the round was skipped).
    """

    total: Stats | None
    participants: int
    objective_sum: float
    units: int
    bytes_down: int
    bytes_up: int
    missing: list[str]
    rejected: dict[str, str]
    errors: dict[str, str]
    skipped: str = ""
    accepted: Accepted | None = None
    points: list[tuple[Stats, float]] = field(default_factory=list)

    def dominant(self) -> str | None:
        """Why the aggregate is one client's, or None (unknown under secure aggregation)."""
        return None if self.accepted is None else self.accepted.dominant()
