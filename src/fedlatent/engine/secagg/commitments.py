"""The set-up's commitments: every key fixed before anything that orders the masking graph.

A server that sees the honest clients' keys before the keys of clients it runs itself (sybils)
could re-draw the sybils' keys until the ring order puts enough of them around a target (the
order is a hash of every key). So the set-up commits first:

1. ``keys``: each client draws its X25519 key ``c_u`` and a 32-byte nonce ``r_u`` from the OS
   and sends only ``commit_u = SHA-256(tag, [run, round, u], o_u)``, where its *opening* is
   ``o_u = SHA-256(tag, r_u, pk(c_u))`` (:func:`opening`, :func:`commitment`);
2. ``open``: the server closes the list and sends every client the digest of every enrolled id
   with its commitment (:func:`closed_digest`) and their number; only then does a client send
   its public keys and its nonce;
3. ``roster``: a client is sent every opening ``o_v`` (and the keys and nonces of its own
   neighbourhood); it recomputes every commitment from the openings and the closed digest from
   them (:func:`check_openings`), checks its neighbours' openings against their keys and
   nonces, and refuses a digest that differs: a key or a client added after the close, one
   left out, or an opening that is not the committed one.

The ring order is then a hash of the server's seed (committed before any client drew its keys),
the ids and every opening (:func:`~fedlatent.engine.secagg.graph.graph_digest`). Why grinding no
longer helps: when a client u reveals its nonce, the list it checks was fixed (the closed
digest it holds), so every other opening, the sybils' included, was chosen without knowing
``r_u``; the order is a hash of ``r_u`` with values fixed before it, hence uniform whatever
keys the sybils chose, and u's neighbourhood is a uniformly random set of ``k`` of the other
clients. What the server keeps is the choice to abandon a set-up once the openings are in (a
new set-up, new keys and nonces, one new uniform draw, as visible to the sites as any set-up):
leaving a committed client out, or adding one, changes the digest and is refused.

:func:`check_strength` is the other half of a graph nobody weakens: each client recomputes the
degree and threshold the library's bounds give for the enrolled clients and the announced
participation (:func:`~fedlatent.engine.secagg.graph.plus_parameters`) and refuses a weaker
graph, naming what it expected.
"""

from __future__ import annotations

import functools
import json

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto
from fedlatent.engine.protocol.messages import same_frozen

__all__ = ["CLOSE_TAG", "COMMIT_TAG", "OPEN_TAG", "check_openings", "check_strength",
           "closed_digest", "commitment", "opened_table", "opening", "openings", "openings_hold"]

OPEN_TAG = b"fedlatent/secagg/opening\x00"
COMMIT_TAG = b"fedlatent/secagg/commit\x00"
CLOSE_TAG = b"fedlatent/secagg/closed\x00"


def opening(nonce: bytes, enc_key: bytes) -> bytes:
    """``o_u``: SHA-256 of the tag, a client's nonce and its X25519 public key (32 bytes)."""
    return _crypto.commit(OPEN_TAG + bytes(nonce) + bytes(enc_key))


def openings(pairs) -> list[bytes]:
    """:func:`opening` of each ``(nonce, enc_key)`` of ``pairs``, in one pass.

    Each is remembered per process (a pure function of public values: a client's opening is
    checked by each of its neighbours, and in-process clients look it up instead of hashing it
    again; 2% of the set-up at 10,000 clients)."""
    items = [OPEN_TAG + bytes(r) + bytes(e) for r, e in pairs]
    out = list(map(_OPENED.get, items))
    todo = [i for i, o in enumerate(out) if o is None]
    if todo:
        if len(_OPENED) + len(todo) > _OPENED_SIZE:
            _OPENED.clear()
        for i, o in zip(todo, _crypto.commit_many([items[i] for i in todo])):
            out[i] = _OPENED[items[i]] = o
    return out


#: ``{tag + nonce + key: opening}`` of the openings :func:`openings` computed (public values)
_OPENED: dict[bytes, bytes] = {}
_OPENED_SIZE = 1 << 18


def opened_table(rows: np.ndarray) -> np.ndarray:
    """:func:`opening` of every enrolled client, an (n, 32) uint8 array that nobody can write,
    from an (n, 64) uint8 array of their nonces and keys (what the server's roster hashes).

    The process remembers the last few such tables, rows and openings, as verified: every row
    hashed here to its opening (:func:`openings_hold`)."""
    raw = np.ascontiguousarray(rows, dtype=np.uint8).tobytes()
    got = _crypto.commit_many([OPEN_TAG + raw[i:i + 64] for i in range(0, len(raw), 64)])
    out = np.frombuffer(b"".join(got), dtype=np.uint8).reshape(-1, 32)
    _TABLES[:] = [(out, np.frombuffer(raw, dtype=np.uint8).reshape(-1, 64)), *_TABLES[:3]]
    return out


def openings_hold(openings: np.ndarray, rows: np.ndarray, at: np.ndarray) -> bool:
    """Whether each row of ``rows`` ((k, 64) uint8: a client's nonce, then its key) hashes to
    the opening at the same place of ``at`` in ``openings`` ((n, 32), every enrolled
    client's): a client's check of its neighbours' keys against the list that closed.

    In-process, the openings a client is sent are those the server's roster hashed
    (:func:`opened_table`, relayed uncopied: :func:`~fedlatent.engine.protocol.messages.
    same_frozen`), and the rows of that table at ``at`` are then compared with ``rows`` at
    once (rows equal byte for byte to ones hashed to these openings: the same answer as
    hashing them, 0.04 of the set-up's agreements at 10,000 clients where each neighbour was
    looked up); otherwise every row is hashed (:func:`openings`)."""
    rows = np.ascontiguousarray(rows, dtype=np.uint8)
    at = np.asarray(at, dtype=np.int64)
    for table_openings, table_rows in tuple(_TABLES):
        if same_frozen(table_openings, openings):
            return bool(np.array_equal(table_rows[at], rows))
    raw = rows.tobytes()
    opened = openings_of_raw(raw)
    return bool(np.array_equal(opened, np.asarray(openings, dtype=np.uint8)[at]))


def openings_of_raw(raw: bytes) -> np.ndarray:
    """:func:`openings` of rows of 64 bytes (nonce, key) joined in ``raw``: (m, 32) uint8."""
    pairs = [(raw[i:i + 32], raw[i + 32:i + 64]) for i in range(0, len(raw), 64)]
    return np.frombuffer(b"".join(openings(pairs)), dtype=np.uint8).reshape(-1, 32)


#: ``(openings, rows)`` of the last tables :func:`opened_table` hashed, both read-only
_TABLES: list[tuple[np.ndarray, np.ndarray]] = []


def _context(run: str, round: int, u: str) -> bytes:
    return json.dumps([str(run), int(round), str(u)]).encode()


def commitment(run: str, round: int, u: str, opened: bytes) -> bytes:
    """``commit_u``: SHA-256 of the tag, ``[run, round, u]`` (JSON) and the opening ``o_u``."""
    return _crypto.commit(COMMIT_TAG + _context(run, round, u) + bytes(opened))


def closed_digest(ids_json: str, commits: np.ndarray) -> bytes:
    """SHA-256 of the tag, the enrolled ids (a sorted JSON list) and their commitments (an
    (n, 32) uint8 array, rows in the order of the ids): what closes the list."""
    rows = np.ascontiguousarray(commits, dtype=np.uint8)
    return _crypto.commit(CLOSE_TAG + str(ids_json).encode() + b"\x00" + rows.tobytes())


def check_openings(run: str, round: int, ids: tuple[str, ...], ids_json: str,
                   openings: np.ndarray, content: bytes) -> bytes:
    """The closed digest the openings give: every commitment recomputed from the openings
    (an (n, 32) uint8 array, rows in the order of ``ids``), then their digest.

    ``content`` is a digest of the ids and the openings, which the caller computed anyway
    (:func:`~fedlatent.engine.secagg.graph.openings_digest`): the answer is a pure function of
    public data and is remembered per process by it (in-process clients each check the same
    openings; a real client does ``n`` SHA-256 of 90 bytes, 10 ms at 10,000 clients).
    """
    return _checked(str(run), int(round), content, ids, ids_json, openings)


@functools.lru_cache(maxsize=4)
def _memo(run: str, round: int, content: bytes) -> dict:
    return {}


def _checked(run: str, round: int, content: bytes, ids, ids_json: str, openings) -> bytes:
    memo = _memo(run, round, content)
    if "digest" not in memo:  # (the content digest covers the ids and every opening)
        raw = np.ascontiguousarray(openings, dtype=np.uint8).tobytes()
        heads = [COMMIT_TAG + _context(run, round, u) for u in ids]
        commits = _crypto.commit_many([h + raw[32 * i:32 * i + 32] for i, h in enumerate(heads)])
        rows = np.frombuffer(b"".join(commits), dtype=np.uint8).reshape(len(ids), 32)
        memo["digest"] = closed_digest(ids_json, rows)
    return memo["digest"]


def check_strength(config, n: int) -> str | None:
    """Why the masking graph of ``config`` for ``n`` enrolled clients is weaker than the
    library's bounds give for them and its participation (None: it is not).

    The bounds (:func:`~fedlatent.engine.secagg.graph.plus_parameters`) give ``(k, t)``, or
    the complete graph for small cohorts. Accepted: the complete graph (its threshold over
    all the clients, above half of them, is the strongest), or a degree ``>= k`` with a
    neighbourhood threshold ``>= t``, and for a degree above ``k`` at least the threshold that
    degree needs for secrecy (more neighbours, more of them possibly colluding).
    """
    import fedlatent.engine.secagg.graph as graph

    p = float(config.participation)
    E = config.n_slots if config.slots is not None else 128
    k, t = graph.plus_parameters(int(n), p, exchanges=int(E))
    if not config.sparse(n):
        return None
    where = (f"Bell et al.'s bounds for {n} clients, participation {p:g} and {E} exchanges "
             "(fedlatent.engine.secagg.graph.plus_parameters)")
    if t == 0:
        return f"expected the complete graph ({where}); got degree {config.degree}"
    degree = int(config.degree) + int(config.degree) % 2
    got = int(config.local_threshold)
    need = t if degree <= k else max(t, graph.secrecy_threshold(degree, n))
    if degree < k or got < need:
        return (f"expected degree >= {k} and neighbourhood threshold >= {need} ({where}); got "
                f"degree {config.degree} and threshold {got}: a weaker masking graph is refused")
    return None
