"""Messages between server and clients: flat dicts of arrays and scalars.

Nested collections (parameters, statistics) are stored under prefixes ``"params/"``,
``"S_hat/"``, ``"delta/"``...  A message holds only ndarrays, Python scalars and strings, so it maps
one to one onto Flower's records (ArrayRecord + ConfigRecord) and onto .npz + JSON.

A multi-point round (accelerated EM, :attr:`~fedlatent.engine.rounds.plan.RoundPlan.points`):
the round message carries ``points = m`` and each extra point's parameters under
``params{j}/`` (j = 1..m); the E-step reply carries, beside ``delta/``, ``n`` and
``objective``, each point's mean statistic under ``point{j}/`` (the blocks of ``delta/``,
raw: no ``S_hat``, control variate or quantizer) and its objective ``objective{j}``
(:func:`point_keys`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedlatent.engine.stats import Stats

__all__ = [
    "ERROR_KEY",
    "REFUSED_KEY",
    "ClientReplyError",
    "Expect",
    "bordered",
    "count_problem",
    "equal_problem",
    "fault_detail",
    "frozen",
    "refusal_detail",
    "psd_failures",
    "psd_problem",
    "same_frozen",
    "array",
    "refusal_reply",
    "check_fields",
    "check_reply",
    "check_rows",
    "message_nbytes",
    "number",
    "objective_field",
    "pack",
    "point_keys",
    "statistic_field",
    "text",
    "unpack",
]

Message = dict[str, Any]

#: the key of a client's reply that reports an exception on the client instead of a result
ERROR_KEY = "engine/error"
#: beside :data:`ERROR_KEY`, the rule by which the client *refused* (a disclosure rule, its
#: site's policy): not a failure, so a fit's setup may leave that client out and go on
REFUSED_KEY = "engine/refused"


def refusal_reply(text: str, rule: str) -> dict[str, str]:
    """The reply of a client that refuses by ``rule`` (``text``: who, the rule, the fix)."""
    return {ERROR_KEY: str(text), REFUSED_KEY: str(rule)}


class ClientReplyError(RuntimeError):
    """A client's reply failed validation; nothing of it was aggregated. ``refused``: the rule
    by which the client refused (its reply carried :data:`REFUSED_KEY`), "" for a failure."""

    def __init__(self, client: str, reason: str, refused: str = ""):
        self.client = client
        self.reason = reason
        self.refused = str(refused)
        super().__init__(f"client {client!r} sent an invalid reply: {reason}")


def fault_detail(faults: Mapping[str, str], limit: int | None = None) -> str:
    """``"client 'a': why (also clients 'c', 'd'); client 'b': why2; and 333 more client(s)"``:
    the clients grouped by reason (in order of appearance), at most ``limit`` of them named (default
    :data:`~fedlatent.data.validation.NAMES_SHOWN`, 10), so a message about thousands of
    clients stays short; the caller keeps the full mapping.

    Parameters
    ----------
    faults : mapping of str to str
        Client -> why it is named.
    limit : int or None
        How many clients to name.

    Returns
    -------
    str
    """
    return _grouped_detail(faults, limit, by_fix=False)


#: where a refusal's fix begins: a site policy's ``...; fix: ...``, a disclosure rule's
#: ``...; it is not sent. Merge ...``
_FIX = re.compile(r"; fix: |(?<=is not sent)\. ")


def refusal_detail(refusals: Mapping[str, str], limit: int | None = None) -> str:
    """:func:`fault_detail` of refusals, each fix said once: the clients whose refusals end in
    the same fix are named together, the first one's reason standing for theirs (``each with
    its own figures`` when theirs differ in more than their own name), at most ``limit`` clients
    named (default :data:`~fedlatent.data.validation.NAMES_SHOWN`, 10), then a count.

    Parameters
    ----------
    refusals : mapping of str to str
        Client -> its refusal.
    limit : int or None
        How many clients to name.

    Returns
    -------
    str
    """
    return _grouped_detail(refusals, limit, by_fix=True)


def _grouped_detail(reasons: Mapping[str, str], limit: int | None, by_fix: bool) -> str:
    """The clients of ``reasons`` grouped by their reason (``by_fix``: by the fix their reason
    ends in, the first one's reason standing for the group's), at most ``limit`` named, then a
    count: the one formatter of :func:`fault_detail` and :func:`refusal_detail`."""
    from fedlatent.data.validation import NAMES_SHOWN

    budget = NAMES_SHOWN if limit is None else int(limit)
    groups: dict[str, list[tuple[str, str]]] = {}
    for c, r in list(reasons.items())[:max(budget, 0)]:
        m = _FIX.search(str(r)) if by_fix else None
        head, tail = (str(r), "") if m is None else (str(r)[:m.start()], str(r)[m.start():])
        groups.setdefault(tail or str(r), []).append((c, head))
    parts = []
    for key, items in groups.items():
        (c0, h0), others = items[0], [c for c, _ in items[1:]]
        also = "" if not others else (
            f" (also client{'s' if len(others) > 1 else ''} {', '.join(map(repr, others))}"
            + ("" if not by_fix or all(h.replace(repr(c), "") == h0.replace(repr(c0), "")
                                       for c, h in items) else ", each with its own figures")
            + ")")
        parts.append(f"client {c0!r}: {h0}{also}{key if key != h0 else ''}")
    rest = len(reasons) - sum(len(items) for items in groups.values())
    return "; ".join(parts) + (f"; and {rest} more client(s)" if rest > 0 else "")


def point_keys(j: int) -> tuple[str, str]:
    """``(prefix, objective key)`` of extra point ``j`` (from 1) in a multi-point round's reply:
    ``("point{j}", "objective{j}")``."""
    return f"point{j}", f"objective{j}"


def statistic_field(key: str) -> bool:
    """Whether an E-step reply's field is a block of a statistic: ``delta/...`` or a
    multi-point round's ``point{j}/...`` (secure aggregation weights these by ``w_c``)."""
    head, sep, _ = key.partition("/")
    return bool(sep) and (head == "delta" or (head[:5] == "point" and head[5:].isdigit()))


def objective_field(key: str) -> bool:
    """Whether an E-step reply's field is an objective: ``objective`` or ``objective{j}``."""
    return key[:9] == "objective" and (len(key) == 9 or key[9:].isdigit())


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


def frozen(a) -> bool:
    """Whether nobody can write the array ``a``: it and every array it views are read-only
    and its memory is an immutable ``bytes`` object (``np.frombuffer(bytes)`` and its views;
    NumPy refuses to make such an array writeable). Two holders of it may share it as they
    would share a copy (the in-process runtime relays it uncopied)."""
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return type(a) is bytes


def same_frozen(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether ``a`` and ``b`` are one and the same memory that nobody can write
    (:func:`frozen`: immutable bytes, kept alive by either): equal without comparing them."""
    return (a.shape == b.shape and a.dtype == b.dtype and a.__array_interface__["data"][0]
            == b.__array_interface__["data"][0] and frozen(a) and frozen(b))


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
    check : callable or None
        ``check(value, reply, client) -> reason or None``: what the value means (counts in
        range, a moment matrix consistent with the first moments...), run once every entry
        has passed the checks above; a reason refuses the reply.
    rows : callable or None
        ``rows(values, fields, clients) -> mask``: ``check`` of many clients' replies at once
        (:func:`check_rows`; ``values`` the entry of every client stacked, ``fields`` every
        entry so, ``clients`` their ids), True at least where ``check`` fails (a superset:
        ``check`` is then asked for the reason). None: ``check`` client by client.
    """

    shape: tuple[int | None, ...] | None = None
    low: float | None = None
    finite: bool = True
    is_text: bool = False
    check: Callable[[Any, Mapping[str, Any], str], str | None] | None = None
    rows: Callable[[np.ndarray, Mapping[str, np.ndarray], list[str]], np.ndarray] | None = None


def number(low: float | None = None, check=None, rows=None) -> Expect:
    """A finite scalar (at least ``low`` when given; ``check``, ``rows`` as in
    :class:`Expect`)."""
    return Expect(None, low, check=check, rows=rows)


def array(*shape: int | None, low: float | None = None, check=None, rows=None) -> Expect:
    """A finite array of ``shape`` (None: any length along that axis)."""
    return Expect(tuple(shape), low, check=check, rows=rows)


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
    for k, e in expect.items():
        reason = e.check(reply[k], reply, client) if e.check is not None else None
        if reason:
            raise ClientReplyError(client, f"{noun} {k!r}: {reason}")


def check_rows(clients: list[str], fields: Mapping[str, np.ndarray],
               expect: Mapping[str, Expect], noun: str = "value") -> dict[int, str]:
    """:func:`check_fields` of many clients' replies computed at once, given as rows
    (``fields[k][i]`` is client ``clients[i]``'s entry ``k``): position -> the reason
    :func:`check_fields` gives that client's reply (absent: it passes).

    Shapes are checked once, finiteness and lower bounds row-wise; an entry's own ``check``
    runs on the rows its ``rows`` screen flags (on every row without one). Text entries or
    entries that are not numbers: :func:`check_fields` row by row."""
    n = len(clients)
    missing = [k for k in expect if k not in fields]
    if missing:
        return dict.fromkeys(range(n), f"missing {noun}(s) {missing}")
    arrays = {k: np.asarray(v) for k, v in fields.items()}
    short = [k for k, v in arrays.items() if v.ndim == 0 or v.shape[0] != n]
    if short:
        raise ValueError(f"rows of {short} are not one per client ({n} clients)")
    if any(e.is_text or arrays[k].dtype.kind not in "biuf" for k, e in expect.items()):
        return _rows_one_by_one(clients, arrays, expect, noun)
    why: dict[int, str] = {}
    for k, e in expect.items():
        for bad, reason in _row_failures(k, arrays[k], e, noun):
            for i in np.flatnonzero(bad).tolist():
                why.setdefault(i, reason(i))
    for k, e in expect.items():
        if e.check is None:
            continue
        live = np.ones(n, dtype=bool)
        live[list(why)] = False
        if e.rows is not None:
            with np.errstate(all="ignore"):
                live &= np.asarray(e.rows(arrays[k], arrays, clients), dtype=bool)
        for i in np.flatnonzero(live).tolist():
            reason = e.check(arrays[k][i], {f: v[i] for f, v in arrays.items()}, clients[i])
            if reason:
                why[i] = f"{noun} {k!r}: {reason}"
    return why


def _row_failures(k: str, a: np.ndarray, e: Expect, noun: str):
    """``(mask of rows, reason(row))`` of :func:`check_fields`'s checks of entry ``k`` over
    rows ``a``, in its order (shape, finite values, lower bound)."""
    n = a.shape[0]
    flat = a.reshape(n, -1)
    if e.shape is None:
        if a.ndim != 1:
            return [(np.ones(n, dtype=bool), lambda i: f"{noun} {k!r} has shape "
                     f"{tuple(a.shape[1:])}, expected a number")]
        out = [] if not e.finite else [
            (~np.isfinite(a), lambda i: f"{noun} {k!r} is not finite ({a[i]!r})")]
    else:
        if a.ndim != len(e.shape) + 1 or any(
                w is not None and int(m) != int(w) for m, w in zip(a.shape[1:], e.shape)):
            want = tuple("any" if w is None else w for w in e.shape)
            return [(np.ones(n, dtype=bool), lambda i: f"{noun} {k!r} has shape "
                     f"{tuple(a.shape[1:])}, expected {want}")]
        out = [] if not e.finite else [
            (_nonfinite_rows(flat), lambda i: f"{noun} {k!r} has non-finite values")]
    if e.low is not None:
        with np.errstate(invalid="ignore"):
            out.append((np.any(flat < e.low, axis=1),
                        lambda i: f"{noun} {k!r} has values below {e.low}"))
    return out


def _nonfinite_rows(flat: np.ndarray) -> np.ndarray:
    """The rows of ``flat`` (n, p) holding a NaN or an infinity: a row whose sum is finite
    has only finite entries (one pass, no temporary of ``flat``'s size); the others (an
    overflowing sum too) are looked at entry by entry."""
    if flat.dtype.kind in "biu":
        return np.zeros(flat.shape[0], dtype=bool)
    with np.errstate(all="ignore"):
        bad = ~np.isfinite(np.add.reduce(flat, axis=1))
    if bad.any():
        rows = np.flatnonzero(bad)
        bad[rows] = ~np.all(np.isfinite(flat[rows]), axis=1)
    return bad


def _rows_one_by_one(clients, arrays, expect, noun) -> dict[int, str]:
    """:func:`check_rows` by :func:`check_fields` on each row (rows it cannot stack)."""
    why = {}
    for i, c in enumerate(clients):
        try:
            check_fields(c, {k: v[i] for k, v in arrays.items()}, expect, noun)
        except ClientReplyError as err:
            why[i] = err.reason
    return why


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


# ---- invariants of statistics (the models' ``check`` hooks use these) -----------------------
def psd_failures(M: np.ndarray, slack: np.ndarray | None = None, rtol: float = 1e-8) -> np.ndarray:
    """Indices of the matrices of ``M`` that are not positive semi-definite beyond rounding.

    Each matrix is scaled by its diagonal (``M_ij / sqrt(M_ii M_jj)``, unit diagonal), so the
    test does not depend on units or magnitude (1e300 overflows nothing) and a tolerance of
    ``rtol`` on the smallest eigenvalue is relative to the scale of the sums. ``slack`` (same
    shape, >= 0) bounds the absolute error of each entry (statistics rebuilt from differences
    on the server); it widens the tolerance by the Frobenius norm of the scaled error, a bound
    on how far it can move an eigenvalue (Weyl).

    Parameters
    ----------
    M : ndarray of shape (m, p, p)
    slack : ndarray of shape (m, p, p) or None

    Returns
    -------
    ndarray of int: the indices ``i`` with ``M[i]`` not PSD.

    Notes
    -----
    The matrices are first screened by the vectorized certificate
    :func:`~fedlatent.engine.protocol.psd_screen.psd_certified` (a Cholesky factorization with half
    the tolerance: what it certifies passes this test); only the others are scaled and given
    to ``eigvalsh``. The answer is the same, faster (a check of a few small matrices costs a
    dozen NumPy calls otherwise, and the server makes one per client).
    """
    from fedlatent.engine.protocol.psd_screen import psd_certified

    M = np.asarray(M, dtype=np.float64)
    if M.size == 0:
        return np.zeros(0, dtype=np.int64)
    ok = psd_certified(M, slack, rtol)
    if ok.all():
        return np.zeros(0, dtype=np.int64)
    rest = np.flatnonzero(~ok)
    E = None if slack is None else np.asarray(slack, dtype=np.float64)[rest]
    with np.errstate(all="ignore"):
        return rest[_psd_failures(M[rest], E, rtol)]


def _psd_failures(M: np.ndarray, slack: np.ndarray | None, rtol: float) -> np.ndarray:
    E = np.zeros_like(M) if slack is None else np.abs(np.asarray(slack, dtype=np.float64))
    diag = np.diagonal(M, axis1=1, axis2=2)
    ediag = np.diagonal(E, axis1=1, axis2=2)
    tiny = np.finfo(np.float64).tiny
    neg_diag = np.any(diag < -ediag - rtol * np.abs(diag).max(axis=1, keepdims=True), axis=1)
    s = np.sqrt(np.maximum(diag, 0.0) + ediag + tiny)
    outer = s[:, :, None] * s[:, None, :]
    Ms = M / outer
    Ms = 0.5 * (Ms + np.transpose(Ms, (0, 2, 1)))
    err = np.sqrt(np.sum((E / outer) ** 2, axis=(1, 2)))
    ok = np.all(np.isfinite(Ms), axis=(1, 2))
    lam = np.full(len(M), -np.inf)
    if ok.any():
        lam[ok] = np.linalg.eigvalsh(Ms[ok])[:, 0]
    bad = neg_diag | (lam < -(rtol * M.shape[-1] + err))
    return np.flatnonzero(bad)


def count_problem(name: str, counts: np.ndarray, n_units: float,
                  slack: np.ndarray | None = None, total: bool = True,
                  rtol: float = 1e-8) -> str | None:
    """Why ``counts`` cannot be counts of ``n_units`` units (None when they can): each in
    ``[0, n_units]`` and, with ``total``, summing to ``n_units``, within ``rtol`` of
    ``n_units`` plus the entries' ``slack``."""
    c = np.asarray(counts, dtype=np.float64)
    e = np.zeros_like(c) if slack is None else np.abs(np.asarray(slack, dtype=np.float64))
    n = float(n_units)
    tol = rtol * max(n, 1.0)
    low = np.flatnonzero(c < -(e + tol))
    if low.size:
        return f"count {name!r} is negative ({c.flat[low[0]]:.6g} at index {int(low[0])})"
    high = np.flatnonzero(c > n + e + tol)
    if high.size:
        return (f"count {name!r} is {c.flat[high[0]]:.6g} at index {int(high[0])}, more than "
                f"the {n:g} units it sums over")
    if total and abs(float(c.sum()) - n) > tol + float(e.sum()):
        return f"counts {name!r} sum to {float(c.sum()):.6g}, not to the {n:g} units"
    return None


def bordered(A: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """``[[A, b], [b^T, c]]`` for a batch: A (m, p, p), b (m, p), c (m,) -> (m, p+1, p+1).

    The moment matrix ``sum w [x; y][x; y]^T`` of a weighted sum is positive semi-definite;
    its blocks are what a client sends (``sum w x x^T``, ``sum w x y``, ``sum w y^2``).
    """
    A, b, c = (np.asarray(v, dtype=np.float64) for v in (A, b, c))
    m, p = b.shape
    out = np.empty((m, p + 1, p + 1))
    out[:, :p, :p] = A
    out[:, :p, p] = b
    out[:, p, :p] = b
    out[:, p, p] = c
    return out


def psd_problem(what: str, M: np.ndarray, slack: np.ndarray | None = None,
                label: str = "component") -> str | None:
    """A reason naming the first ``label`` whose matrix in ``M`` is not PSD (None if all are);
    ``what`` says which matrix, in words."""
    bad = psd_failures(M, slack)
    if bad.size:
        return (f"{what} of {label} {int(bad[0])} is not positive semi-definite (second "
                "moments inconsistent with the first: no data give these sums)")
    return None


def equal_problem(what: str, a: np.ndarray, b: np.ndarray, ea=None, eb=None,
                  rtol: float = 1e-8) -> str | None:
    """A reason unless ``a == b`` within rounding (``ea``, ``eb``: entries' slack)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    tol = rtol * np.maximum(np.abs(a), np.abs(b)) + rtol
    for e in (ea, eb):
        if e is not None:
            tol = tol + np.abs(e)
    bad = np.flatnonzero(np.abs(a - b) > tol)
    if bad.size:
        i = int(bad[0])
        return f"{what} differ at index {i} ({a.flat[i]:.6g} vs {b.flat[i]:.6g})"
    return None
