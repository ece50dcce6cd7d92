"""What the secure-aggregation client and server share: settings, the roster, mask derivation.

Masks are derived per exchange from secrets agreed once per fit: a pair of neighbours agrees one
X25519 secret, one key derivation (NIST SP 800-56C's one-step KDF, SHA-512, bound to the set-up
and the pair) turns it into the key of the shares they deal each other and their mask secret s_uv
(:func:`pair_keys`); an exchange's pair mask is the AES-256-CTR keystream of s_uv under a nonce
hashed from the exchange's label (:func:`pair_nonce`: one keystream per pair and exchange, each
exchange masked once). The self mask is the keystream of b_u under another nonce hashed from the
label.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto
from fedlatent.engine.secagg.encoding import FixedPoint

__all__ = ["KEYS_PURPOSE", "Roster", "SecAggConfig", "SecureAggregationError", "as_bytes",
           "as_u8", "exchange_label", "keys_payload", "pair_keys", "pair_keys_many", "pair_nonce",
           "self_mask", "self_nonce", "slot_item"]

#: a client's public keys: its X25519 key (share encryption and pairwise masks), a SHA-256
#: commitment to each of its self-mask seeds, and the nonce its set-up commitment hides
#: (:mod:`~fedlatent.engine.secagg.commitments`)
KEY_FIELDS = ("enc_key", "self_commit", "nonce")
#: the optional field carrying a client's Ed25519 signature of its public keys
#: (:mod:`fedlatent.engine.site.keys`); 64 zero bytes in the roster: unsigned
SIGNATURE_FIELD, SIGNATURE_BYTES = "signature", 64
#: what a site's signature of its key-agreement keys is for
KEYS_PURPOSE = "secagg-keys"


def keys_payload(keys: Mapping[str, bytes]) -> bytes:
    """The bytes a site signs of its public keys: the key fields in a fixed order."""
    return b"".join(bytes(keys[f]) for f in KEY_FIELDS)


def signed_keys(site: str, keys: Mapping[str, bytes]) -> bytes:
    """The payload of a site's signature of its keys: its id (JSON), a zero byte and
    :func:`keys_payload` (the context, common to every site of a set-up, is the head)."""
    return json_str(site) + b"\x00" + keys_payload(keys)


class SecureAggregationError(RuntimeError):
    """A secure-aggregation exchange cannot go on (too few survivors, a refused reveal, a bad
    message); the message names the exchange, the client and the rule."""


@dataclass(frozen=True)
class SecAggConfig:
    """Public settings every client and the server share.

    Parameters
    ----------
    threshold : int
        Shares needed to rebuild a client's secrets, so the fewest survivors an exchange can
        unmask. Must exceed half the clients enrolled at set-up, so that no two disjoint groups of
        honest clients can each hand the server a different kind of secret for the same client.
    encoding : FixedPoint
        The public fixed-point scale and bounds.
    slots : int or None
        None (one self-mask seed per client for the whole fit, pair masks per exchange label):
        a client whose self-mask seed was revealed (it survived an exchange) can never be
        recovered later. An int E: every client draws E self-mask seeds at set-up, all
        Shamir-shared then, and exchange number e (0 <= e < E, assigned by the server's
        :meth:`~.server.SecAggServer.announce`) uses only the e-th seed and that exchange's pair
        mask with each neighbour; revealing the secrets of one exchange reveals nothing of another,
        so a client that drops in any exchange is recovered (and excluded for the rest of the
        fit).
    degree : int or None
        SecAgg+ (Bell et al. 2020): each client masks with its ``degree`` neighbours on a random
        regular graph (:class:`~fedlatent.engine.secagg.graph.MaskingGraph`) and deals its
        shares to them only. None, or at least the clients minus one: the complete graph (every
        client masks with every other, Bonawitz et al. 2017).
    local_threshold : int or None
        On a sparse graph, the shares needed to rebuild one client's secret, from its
        ``degree`` neighbours (:func:`~fedlatent.engine.secagg.graph.plus_parameters` chooses
        it; a client never reveals its share of its own seed there); ``threshold`` then stays
        the fewest survivors an exchange can unmask.
    participation : float
        The share of clients each exchange draws (announced by the server): with the enrolled
        clients' number it fixes the weakest graph a client accepts
        (:func:`~fedlatent.engine.secagg.commitments.check_strength`).
    """

    threshold: int
    encoding: FixedPoint
    slots: int | None = None
    degree: int | None = None
    local_threshold: int | None = None
    participation: float = 1.0

    @property
    def n_slots(self) -> int:
        """Secrets per client: one per planned exchange (``slots``), or one for the fit."""
        return 1 if self.slots is None else int(self.slots)

    def sparse(self, n_clients: int) -> bool:
        """Whether ``n_clients`` enrolled clients mask over a sparse graph (SecAgg+)."""
        return self.degree is not None and int(self.degree) < n_clients - 1

    def share_threshold(self, n_clients: int) -> int:
        """Shares that rebuild one client's secret: ``local_threshold`` on a sparse graph, else
        ``threshold``."""
        return int(self.local_threshold) if self.sparse(n_clients) else int(self.threshold)

    def check_clients(self, n_clients: int) -> None:
        """Refuse a threshold outside (n_clients / 2, n_clients], and on a sparse graph a
        neighbourhood threshold outside [2, degree + 1]."""
        t = self.threshold
        if not (isinstance(t, int | np.integer) and 2 * t > n_clients and t <= n_clients):
            lo = n_clients // 2 + 1
            raise ValueError(
                f"secure aggregation threshold {t!r} for {n_clients} clients: it must be an "
                f"integer in [{lo}, {n_clients}] (more than half the clients, at most all of "
                f"them); set threshold={max(lo, 2) if n_clients >= 2 else n_clients}, say")
        if self.sparse(n_clients):
            k, lt = int(self.degree), self.local_threshold
            if not (isinstance(lt, int | np.integer) and 2 <= lt <= k + 1 and k >= 2):
                raise ValueError(
                    f"secure aggregation over a graph of degree {k}: the neighbourhood "
                    f"threshold {lt!r} must be an integer in [2, {k + 1}]; choose both with "
                    "fedlatent.engine.secagg.graph.plus_parameters")


def exchange_label(round: int, exchange: str) -> bytes:
    """The public context of one exchange, bound into every mask it uses."""
    return _label(int(round), str(exchange))


@functools.lru_cache(maxsize=256)
def _label(round: int, exchange: str) -> bytes:  # every client of an exchange asks: once
    return json.dumps([round, exchange]).encode()


def describe(round: int, exchange: str) -> str:
    return f"round {int(round)}, exchange {str(exchange)!r}"


def self_mask(seed: bytes, label: bytes, n: int) -> np.ndarray:
    """A client's own mask for one exchange: the ChaCha20 keystream of b_u under the nonce
    SHA-256(tag, label)[:12], one keystream per (seed, exchange) (a seed per exchange, or with
    one seed per fit, a nonce per exchange)."""
    return _crypto.prg_uint64(seed, n, nonce=self_nonce(bytes(label)))


@functools.lru_cache(maxsize=256)
def self_nonce(label: bytes) -> bytes:
    """The self masks' ChaCha20 nonce of an exchange: SHA-256(tag, label)[:12] (public:
    hashed once per exchange in a process)."""
    return _crypto.commit(b"fedlatent/secagg/self\x00" + label)[:12]


PAIR_TAG = b"fedlatent/secagg/pair\x00"


@functools.lru_cache(maxsize=256)
def pair_nonce(label: bytes, slot: int = 0) -> bytes:
    """The pair masks' AES-CTR nonce of an exchange (counter blocks ``nonce || 2, 3, ...``):
    SHA-256(tag, label, slot)[:12] (public, hashed once per exchange in a process). A pair's
    keystream of the exchange is that of its secret s_uv under it (the mask, then the pair's
    consistency tokens): a client masks each exchange once, so each (s_uv, nonce) keys one
    keystream, and the mask of one exchange (what a reveal gives when a neighbour dropped)
    leaves every other exchange's pseudo-random. The slot is bound in: two neighbours told
    different slots for one exchange get different keystreams (their tokens disagree)."""
    return _crypto.commit(b"fedlatent/secagg/pair-mask\x00" + label + b"\x00" +
                          str(int(slot)).encode())[:12]


def pair_keys(shared: bytes, setup: bytes, x_u: int, x_v: int) -> bytes:
    """64 bytes from X25519(c_u, c_v), once per neighbour pair per fit: one SHA-512 of the
    one-step KDF of NIST SP 800-56C (:func:`~._crypto.derive_keys`) with the fixed info
    :data:`PAIR_TAG`, ``setup`` (the 32-byte digest of the set-up's closed list of
    commitments, :func:`~.commitments.closed_digest`: it names the run, the set-up round and
    every enrolled client with its commitment) and the pair's Shamir x-coordinates (their
    places among the enrolled ids plus one, 4 bytes big-endian each, the smaller first): no
    other derivation of the library uses the tag, and no two pairs or set-ups share the info.
    Bytes [0, 32) key the shares the two deal each other (each message sealed once, with a
    random nonce, its associated data naming sender and recipient), bytes [32, 64) are the
    pair's mask secret s_uv: two keys for two uses, neither derivable from the other (a
    revealed pair mask, a keystream of s_uv, tells nothing of the share key)."""
    return pair_keys_many([shared], setup, x_u, [x_v])[0]


def pair_keys_many(shared: list[bytes], setup: bytes, x_u: int, peers_x) -> list[bytes]:
    """:func:`pair_keys` of the client at x-coordinate ``x_u`` with each of those at
    ``peers_x`` (``shared[i]`` its agreement with the i-th), in one pass: every fixed info
    written at once (one fixed width), then :func:`~._crypto.derive_keys`."""
    xs = np.asarray(peers_x, dtype=np.int64).reshape(-1)
    head = np.frombuffer(PAIR_TAG + bytes(setup), dtype=np.uint8)
    k, w = xs.size, head.size + 8
    info = np.empty((k, w), dtype=np.uint8)
    info[:, :head.size] = head
    info[:, head.size:head.size + 4] = np.minimum(xs, x_u).astype(">u4").view(np.uint8).reshape(
        k, 4)
    info[:, head.size + 4:] = np.maximum(xs, x_u).astype(">u4").view(np.uint8).reshape(k, 4)
    raw = info.tobytes()
    return _crypto.derive_keys(shared, [raw[i:i + w] for i in range(0, len(raw), w)], 64)


@functools.lru_cache(maxsize=65536)
def json_str(u: str) -> bytes:
    """A string as JSON (what ``json.dumps`` writes for it in a list), encoded once."""
    return json.dumps(str(u)).encode()


def as_u8(data: bytes) -> np.ndarray:
    """Bytes as a uint8 array (what crosses Flower's ArrayRecord)."""
    return np.frombuffer(bytes(data), dtype=np.uint8).copy()


def as_bytes(arr, *, what: str, size: int | None = None) -> bytes:
    """A received uint8 array back to bytes, checking its dtype and (optionally) its length."""
    a = np.asarray(arr)
    if a.dtype != np.uint8 or a.ndim != 1:
        raise SecureAggregationError(f"{what}: expected a 1-d uint8 array, got dtype {a.dtype} "
                                     f"with shape {a.shape}")
    if size is not None and a.size != size:
        raise SecureAggregationError(f"{what}: expected {size} bytes, got {a.size}")
    return a.tobytes()


def _per(field: str, config: SecAggConfig) -> int:
    """32-byte items per client in a key field: one per slot for the seeds' commitments."""
    return config.n_slots if field == "self_commit" else 1


def slot_item(blob: bytes, slot: int) -> bytes:
    """The 32 bytes of ``slot`` in a per-slot key field."""
    return blob[32 * slot:32 * slot + 32]


class Roster:
    """The clients enrolled at set-up, their public keys, their Shamir x-coordinates and the
    masking graph.

    Parameters
    ----------
    keys : mapping of client id to {"enc_key", "self_commit", "nonce"} uint8 arrays
        What each client's :meth:`SecAggClient.public_keys` sent to the server: every enrolled
        client's (the server's roster), or on a sparse graph only one client's closed
        neighbourhood (what that client is sent, :meth:`message_for`).
    config : SecAggConfig
    everyone : sequence of str, optional
        Every enrolled id (default: the ids of ``keys``).
    openings : (n, 32) uint8 array, optional
        Every enrolled client's opening (:func:`~.commitments.opening` of its nonce and key),
        rows in the order of the ids (default: from ``keys``); with ``graph_seed`` it fixes the
        graph, and each client checks every commitment of the set-up against it.
    graph_seed : bytes, optional
        The server's seed of the graph (a sparse graph needs it).

    Notes
    -----
    ``everyone`` may be an :class:`Enrolled` (ids already sorted and checked, shared by every
    roster built from the same broadcast in a process).
    """

    def __init__(self, keys: Mapping[str, Mapping[str, np.ndarray]], config: SecAggConfig, *,
                 everyone=None, openings: np.ndarray | None = None,
                 graph_seed: bytes | None = None):
        # every O(n) step in C, once per distinct list in a process (:class:`Enrolled`)
        known = everyone if isinstance(everyone, Enrolled) else Enrolled(
            keys if everyone is None else everyone)
        members = sorted(map(str, keys))
        if len(set(members)) != len(keys):
            raise SecureAggregationError("client ids must be distinct strings")
        config.check_clients(len(known.ids))
        self.config = config
        self.ids, self.ids_json = known.ids, known.text
        if isinstance(keys, _Rows):  # a relayed roster's checked rows (:meth:`from_message`)
            self.keys: Mapping[str, Mapping[str, bytes]] = keys
            self.signatures: Mapping[str, bytes] = keys.signatures
        else:
            self.keys = {u: _checked_keys(u, keys[u], config) for u in members}
            #: each client's signature of its keys (64 zero bytes: it sent none)
            self.signatures = {u: bytes(SIGNATURE_BYTES) if keys[u].get(SIGNATURE_FIELD) is None
                               else as_bytes(keys[u][SIGNATURE_FIELD], size=SIGNATURE_BYTES,
                                             what=f"client {u!r}: field {SIGNATURE_FIELD!r}")
                               for u in members}
        if len(set(self.enc_keys(members))) < len(members):  # name the pair
            seen: dict[bytes, str] = {}
            f = "enc_key"
            for u in members:
                k = self.keys[u][f]
                if k in seen:
                    raise SecureAggregationError(f"clients {seen[k]!r} and {u!r} announce the "
                                                 f"same {f}; every client draws its own keys")
                seen[k] = u
        self._known = known
        self.openings = (self._opened_all() if openings is None
                         else np.asarray(openings, dtype=np.uint8))
        self.graph_seed = None if graph_seed is None else bytes(graph_seed)
        self._graph = None

    def _opened_all(self) -> np.ndarray:
        """Every enrolled client's opening, hashed from its nonce and key
        (:func:`~.commitments.opened_table`: the server's roster)."""
        from fedlatent.engine.secagg.commitments import opened_table

        return opened_table(self.key_rows(("nonce", "enc_key"), self.ids))

    def key_rows(self, fields: Iterable[str], members: Iterable[str]) -> np.ndarray:
        """``members``' ``fields`` joined, one (len(members), width) uint8 array."""
        fields, members = tuple(fields), list(members)
        if isinstance(self.keys, _Rows):
            return self.keys.joined_table(fields, members)
        keys = self.keys
        raw = b"".join([b"".join([keys[u][f] for f in fields]) for u in members])
        return np.frombuffer(raw, dtype=np.uint8).reshape(len(members), -1)

    def opened(self, members) -> np.ndarray:
        """The openings of ``members`` recomputed from their keys and nonces (:func:`~.
        commitments.opening`): a (len(members), 32) uint8 array."""
        from fedlatent.engine.secagg.commitments import openings

        rows = self.keys.rows(members) if isinstance(self.keys, _Rows) else [
            (self.keys[u]["nonce"], self.keys[u]["enc_key"]) for u in members]
        return np.frombuffer(b"".join(openings(rows)), dtype=np.uint8).reshape(-1, 32)

    @functools.cached_property
    def content(self) -> bytes:
        """:func:`~fedlatent.engine.secagg.graph.openings_digest` of the ids and openings."""
        from fedlatent.engine.secagg.graph import openings_digest

        return openings_digest(self.ids_json, self.openings)

    def enc_keys(self, members: Iterable[str]) -> list[bytes]:
        """The share-encryption keys of ``members`` (raw 32 bytes each)."""
        if isinstance(self.keys, _Rows):
            return self.keys.column("enc_key", members)
        keys = self.keys
        return [keys[u]["enc_key"] for u in members]

    @property
    def index(self) -> dict[str, int]:
        """Every enrolled id's Shamir x-coordinate, its place among the sorted ids plus one
        (:attr:`Enrolled.index`: one table per enrolled list and process)."""
        return self._known.index

    @property
    def _idset(self) -> frozenset:
        return self._known.set

    def x_of(self, members: Iterable[str]) -> list[int]:
        """The x-coordinates of enrolled ``members`` (:attr:`index`; KeyError: not enrolled)."""
        return list(map(self._known.index.__getitem__, members))

    def enrolled(self, u: str) -> bool:
        """Whether ``u`` took part in the key set-up."""
        return u in self._known.set

    @property
    def graph(self):
        """The masking graph (:class:`~fedlatent.engine.secagg.graph.MaskingGraph`)."""
        if self._graph is None:
            from fedlatent.engine.secagg.graph import digest_of

            if not self.config.sparse(self.n):
                self._graph = self._known.graph(None, None)
            else:
                if self.graph_seed is None:
                    raise SecureAggregationError("a sparse masking graph needs the server's "
                                                 "graph seed in the roster")
                digest = digest_of(self.graph_seed, self.content)
                self._graph = self._known.graph(self.config.degree, digest)
            self.ids = self._graph.ids  # equal tuples: in-process clients keep one copy
        return self._graph

    def to_message(self) -> dict:
        """The flat broadcast: ``ids`` (a JSON list, sorted) and one (n, 32) uint8 array per key
        field, rows in the order of ``ids`` (on a sparse graph also ``graph_seed``, hex; for a
        neighbourhood's roster, ``members``, the rows' ids, and ``openings``, every client's
        opening)."""
        members = sorted(self.keys)
        msg: dict = {"ids": self.ids_json}
        for f in KEY_FIELDS:
            msg[f] = np.stack([as_u8(self.keys[u][f]) for u in members])
        if any(any(self.signatures[u]) for u in members):  # relayed when any client signed
            msg[SIGNATURE_FIELD] = np.stack([as_u8(self.signatures[u]) for u in members])
        if self.graph_seed is not None:
            msg["graph_seed"] = self.graph_seed.hex()
        if tuple(members) != self.ids:
            msg["members"] = json.dumps(members)
            msg["openings"] = self.openings
        return msg

    def message_for(self, u: str) -> dict:
        """What client ``u`` is sent: the whole roster on the complete graph; on a sparse one
        every id and opening (they fix the graph and check the commitments) and the keys of
        ``u``'s closed neighbourhood only."""
        if not self.config.sparse(self.n):
            return self.to_message()
        near = self.graph.closed(str(u))
        rows = self.graph.closed_index(str(u))  # their rows: places among the sorted ids
        table = self._tables
        msg: dict = {"ids": self.ids_json}
        for f in KEY_FIELDS:
            msg[f] = table[f][rows]
        sig = table[SIGNATURE_FIELD][rows]
        if sig.any():  # relayed when any of them signed, as to_message does
            msg[SIGNATURE_FIELD] = sig
        msg["graph_seed"] = self.graph_seed.hex()
        if len(near) != self.n:
            msg["members"] = json.dumps(list(near))
            msg["openings"] = self.openings
        return msg

    @functools.cached_property
    def _tables(self) -> dict[str, np.ndarray]:
        """Every enrolled client's key fields and signature as (n, width) uint8 arrays, rows in
        the order of the ids (the server's roster: each neighbourhood's message is a gather)."""
        out = {f: np.stack([as_u8(self.keys[u][f]) for u in self.ids]) for f in KEY_FIELDS}
        out[SIGNATURE_FIELD] = np.stack([as_u8(self.signatures[u]) for u in self.ids])
        return out

    @classmethod
    def from_message(cls, msg: Mapping, config: SecAggConfig) -> Roster:
        """Inverse of :meth:`to_message`, checking its form."""
        known = _enrolled_of_text(msg.get("ids"))
        ids = known.ids
        members = _id_list(msg, "members") if msg.get("members") is not None else ids
        fields = {f: (_rows(msg, f, len(members), 32 * _per(f, config)).tobytes(),
                      32 * _per(f, config)) for f in KEY_FIELDS}  # checked rows: bytes at once
        sig = (_rows(msg, SIGNATURE_FIELD, len(members), SIGNATURE_BYTES).tobytes()
               if msg.get(SIGNATURE_FIELD) is not None else bytes(SIGNATURE_BYTES * len(members)))
        keys = _Rows(members, fields, sig)
        if not known.set.issuperset(members):
            raise SecureAggregationError("the roster's members are not all enrolled")
        enc = _rows(msg, "openings", len(ids), 32) if "openings" in msg else None
        seed = msg.get("graph_seed")
        try:
            seed = None if seed is None else bytes.fromhex(str(seed))
        except ValueError as exc:
            raise SecureAggregationError("the roster's 'graph_seed' must be hex") from exc
        return cls(keys, config, everyone=known, openings=enc, graph_seed=seed)

    @property
    def n(self) -> int:
        return len(self.ids)

    def check_members(self, members: Iterable[str], *, what: str) -> list[str]:
        """Sorted distinct members, all enrolled (error naming an unknown one)."""
        members = list(map(str, members))
        known = self._idset  # one set of all n per process
        unknown = [] if known.issuperset(members) else sorted(set(members) - known)
        if unknown:
            raise SecureAggregationError(f"{what}: {unknown} did not take part in the key "
                                         "set-up; they need a new set-up to join")
        if len(set(members)) != len(members):
            raise SecureAggregationError(f"{what}: a client is listed twice")
        return sorted(members)


class _Rows(Mapping):
    """A relayed roster's keys, ``{member: {field: bytes}}`` read from the message's checked
    (rows, width) fields: each member's slices cut when asked (a client reads its k
    neighbours' share-encryption keys and little else: no dict per member built up front).
    ``signatures`` is the members' signatures the same way (64 zero bytes: unsigned)."""

    def __init__(self, members: list[str], fields: dict[str, tuple[bytes, int]], sig: bytes):
        self.members = members
        self._at = dict(zip(members, range(len(members))))
        self._fields = fields
        self.signatures = _Column(self, sig, SIGNATURE_BYTES)

    def column(self, field: str, members: Iterable[str]) -> list[bytes]:
        """``[self[u][field] for u in members]``, without the dicts."""
        raw, w = self._fields[field]
        return [raw[i * w:i * w + w] for i in map(self._at.__getitem__, members)]

    def joined(self, fields: Iterable[str], members: Iterable[str]) -> list[bytes]:
        """Each of ``members``' ``fields`` concatenated (``b"".join(self[u][f] for f in
        fields)``): one (members, width) table gathered at once, then one slice each."""
        table = self.joined_table(fields, members)
        raw, w = table.tobytes(), table.shape[1]
        return [raw[i:i + w] for i in range(0, len(raw), w)] if w else [b""] * len(table)

    def joined_table(self, fields: Iterable[str], members: Iterable[str]) -> np.ndarray:
        """:meth:`joined` as one (len(members), width) uint8 array."""
        at = np.fromiter(map(self._at.__getitem__, members), dtype=np.int64)
        m = len(self.members)
        return np.hstack([np.frombuffer(self._fields[f][0], dtype=np.uint8).reshape(m, -1)[at]
                          for f in fields])

    def rows(self, members: Iterable[str]) -> list[tuple[bytes, bytes]]:
        """``(nonce, enc_key)`` of each of ``members``."""
        members = list(members)
        return list(zip(self.column("nonce", members), self.column("enc_key", members)))

    def __getitem__(self, u: str) -> dict[str, bytes]:
        i = self._at[u]
        return {f: raw[i * w:i * w + w] for f, (raw, w) in self._fields.items()}

    def __contains__(self, u) -> bool:
        return u in self._at

    def __iter__(self):
        return iter(self.members)

    def __len__(self) -> int:
        return len(self.members)


class _Column(Mapping):
    """One per-member field of a :class:`_Rows` (``{member: bytes}``)."""

    def __init__(self, rows: _Rows, raw: bytes, width: int):
        self._rows, self._raw, self._w = rows, raw, width

    def __getitem__(self, u: str) -> bytes:
        i, w = self._rows._at[u], self._w
        return self._raw[i * w:i * w + w]

    def table(self, members: Iterable[str]) -> np.ndarray:
        """``members``' values as one (len(members), width) uint8 array."""
        at = np.fromiter(map(self._rows._at.__getitem__, members), dtype=np.int64)
        return np.frombuffer(self._raw, dtype=np.uint8).reshape(-1, self._w)[at]

    def column(self, members: Iterable[str]) -> list[bytes]:
        """``[self[u] for u in members]``."""
        raw, w = self._raw, self._w
        return [raw[i * w:i * w + w] for i in map(self._rows._at.__getitem__, members)]

    def __iter__(self):
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


def _checked_keys(u: str, msg: Mapping, config: SecAggConfig) -> dict[str, bytes]:
    missing = [f for f in KEY_FIELDS if f not in msg]
    if missing:
        raise SecureAggregationError(f"client {u!r}: public keys lack {missing}; send "
                                     "what SecAggClient.public_keys() returns")
    return {f: as_bytes(msg[f], what=f"client {u!r}: field {f!r}", size=32 * _per(f, config))
            for f in KEY_FIELDS}


class Enrolled:
    """The enrolled ids, checked once: sorted, distinct strings (``ids``), their JSON list
    (``text``, what the graph's digest hashes) and their set.

    Every client is sent all n ids (they fix the masking graph); :meth:`of_text` parses and
    checks one broadcast text once per process, so in-process clients that received the same
    text share the result (a pure function of public data) instead of each parsing n ids.
    """

    def __init__(self, ids):
        self.ids = tuple(sorted(map(str, ids)))
        self.set = frozenset(self.ids)
        if len(self.set) != len(self.ids):
            raise SecureAggregationError("client ids must be distinct strings")
        self.text = json.dumps(list(self.ids))
        self._graphs: dict[tuple, object] = {}

    @functools.cached_property
    def index(self) -> dict[str, int]:
        """Every id's place among the sorted ids plus one (its Shamir x-coordinate), built on
        first use: in-process clients given the same list share it (one per text), where a
        binary search per neighbour cost each of them 2 us (2% of the set-up at 10,000)."""
        return dict(zip(self.ids, range(1, len(self.ids) + 1)))

    def graph(self, degree: int | None, digest: bytes | None):
        """:meth:`MaskingGraph.of <fedlatent.engine.secagg.graph.MaskingGraph.of>` these ids,
        kept on this list (in-process clients given the same list share it: no n ids
        compared per client)."""
        from fedlatent.engine.secagg.graph import MaskingGraph

        key = (degree, digest)
        got = self._graphs.get(key)
        if got is None:
            got = self._graphs[key] = MaskingGraph.of(self.ids, degree, digest)
        return got


@functools.lru_cache(maxsize=8)
def _enrolled_text(text: str) -> Enrolled:
    ids = _id_list({"ids": text}, "ids")
    if len(set(ids)) != len(ids):
        raise SecureAggregationError("the roster lists a client twice")
    return Enrolled(ids)


def _enrolled_of_text(text) -> Enrolled:
    """:class:`Enrolled` of a roster message's ``ids`` (a JSON list), checked, cached by the
    text."""
    if not isinstance(text, str):
        return _enrolled_text.__wrapped__(text)  # the error names the field
    return _enrolled_text(text)


def id_list(text, what: str, error: type[Exception] = SecureAggregationError) -> list[str]:
    """The client ids of a message field holding a JSON list of strings, or ``error`` naming
    ``what`` (the roster's fields, the relayed shares' senders and recipients)."""
    try:
        ids = json.loads(text)
        assert isinstance(ids, list) and set(map(type, ids)) <= {str}  # C loops: n ids
    except (TypeError, ValueError, AssertionError) as exc:
        raise error(f"{what} must be a JSON list of client id strings") from exc
    return ids


def _id_list(msg: Mapping, key: str) -> list[str]:
    return id_list(msg.get(key), f"the roster's {key!r}")


def _rows(msg: Mapping, f: str, n: int, width: int) -> np.ndarray:
    a = np.asarray(msg.get(f))
    if a.dtype != np.uint8 or a.shape != (n, width):
        raise SecureAggregationError(f"the roster's {f!r} must be a ({n}, {width}) uint8 array, "
                                     f"got {a.dtype} {a.shape}")
    return a
