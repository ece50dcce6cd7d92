"""What the server records in a fit: every message that crosses, in order, and every secure sum.

The in-process runtime with ``record=True`` keeps each message as it crossed (a copy, as if it
had gone over a wire). Under secure aggregation a client's reply is masked; what the server
learns is the unmasked sum of each exchange over its survivors, which
:meth:`SecureChannel.sum <fedlatent.engine.secagg.secure.SecureChannel.sum>` returns to the
server: :func:`record_fit` taps that return value (nothing the server does not hold).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import numpy as np

from fedlatent.engine.protocol.messages import ERROR_KEY
from fedlatent.engine.secagg.secure import SecureChannel
from fedlatent.engine.transport.inprocess import InProcessRuntime

__all__ = ["Exchange", "SecureSum", "Transcript", "record_fit"]


@dataclass(frozen=True)
class Exchange:
    """One message to a client and its reply, as they crossed."""

    client: str
    method: str
    down: dict[str, Any]
    up: dict[str, Any]

    @property
    def masked(self) -> bool:
        return "secagg/slot" in self.down or self.method == "secagg"

    @property
    def refused(self) -> bool:
        return ERROR_KEY in self.up


@dataclass(frozen=True)
class SecureSum:
    """One secure exchange: the unmasked sums over ``cohort`` and the message they answered.

    ``sums`` are as the server decodes them: for a round (``method == "estep"``) the fields
    ``delta/<name>`` hold ``sum_c w_c Q_c`` with the public weights ``weights``; every other
    field (and every field of a query) is the plain sum over the cohort."""

    round: int
    exchange: str
    method: str
    cohort: tuple[str, ...]
    weights: dict[str, float]
    message: dict[str, Any]
    sums: dict[str, np.ndarray]


@dataclass
class Transcript:
    """Everything the server holds after a fit (or after the fit stopped: ``error``)."""

    exchanges: list[Exchange] = field(default_factory=list)
    secure: list[SecureSum] = field(default_factory=list)
    n_units: dict[str, float] = field(default_factory=dict)
    error: BaseException | None = None

    def of(self, client: str) -> list[Exchange]:
        """Client ``client``'s exchanges in the clear (not masked, not refused)."""
        return [e for e in self.exchanges
                if e.client == client and not e.masked and not e.refused]

    def smallest_client(self) -> str | None:
        """The client with the fewest units (the server knows every client's units)."""
        if not self.n_units:
            return None
        return min(self.n_units, key=lambda c: (self.n_units[c], c))


def _pairs(log) -> list[Exchange]:
    out, pending = [], {}
    for direction, cid, method, msg in log:
        if direction == "down":
            pending[cid] = msg
        else:
            out.append(Exchange(cid, method, pending.pop(cid, {}), msg))
    return out


def record_fit(est, fd) -> Transcript:
    """Fit ``est`` on ``fd`` in process and return what the server recorded.

    An exception of the fit (a refusal, a stop) is kept in ``Transcript.error``: what crossed
    before it is still the server's."""
    rt = InProcessRuntime(fd, record=True)
    tr = Transcript()
    original = SecureChannel.sum

    def tap(channel, method, msgs, *, round, exchange, weights=None):
        res = original(channel, method, msgs, round=round, exchange=exchange, weights=weights)
        tr.secure.append(SecureSum(
            int(round), str(exchange), str(method), tuple(res["survivors"]),
            {c: float((weights or {}).get(c, 0.0)) for c in res["survivors"]},
            dict(next(iter(msgs.values()))),
            {k: np.array(v, dtype=np.float64) for k, v in res["sums"].items()}))
        return res

    with mock.patch.object(SecureChannel, "sum", tap):
        try:
            est.fit(fd, runtime=rt)
        except Exception as err:  # noqa: BLE001 - kept: what crossed before it is recorded
            tr.error = err
    tr.exchanges = _pairs(rt.log)
    for e in tr.exchanges:
        if e.method == "setup" and "n_units" in e.up:
            tr.n_units[e.client] = float(e.up["n_units"])
    return tr
