"""Messages between server and clients: flat dicts of arrays and scalars.

Nested collections (parameters, statistics) are stored under prefixes ``"params/"``,
``"S_hat/"``, ``"delta/"``...  A message holds only ndarrays, Python scalars and strings, so it maps
one to one onto Flower's records (ArrayRecord + ConfigRecord) and onto .npz + JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .stats import Stats

__all__ = [
    "ClientReplyError",
    "Expect",
    "array",
    "check_fields",
    "check_reply",
    "message_nbytes",
    "number",
    "pack",
    "text",
    "unpack",
]

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


@dataclass(frozen=True)
class Expect:
    """What one entry of a reply must be.

    Attributes
    ----------
    shape : tuple or None
        None for a scalar number; otherwise the array's shape, with None for a free dimension
        (``(None, d)``: any number of rows of width ``d``).
    low : float or None
        Smallest allowed value (``0`` for counts).
    finite : bool
        Whether every value must be finite.
    is_text : bool
        A string (a JSON document, a name); no numeric checks.
    """

    shape: tuple[int | None, ...] | None = None
    low: float | None = None
    finite: bool = True
    is_text: bool = False


def number(low: float | None = None) -> Expect:
    """A finite scalar (at least ``low`` when given)."""
    return Expect(None, low)


def array(*shape: int | None, low: float | None = None) -> Expect:
    """A finite array of ``shape`` (None: any length along that axis)."""
    return Expect(tuple(shape), low)


def text() -> Expect:
    return Expect(is_text=True)


def check_fields(
    client: str, reply: Mapping[str, Any], expect: Mapping[str, Expect], noun: str = "value"
) -> None:
    """Raise ClientReplyError unless every entry of ``expect`` is in ``reply`` as expected."""
    missing = [k for k in expect if k not in reply]
    if missing:
        raise ClientReplyError(client, f"missing {noun}(s) {missing}")
    for k, e in expect.items():
        v = reply[k]
        if e.is_text:
            if not isinstance(v, str | bytes | np.str_):
                raise ClientReplyError(client, f"{noun} {k!r} is not text")
            continue
        if e.shape is None:
            try:
                a = np.asarray(v, dtype=np.float64)
            except (TypeError, ValueError):
                raise ClientReplyError(client, f"{noun} {k!r} is not a number ({v!r})") from None
            if a.ndim != 0:
                raise ClientReplyError(client, f"{noun} {k!r} has shape {a.shape}, expected a "
                                       "number")
            if e.finite and not np.isfinite(a):
                raise ClientReplyError(client, f"{noun} {k!r} is not finite ({v!r})")
        else:
            a = np.asarray(v)
            if a.dtype.kind not in "biuf":
                raise ClientReplyError(client, f"{noun} {k!r} is not numeric ({a.dtype})")
            if a.ndim != len(e.shape) or any(
                w is not None and int(n) != int(w) for n, w in zip(a.shape, e.shape)
            ):
                want = tuple("any" if w is None else w for w in e.shape)
                raise ClientReplyError(
                    client, f"{noun} {k!r} has shape {tuple(a.shape)}, expected {want}"
                )
            if e.finite and not np.all(np.isfinite(a)):
                raise ClientReplyError(client, f"{noun} {k!r} has non-finite values")
        if e.low is not None and np.any(a < e.low):
            raise ClientReplyError(client, f"{noun} {k!r} has values below {e.low}")


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
    extra = [k for k in got if k not in expected]
    if extra and all(k in got for k in expected):
        raise ClientReplyError(client, f"unexpected statistic(s) {extra}")
    check_fields(client, got, {k: array(*shp) for k, shp in expected.items()}, "statistic")
    check_fields(client, reply, {s: number() for s in scalars}, "scalar")
    return Stats({k: got[k] for k in expected}, copy=False)
