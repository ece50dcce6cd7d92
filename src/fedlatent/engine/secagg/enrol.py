"""The client's side of the set-up, once per fit: commit, open, check the roster, deal shares.

:class:`Enrolment` is the part of :class:`~fedlatent.engine.secagg.client.SecAggClient` that runs
before any exchange (:mod:`~fedlatent.engine.secagg.commitments` says why the keys are committed
first): :meth:`~Enrolment.commitment` -> (the server closes the list) :meth:`~Enrolment.open` ->
(the server relays the roster) :meth:`~Enrolment.receive_peer_keys` ->
:meth:`~Enrolment.share_messages` -> (the server relays the sealed shares)
:meth:`~Enrolment.receive_shares`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto
import fedlatent.engine.secagg.shamir as shamir
from fedlatent.engine.secagg.commitments import (
    check_openings,
    check_strength,
    commitment,
    opening,
    openings_hold,
)
from fedlatent.engine.secagg.protocol import (
    KEY_FIELDS,
    KEYS_PURPOSE,
    SIGNATURE_BYTES,
    SIGNATURE_FIELD,
    Roster,
    SecureAggregationError,
    as_bytes,
    as_u8,
    json_str,
    pair_keys,
    pair_keys_many,
    signed_keys,
)

__all__ = ["Enrolment", "share_context"]

log = logging.getLogger("fedlatent.engine.secagg.client")

SEALED_BYTES = 12 + shamir.SEED_SHARE_BYTES + 16  # nonce, one slot's share, Poly1305 tag


SHARE_TAG = b"fedlatent/secagg/share\x00"


def share_context(sender: str, recipient: str) -> bytes:
    """Associated data binding a share message to (sender, recipient): the tag and the JSON
    list ``[sender, recipient]``."""
    return SHARE_TAG + b"[" + json_str(sender) + b", " + json_str(recipient) + b"]"


def share_contexts(sender: str, recipients: Sequence[str]) -> list[bytes]:
    """:func:`share_context` of one sender and many recipients."""
    head = SHARE_TAG + b"[" + json_str(sender) + b", "
    return [head + json_str(v) + b"]" for v in recipients]


def share_contexts_to(senders: Sequence[str], recipient: str) -> list[bytes]:
    """:func:`share_context` of many senders and one recipient."""
    tail = b", " + json_str(recipient) + b"]"
    return [SHARE_TAG + b"[" + json_str(u) + tail for u in senders]


class Enrolment:
    """The set-up half of :class:`~fedlatent.engine.secagg.client.SecAggClient` (its state is
    the client's: see there)."""

    # --- set-up, once per fit -----------------------------------------------------------------
    def commitment(self) -> dict[str, np.ndarray]:
        """``{"commit": 32 bytes}``: this client's commitment to its X25519 key and its nonce
        (:func:`~.commitments.commitment`), the first thing it sends; nothing of either
        leaves it before the server closes the list (:meth:`open`)."""
        me = self._own_keys()
        self._committed = True
        return {"commit": as_u8(commitment(self.run, self.setup_round, self.id,
                                           opening(me["nonce"], me["enc_key"])))}

    def open(self, closed: bytes, n: int, signer=None) -> dict[str, np.ndarray]:
        """This client's public keys (:meth:`public_keys`), once the server closed the list of
        commitments: ``closed`` is its digest (:func:`~.commitments.closed_digest`), ``n`` the
        clients it lists. Refuses (SecureAggregationError) before revealing anything when this
        client has not committed, has opened already, or when the masking graph announced is
        weaker than the library's bounds give for ``n`` clients
        (:func:`~.commitments.check_strength`)."""
        if not getattr(self, "_committed", False):
            raise SecureAggregationError(f"client {self.id!r}: asked to open keys it never "
                                         "committed to; the set-up starts with its commitment")
        if self._closed is not None:
            raise SecureAggregationError(f"client {self.id!r}: the commitments closed once "
                                         "already; keys are opened once per set-up")
        closed = bytes(closed)
        if len(closed) != 32 or not isinstance(n, int | np.integer) or int(n) < 1:
            raise SecureAggregationError(f"client {self.id!r}: the closed list must be a "
                                         "32-byte digest and a number of clients")
        self._check_strength(int(n))
        self._closed, self._closed_n = closed, int(n)
        return self.public_keys(signer=signer)

    def _check_strength(self, n: int) -> None:
        why = check_strength(self.config, n)
        if why:
            log.warning("client %r: secure aggregation set-up refused: %s", self.id, why)
            raise SecureAggregationError(f"client {self.id!r}: {why}")

    def _own_keys(self) -> dict[str, bytes]:
        """This client's public key fields as bytes (computed once)."""
        if self._public is None:  # drawn once: computed once
            self._public = {"enc_key": _crypto.public_raw(self._private),
                            "self_commit": b"".join(_crypto.commit_many(self._self_seeds)),
                            "nonce": self._nonce}
        return self._public

    def public_keys(self, signer=None) -> dict[str, np.ndarray]:
        """The public key of c_u, a SHA-256 commitment to each slot's b_u and the nonce of its
        commitment (uint8 arrays); only once the list of commitments closed (:meth:`open`).

        With ``signer`` (the site's :class:`~fedlatent.engine.site.keys.SiteKeys`), also
        ``"signature"``: its Ed25519 signature of the keys and this client's id, bound to the
        run, the set-up round and the set-up's settings (:meth:`key_head`).
        """
        if self._closed is None:
            raise SecureAggregationError(f"client {self.id!r}: its keys are revealed only once "
                                         "the server closed the list of commitments (open)")
        out = {k: as_u8(v) for k, v in self._own_keys().items()}
        if signer is not None:
            out[SIGNATURE_FIELD] = as_u8(signer.sign_bytes(
                self.key_head + signed_keys(self.id, self._public)))
        return out

    @functools.cached_property
    def _self_seeds(self) -> list[bytes]:
        """Each slot's self-mask seed b_u, 32 bytes (what keys its self mask; drawn once)."""
        return shamir.seed_bytes(self._seeds)

    def key_context(self) -> dict:
        """What every site's signature of its keys in this set-up is bound to: the run, the
        round, and the public settings of the set-up (the site's id is in the payload)."""
        cfg = self.config
        return {"run": self.run, "round": self.setup_round, "threshold": int(cfg.threshold),
                "slots": cfg.slots, "degree": cfg.degree, "local_threshold": cfg.local_threshold,
                "participation": float(cfg.participation)}

    @functools.cached_property
    def key_head(self) -> bytes:
        """The statement head of the keys' signatures (:func:`~fedlatent.engine.site.keys.
        statement_head` of :data:`~.protocol.KEYS_PURPOSE` and :meth:`key_context`)."""
        from fedlatent.engine.site.keys import statement_head

        return statement_head(KEYS_PURPOSE, self.key_context())

    def receive_peer_keys(self, roster: Mapping, trust=None) -> None:
        """Take the roster the server relays (:meth:`SecAggServer.roster_for`): every enrolled
        id and opening, and the public keys of this client's neighbourhood, its own among them
        unchanged.

        Refused (SecureAggregationError, before any secret is derived): a list of clients or an
        opening other than the one committed (:meth:`_check_commitments`), a weaker graph, a
        graph seed other than the committed one or another neighbourhood's keys
        (:meth:`_check_graph`); with ``trust`` (a pinned
        :class:`~fedlatent.engine.site.keys.Roster`), an unknown, unsigned or substituted
        peer, named; the client then requires its neighbours' confirmations in every exchange
        (:meth:`SecAggClient.reveal`).
        """
        if self._roster is not None:
            raise SecureAggregationError(f"client {self.id!r}: keys are set up once per fit; "
                                         "start a new SecAggClient to rejoin with new keys")
        if self._closed is None:
            raise SecureAggregationError(f"client {self.id!r}: a roster before the commitments "
                                         "closed and its keys were opened; set-up refused")
        roster = Roster.from_message(roster, self.config)
        if roster.keys.get(self.id) != self._own_keys():
            raise SecureAggregationError(f"client {self.id!r}: the relayed roster lacks or "
                                         "alters this client's own public keys")
        self._check_strength(roster.n)
        self._check_commitments(roster)
        if self.config.sparse(roster.n):
            self._check_graph(roster)
        if trust is not None:
            self._authenticate(roster, trust)
        self.config.encoding.check_capacity(roster.n)
        self._roster = roster

    def _check_commitments(self, roster: Roster) -> None:
        """The roster is the list closed before this client opened: its clients, each opening
        recomputed into its commitment, give the closed digest (a client added or left out
        after the close, or an opening changed, does not), and the keys and nonces of its
        neighbourhood are those their openings hash."""
        members = list(roster.keys)
        at = np.array(roster.x_of(members), dtype=np.int64) - 1
        if roster.n != self._closed_n or not openings_hold(
                roster.openings, roster.key_rows(("nonce", "enc_key"), members), at):
            raise SecureAggregationError(
                f"client {self.id!r}: the roster's {roster.n} clients or its neighbours' keys "
                f"are not the {self._closed_n} openings committed before the list closed; a "
                "key that arrives or changes after the close is refused: set-up refused")
        got = check_openings(self.run, self.setup_round, roster.ids, roster.ids_json,
                             roster.openings, roster.content)
        if got != self._closed:
            raise SecureAggregationError(
                f"client {self.id!r}: the roster's openings do not give the list of commitments "
                "that closed before this client opened its keys (a client added, left out or "
                "changed after the close could choose the masking graph): set-up refused")

    def _check_graph(self, roster: Roster) -> None:
        """On a sparse graph: the revealed seed matches the commitment this client got before
        it drew its keys, and the keys relayed are those of its own neighbourhood, which it
        derives itself (never a list the server chose)."""
        seed = roster.graph_seed
        if self.graph_commit is None or seed is None or _crypto.commit(seed) != self.graph_commit:
            raise SecureAggregationError(
                f"client {self.id!r}: the masking graph's seed does not match the commitment "
                "the server sent before the keys (or one of them is missing); the server could "
                "have chosen the graph: set-up refused")
        near = roster.graph.closed(self.id)
        if sorted(roster.keys) != list(near):
            raise SecureAggregationError(
                f"client {self.id!r}: the relayed keys are of {sorted(roster.keys)}, not of its "
                f"neighbourhood {list(near)} on the masking graph the seed fixes")

    def _authenticate(self, roster: Roster, trust) -> None:
        """Verify every peer's signed keys against the pinned roster ``trust``: then the
        pair secrets agreed with them are its peers' own, and so are the confirmations of the
        consistency round (:attr:`_authenticated`). Each statement is the roster's row of a
        peer under :meth:`key_head` and its id; those verified in this process already, byte
        for byte, are found at once (:class:`_Verified`), the others verified by
        ``cryptography`` (:func:`~fedlatent.engine.site.keys.verify_bytes`); the first peer
        that fails is named by :meth:`~fedlatent.engine.site.keys.Roster.verify_message`."""
        from fedlatent.engine.site.keys import AuthenticationError

        peers = [v for v in sorted(roster.keys) if v != self.id]  # the peers whose keys it uses
        rows = roster.key_rows(KEY_FIELDS, peers)
        sigs = np.frombuffer(b"".join(_signatures(roster, peers)), dtype=np.uint8).reshape(
            len(peers), SIGNATURE_BYTES) if not hasattr(roster.signatures, "table") \
            else roster.signatures.table(peers)
        at = np.array(roster.x_of(peers), dtype=np.int64) - 1
        bad = _Verified.of(self.key_head, roster, rows.shape[1]).check(
            peers, at, rows, sigs, trust)
        if bad < len(peers):  # the first peer that fails, named
            v = peers[bad]
            msg = self.key_head + json_str(v) + b"\x00" + rows[bad].tobytes()
            try:
                trust.verify_message(v, sigs[bad].tobytes(), msg, what="the key announcement")
                raise AuthenticationError(f"the key announcement from site {v!r} does not "
                                          "verify against its rostered key")
            except AuthenticationError as err:
                log.warning("client %r: secure aggregation set-up aborted: %s", self.id, err)
                raise SecureAggregationError(
                    f"client {self.id!r}: peer {v!r} is not authenticated: {err}") from err
        self._authenticated = True

    def share_messages(self) -> dict[str, np.ndarray]:
        """Shamir shares of every slot's b_u for each neighbour on the masking graph (every other
        enrolled client on the complete graph), dealt at once (:func:`~.shamir.share_seeds`)
        and sealed in one AES-256-GCM message per neighbour, under the share key of the
        pair (:func:`~.protocol.pair_keys`) and bound to (u, v): ``{peer: bytes}``
        (:meth:`sealed_shares` as a mapping)."""
        peers, rows = self.sealed_shares()
        return dict(zip(peers, rows))

    def sealed_shares(self) -> tuple[list[str], np.ndarray]:
        """:meth:`share_messages` as ``(peers, rows)``: the sorted neighbours and a (k, 12 +
        32 slots + 16) uint8 array, row i the sealed message to ``peers[i]`` (what the engine's
        set-up message carries: one array, not one field per neighbour)."""
        roster = self._need_roster()
        if self._shared:
            raise SecureAggregationError(f"client {self.id!r}: shares are dealt once per fit")
        t = self.config.share_threshold(roster.n)
        near = roster.graph.closed(self.id)
        shares = shamir.share_seeds(self._seeds, roster.x_of(near), t)
        raw = shares.astype("<u4", copy=False).tobytes()  # a holder's share of every slot
        w, me = len(raw) // len(near), near.index(self.id)
        self._blobs[self.id] = raw[me * w:me * w + w]
        peers = [v for v in near if v != self.id]
        view = memoryview(raw)  # slices without copies: the seal reads them
        plain = [view[i * w:i * w + w] for i in range(len(near)) if i != me]
        keys = [block[:32] for block in self._pair_blocks(peers)]  # the pairs' share keys
        rows = _crypto.aead_seal_rows(keys, plain, share_contexts(self.id, peers))
        self._shared = True
        return peers, rows

    def receive_shares(self, sealed: Mapping[str, np.ndarray]) -> None:
        """Open the shares the server relays ``{sender: bytes}``; a sender whose ciphertext does
        not open is named."""
        senders = [str(u) for u in sealed]
        self.receive_sealed(senders, [as_bytes(sealed[u], what=f"share from {u!r}")
                                      for u in sealed])

    def receive_sealed(self, senders: Sequence[str], sealed) -> None:
        """:meth:`receive_shares` of ``senders`` and their messages (bytes each, or the rows of
        a uint8 array): every sender checked (enrolled, a neighbour, once), every message
        opened, then every share checked at once (field elements)."""
        roster = self._need_roster()
        near = roster.graph.closed_set(self.id)
        given = set(senders)
        if len(given) == len(senders) and self.id not in given and near.issuperset(given) \
                and given.isdisjoint(self._blobs):  # as the server relays: checked at once
            senders = list(senders)
        else:
            self._check_senders(roster, near, senders)
        sealed = _rows_bytes(sealed)
        keys = [block[:32] for block in self._pair_blocks(senders)]
        opened = _crypto.aead_open_rows(keys, sealed, share_contexts_to(senders, self.id))
        size = shamir.SEED_SHARE_BYTES * self.config.n_slots
        if opened is None or any(len(p) != size for p in opened):  # name the first bad one
            opened = [self._open_share(u, msg) for u, msg in zip(senders, sealed)]
        words = np.frombuffer(b"".join(opened), dtype="<u4").reshape(len(opened), -1)
        bad = np.flatnonzero(np.any(words >= shamir.P31, axis=1))  # checked at once
        if bad.size:
            raise SecureAggregationError(f"client {self.id!r}: the share from "
                                         f"{senders[bad[0]]!r} holds a value that is not a "
                                         "field element")
        self._blobs.update(zip(senders, opened))

    def _check_senders(self, roster: Roster, near, senders: Sequence[str]) -> None:
        """The error naming the first sender of shares that is not another enrolled client, not
        a neighbour, or sent twice."""
        seen: set[str] = set()
        for u in senders:
            if u == self.id or (u not in near and not roster.enrolled(u)):
                raise SecureAggregationError(f"client {self.id!r}: a share from {u!r}, which is "
                                             "not another enrolled client")
            if u not in near:
                raise SecureAggregationError(f"client {self.id!r}: a share from {u!r}, which is "
                                             "not its neighbour on the masking graph")
            if u in self._blobs or u in seen:
                raise SecureAggregationError(f"client {self.id!r}: a second share from {u!r}")
            seen.add(u)

    def _open_share(self, u: str, msg) -> bytes:
        """The opened share message from ``u`` (its size checked), or the error naming it."""
        size = shamir.SEED_SHARE_BYTES * self.config.n_slots
        try:
            plain = _crypto.aead_open(self._share_key(u, self.id), bytes(msg),
                                      share_context(u, self.id))
        except ValueError as exc:
            raise SecureAggregationError(f"client {self.id!r}: the share from {u!r} does not "
                                         f"open ({exc})") from exc
        if len(plain) != size:
            raise SecureAggregationError(
                f"client {self.id!r}: the share from {u!r} holds {len(plain)} bytes, "
                f"expected {size} ({self.config.n_slots} slots)")
        return plain

    @property
    def enrolled(self) -> tuple[str, ...]:
        """Clients whose shares this client holds (itself included): whom it can mask with."""
        return tuple(sorted(self._blobs))


    def _need_roster(self) -> Roster:
        if self._roster is None:
            raise SecureAggregationError(f"client {self.id!r}: call receive_peer_keys first (the "
                                         "key set-up precedes every exchange)")
        return self._roster

    def _pair_blocks(self, peers: Sequence[str]) -> list[bytes]:
        """:meth:`_pair_block` of each of ``peers``: the agreements and key derivations not yet
        done, in one pass each."""
        todo = [v for v in peers if v not in self._pair]
        if todo:
            roster = self._roster
            keys = roster.enc_keys(todo)
            shared = self._offered_for(keys) or _crypto.agree_many(self._private, keys)
            self._pair.update(zip(todo, pair_keys_many(
                shared, self._closed, roster.index[self.id], roster.x_of(todo))))
        return [self._pair[v] for v in peers]

    def offer_agreements(self, peer_keys: bytes | None, shared) -> None:
        """The X25519 secrets of this client's key with ``peer_keys`` (raw 32-byte public keys,
        joined), ``shared`` (32 bytes each, joined), computed ahead by a worker of the
        in-process runtime (:mod:`~fedlatent.engine.secagg.ahead`). Kept until the next
        agreements are due (:meth:`_pair_blocks`: after the roster's checks), and used then
        only for exactly these peer keys in this order; otherwise dropped and agreed here."""
        ok = peer_keys is not None and len(peer_keys) == len(shared) and len(shared) % 32 == 0
        self._offered = (bytes(peer_keys), bytes(shared)) if ok else None

    def _offered_for(self, keys: list[bytes]) -> list[bytes] | None:
        """The secrets offered for exactly ``keys`` (then taken), else None (any offer
        dropped)."""
        got, self._offered = getattr(self, "_offered", None), None
        if got is None or b"".join(keys) != got[0]:
            return None
        raw = got[1]
        return [raw[i:i + 32] for i in range(0, len(raw), 32)]

    def _pair_block(self, v: str) -> bytes:
        """:func:`~.protocol.pair_keys` of this client and neighbour ``v``: one X25519
        agreement per neighbour per fit (at set-up), kept."""
        got = self._pair.get(v)
        if got is None:
            shared = _crypto.agree(self._private, self._roster.keys[v]["enc_key"])
            x = self._roster.index
            got = self._pair[v] = pair_keys(shared, self._closed, x[self.id], x[v])
        return got

    def _share_key(self, sender: str, recipient: str) -> bytes:
        """The key of the shares ``sender`` deals to ``recipient`` (one of them this client)."""
        block = self._pair_block(recipient if sender == self.id else sender)
        return block[:32]  # both directions; the associated data binds (sender, recipient)



def _rows_bytes(sealed) -> list:
    """Messages as bytes: the rows of a 2-d uint8 array (one copy, then views), or a list of
    bytes."""
    if isinstance(sealed, np.ndarray) and sealed.ndim == 2:
        raw, w = memoryview(sealed.tobytes()), sealed.shape[1]
        return [raw[i * w:(i + 1) * w] for i in range(len(sealed))]
    return [bytes(m) for m in sealed]




class _Verified:
    """The key announcements of one set-up verified in this process, by the signer's place
    among the enrolled ids: its signature, the rostered key it verified under and its keys
    (one row each, ``ok`` where verified). A pure function of public data: the sites one
    process holds (in-process, simulation) each verify their neighbours' keys, and each
    announcement is verified by ``cryptography`` once between them; a site finds the rest by
    comparing what it received with these rows at once (where the per-peer lookup of the
    statements, built again by every site, cost some 2 us a neighbour)."""

    def __init__(self, head: bytes, n: int, width: int):
        self.head = head
        self.ok = np.zeros(n, dtype=bool)
        self.rows = np.zeros((n, width), dtype=np.uint8)
        self.sigs = np.zeros((n, SIGNATURE_BYTES), dtype=np.uint8)
        self.keys = np.zeros((n, 32), dtype=np.uint8)
        self.ids: tuple[str, ...] = ()
        self._trust = self._rostered = self._known = None

    @classmethod
    def of(cls, head: bytes, roster: Roster, width: int) -> _Verified:
        """The table of the set-up whose statements start with ``head`` among ``roster``'s
        enrolled ids, of rows of ``width`` bytes (made on first use; the last two kept)."""
        key = (head, roster.ids_json, width)
        got = _VERIFIED.get(key)
        if got is None:
            _VERIFIED[key] = got = cls(head, roster.n, width)
            got.ids = roster.ids
            while len(_VERIFIED) > 2:
                _VERIFIED.pop(next(iter(_VERIFIED)))
        return got

    def check(self, peers: list[str], at: np.ndarray, rows: np.ndarray, sigs: np.ndarray,
              trust) -> int:
        """The place of the first of ``peers`` (at places ``at``, their keys ``rows`` and
        signatures ``sigs``) whose announcement does not verify under its key in the pinned
        roster ``trust``, or their number when all do."""
        from fedlatent.engine.site.keys import verify_bytes

        rostered, keys = self.rostered(trust, peers, at)
        if self.ok[at].all() and rostered.all() and np.array_equal(self.rows[at], rows) \
                and np.array_equal(self.sigs[at], sigs) and np.array_equal(self.keys[at], keys):
            return len(peers)  # every one verified here before (the common case: at once)
        seen = self.ok[at] & (self.rows[at] == rows).all(axis=1) & (
            self.sigs[at] == sigs).all(axis=1) & (self.keys[at] == keys).all(axis=1)
        for i in np.flatnonzero(~(seen & rostered)).tolist():
            if not rostered[i] or not verify_bytes(
                    keys[i].tobytes(), sigs[i].tobytes(), self.head + json_str(peers[i])
                    + b"\x00" + rows[i].tobytes()):
                return i
            j = at[i]
            self.ok[j], self.rows[j], self.sigs[j], self.keys[j] = True, rows[i], sigs[i], keys[i]
        return len(peers)

    def rostered(self, trust, peers: list[str], at: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """Whether each of ``peers`` is in the pinned roster ``trust`` and its raw key there
        (32 zero bytes if not): for the first roster object this table meets, every enrolled
        id's looked up once and taken by place (the sites of a process share one; a roster is
        not changed once built), for another one by one."""
        if self._trust is None:
            raws = trust.public_raws(self.ids)
            self._rostered = np.array([r is not None for r in raws], dtype=bool)
            self._known = _raw_rows(raws)
            self._trust = trust
        if self._trust is trust:
            return self._rostered[at], self._known[at]
        raws = trust.public_raws(peers)
        return np.array([r is not None for r in raws], dtype=bool), _raw_rows(raws)


def _raw_rows(raws: list) -> np.ndarray:
    """Raw 32-byte keys (None: 32 zero bytes) as one (len(raws), 32) uint8 array."""
    return np.frombuffer(b"".join(r if r is not None else bytes(32) for r in raws),
                         dtype=np.uint8).reshape(len(raws), 32)


#: ``{(statement head, enrolled ids): _Verified}`` of the last set-ups
_VERIFIED: dict[tuple[bytes, str, int], _Verified] = {}


def _signatures(roster: Roster, members: list[str]) -> list[bytes]:
    """Each of ``members``' signature of its keys in a roster (bytes)."""
    sigs = roster.signatures
    return sigs.column(members) if hasattr(sigs, "column") else [bytes(sigs[u]) for u in members]
