"""The batched clients' own model states along an accelerated path (``acceleration="newton"``).

The rows of :class:`~fedlatent.engine.node.batched.BatchedClients` for
:mod:`fedlatent.engine.node.pointstate`: which kept state each client holds, the extra
points' starts, the accepted point's adoption and the history kept after a step, as each
:class:`~fedlatent.engine.node.client.ClientNode` does one by one.
"""

from __future__ import annotations

import numpy as np

from fedlatent.engine.node.pointstate import (
    UnheldState,
    combination,
    history_rounds,
    in_key,
    out_key,
    point_round,
    stale,
)

__all__ = ["BatchedPointStates"]


class BatchedPointStates:
    """Point-state methods of :class:`~fedlatent.engine.node.batched.BatchedClients` (a
    mixin: it uses the batch's ``groups``, ``model``, ``_model_state`` and
    ``_commit_state``)."""

    def _held(self, idx: np.ndarray, prefix: str) -> dict[str, np.ndarray] | None:
        """The kept state ``prefix`` of the clients ``idx`` (None unless each holds it)."""
        g = self.groups.get(prefix)
        if g is None or not g.arrays or not bool(np.all(g.present[idx])):
            return None
        return {k: v[idx] for k, v in g.arrays.items()}

    def _point_starts(self, idx: np.ndarray, msg: dict, m: int, a_out, a_in) -> list:
        """Each extra point's start (rows: the clients ``idx``), as the clients form them;
        NotImplementedError when one names a state a client does not keep."""
        try:
            return [self.model.project_point_state(
                combination(msg, j, lambda p: self._held(idx, p), a_out, a_in), a_out)
                for j in range(1, m + 1)]
        except UnheldState as err:
            raise NotImplementedError(f"clients keep no state for {err}") from None

    def _accepted_state(self, idx: np.ndarray, msg: dict):
        """``(adopted, a_in)`` of the clients ``idx``: the model state of the point of the
        round before that the server accepted (``msg["accepted"] = j``; None for 0 or absent,
        the primary, whose state they hold) and what that point was stepped from (None: not
        kept), as :meth:`ClientNode._adopt_point <fedlatent.engine.node.client.ClientNode.
        _adopt_point>`; nothing changed. NotImplementedError when a client keeps no state for
        point ``j``: the clients then answer one by one, each refusing with the reason."""
        j, rnd = int(msg.get("accepted", 0) or 0), int(msg["round"])
        got = self._held(idx, out_key(rnd - 1, j)) if "history" in msg else None
        if j and got is None:
            raise NotImplementedError(f"clients keep no state for accepted point {j}")
        a_in = self._held(idx, in_key(rnd - 1, j)) if "history" in msg else None
        return (got if j else None), a_in

    def _keep_history(self, idx: np.ndarray, msg: dict) -> None:
        """:meth:`ClientNode._keep_history <fedlatent.engine.node.client.ClientNode.
        _keep_history>` for the clients ``idx`` (groups no client holds any more dropped),
        after the step, with the state the round started from (kept by :meth:`_points`)."""
        before, rnd = getattr(self, "_start", None), int(msg["round"])
        self._start = None
        hist = history_rounds(msg)
        for prefix in [p for p in self.groups if point_round(p)]:
            if hist is None or stale(prefix, rnd, hist):
                g = self.groups[prefix]
                g.present[idx] = False
                if not g.present.any():
                    del self.groups[prefix]
        if hist is not None and before:
            self._commit_state(idx, before, in_key(rnd, 0))
            self._commit_state(idx, self._model_state(idx), out_key(rnd, 0))
