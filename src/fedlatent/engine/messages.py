"""Messages between server and clients: flat dicts of arrays and scalars.

Nested collections (parameters, statistics) are stored under prefixes ``"params/"``,
``"S_hat/"``, ``"delta/"``...  A message holds only ndarrays, Python scalars and strings, so it maps
one to one onto Flower's records (ArrayRecord + ConfigRecord) and onto .npz + JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .stats import Stats

__all__ = ["ClientReplyError", "pack", "unpack", "message_nbytes", "check_reply"]

Message = dict[str, Any]


class ClientReplyError(RuntimeError):
    """A client's reply failed validation; nothing of it was aggregated."""

    def __init__(self, client: str, reason: str):
        self.client = client
        self.reason = reason
        super().__init__(f"client {client!r} sent an invalid reply: {reason}")


def pack(prefix: str, arrays: Mapping[str, np.ndarray]) -> Message:
    return {f"{prefix}/{k}": np.asarray(v) for k, v in arrays.items()}


def unpack(msg: Mapping[str, Any], prefix: str) -> dict[str, np.ndarray]:
    p = prefix + "/"
    return {k[len(p) :]: np.asarray(v) for k, v in msg.items() if k.startswith(p)}


def message_nbytes(msg: Mapping[str, Any]) -> int:
    """Bytes a message takes on the wire if sent uncompressed (arrays as float64, scalars 8)."""
    total = 0
    for k, v in msg.items():
        total += len(k)
        if isinstance(v, np.ndarray):
            total += v.nbytes
        elif isinstance(v, str | bytes):
            total += len(v)
        else:
            total += 8
    return total


def check_reply(
    client: str,
    reply: Mapping[str, Any] | None,
    expected: Mapping[str, tuple[int, ...]],
    prefix: str = "delta",
    scalars: tuple[str, ...] = ("n", "objective"),
) -> Stats:
    """Validate a statistics reply: every block present, right shape, finite values.

    Returns the statistics as Stats; raises ClientReplyError with the reason otherwise.
    """
    if reply is None:
        raise ClientReplyError(client, "no reply")
    got = unpack(reply, prefix)
    missing = [k for k in expected if k not in got]
    if missing:
        raise ClientReplyError(client, f"missing statistic(s) {missing}")
    extra = [k for k in got if k not in expected]
    if extra:
        raise ClientReplyError(client, f"unexpected statistic(s) {extra}")
    for k, shp in expected.items():
        if tuple(got[k].shape) != tuple(shp):
            raise ClientReplyError(
                client, f"statistic {k!r} has shape {tuple(got[k].shape)}, expected {tuple(shp)}"
            )
        if not np.all(np.isfinite(got[k])):
            raise ClientReplyError(client, f"statistic {k!r} has non-finite values")
    for s in scalars:
        if s not in reply:
            raise ClientReplyError(client, f"missing scalar {s!r}")
        v = reply[s]
        if not np.isfinite(float(v)):
            raise ClientReplyError(client, f"scalar {s!r} is not finite ({v!r})")
    return Stats({k: got[k] for k in expected}, copy=False)
