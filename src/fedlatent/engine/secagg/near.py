"""A client's closed neighbourhood by position: what an exchange looks up, ordered once.

Every per-exchange step of :class:`~fedlatent.engine.secagg.client.SecAggClient` works over its
closed neighbourhood on the masking graph (sorted ids, itself among them; every enrolled id on
the complete graph). :class:`Near` holds, in that order, what those steps would otherwise look
up by name once per neighbour and exchange: each member's place, the AES-256-GCM object of each
pair's mask secret (:func:`~._crypto.ctr_streams`, made on first use, once per fit) and the
shares this client holds (one row per member). It is a cache of the client's state (its
roster, pair secrets and opened shares), rebuilt from them after :meth:`SecAggClient.load`,
never dumped: nothing in it is new, and no secret in it leaves the client.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto

__all__ = ["Near"]


class Near:
    """The closed neighbourhood ``ids`` (sorted) of client ``me``, by position.

    Parameters
    ----------
    ids : sequence of str
        The closed neighbourhood, sorted (the order of the participants' bits, the
        confirmations and the tokens).
    me : str
        The client (one of ``ids``).
    """

    def __init__(self, ids: Sequence[str], me: str):
        self.ids = list(ids)
        self.place = {u: i for i, u in enumerate(self.ids)}
        self.me = self.place[me]
        self._streams: list = [None] * len(self.ids)
        self._held: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ids)

    def at(self, names: Sequence[str]) -> np.ndarray:
        """The positions of ``names`` (members; KeyError otherwise), an intp array."""
        return np.fromiter(map(self.place.__getitem__, names), np.intp, len(names))

    def names(self, pos: np.ndarray) -> list[str]:
        """The members at positions ``pos``."""
        ids = self.ids
        return [ids[i] for i in pos.tolist()]

    def absent(self, pos: np.ndarray) -> tuple[str, ...]:
        """The members not at positions ``pos`` (distinct), sorted: none, by one comparison,
        when ``pos`` holds every member (the common case: no set built every exchange)."""
        if len(pos) == len(self.ids):
            return ()
        held = set(pos.tolist())
        return tuple(u for i, u in enumerate(self.ids) if i not in held)

    def streams(self, pos: np.ndarray, secrets: Callable[[list[str]], list[bytes]]) -> list:
        """The AES-256-GCM object of the mask secret of this client's pair with each member at
        ``pos`` (itself never among them); those not made yet made in one pass from
        ``secrets(names)`` (their 32-byte mask secrets s_uv)."""
        have = self._streams
        out = [have[i] for i in pos.tolist()]
        if None in out:
            todo = sorted({int(i) for i, f in zip(pos.tolist(), out) if f is None})
            for i, f in zip(todo, _crypto.ctr_streams(secrets([self.ids[i] for i in todo]))):
                have[i] = f
            out = [have[i] for i in pos.tolist()]
        return out

    def held(self, blobs: dict[str, bytes], pos: np.ndarray, slot: int, size: int
             ) -> np.ndarray:
        """This client's shares of slot ``slot`` of the seeds of the members at ``pos``, a
        (len(pos), size) uint8 array (each member's opened share message ``blobs[member]``,
        ``size`` bytes a slot); the table of every member's messages is made once."""
        table = self._held
        if table is None or len(blobs) != self._held_n:
            width = max((len(b) for b in blobs.values()), default=0)
            table = np.zeros((len(self.ids), width), dtype=np.uint8)
            for u, b in blobs.items():
                i = self.place.get(u)
                if i is not None and len(b) == width:
                    table[i] = np.frombuffer(b, dtype=np.uint8)
            self._held, self._held_n = table, len(blobs)
        return table[pos, slot * size:(slot + 1) * size]
