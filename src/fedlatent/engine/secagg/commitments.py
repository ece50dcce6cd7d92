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

__all__ = ["CLOSE_TAG", "COMMIT_TAG", "OPEN_TAG", "check_openings", "check_strength",
           "closed_digest", "commitment", "opening", "openings"]

OPEN_TAG = b"fedlatent/secagg/opening\x00"
COMMIT_TAG = b"fedlatent/secagg/commit\x00"
CLOSE_TAG = b"fedlatent/secagg/closed\x00"


def opening(nonce: bytes, enc_key: bytes) -> bytes:
    """``o_u``: SHA-256 of the tag, a client's nonce and its X25519 public key (32 bytes)."""
    return _crypto.commit(OPEN_TAG + bytes(nonce) + bytes(enc_key))


def openings(pairs) -> list[bytes]:
    """:func:`opening` of each ``(nonce, enc_key)`` of ``pairs``, in one pass."""
    return _crypto.commit_many([OPEN_TAG + bytes(r) + bytes(e) for r, e in pairs])


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
    return _checked(str(run), int(round), content, ids, ids_json,
                    np.ascontiguousarray(openings, dtype=np.uint8).tobytes())


@functools.lru_cache(maxsize=4)
def _memo(run: str, round: int, content: bytes) -> dict:
    return {}


def _checked(run: str, round: int, content: bytes, ids, ids_json: str, raw: bytes) -> bytes:
    memo = _memo(run, round, content)
    if "digest" not in memo:  # (the content digest covers the ids and every opening)
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
