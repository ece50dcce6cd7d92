"""The client side of secure aggregation: keys, shares, masking and the guarded reveal.

One :class:`SecAggClient` lives on a client for a whole fit. Its secrets (one X25519 private key
and a self-mask seed per planned exchange) come from the operating system; only public keys,
AEAD ciphertexts of shares, masked vectors, and what the multi-round rule allows (shares of a
surviving neighbour's self-mask seed, a dropped neighbour's pair mask of that exchange) ever
leave it.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
from collections.abc import Mapping, Sequence

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto
import fedlatent.engine.secagg.shamir as shamir
from fedlatent.engine.secagg.protocol import (
    KEY_FIELDS,
    KEYS_PURPOSE,
    SIGNATURE_FIELD,
    Roster,
    SecAggConfig,
    SecureAggregationError,
    as_bytes,
    as_u8,
    describe,
    exchange_label,
    json_str,
    keys_payload,
    pair_keys,
    pair_keys_many,
    pair_nonce,
    self_mask,
)

__all__ = ["SecAggClient", "share_context"]

log = logging.getLogger(__name__)

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


class SecAggClient:
    """One client's secure-aggregation state for a fit.

    Parameters
    ----------
    client_id : str
        The client's id (its order among the ids fixes the signs of pairwise masks).
    config : SecAggConfig
        The public threshold and fixed-point encoding.
    run : str
        The run this set-up belongs to, and ``round`` the round it happens in: both are bound
        into the client's signature of its keys (:meth:`public_keys` with a signer), so a
        signature made for one run or round never authenticates keys in another; the run is
        also bound into every pair's keys (:func:`~.protocol.pair_keys`).
    round : int

    Notes
    -----
    Authenticated peers (optional): a client given its site's signing key signs its public
    keys; a client given a pinned roster (:class:`fedlatent.engine.site.keys.Roster`) accepts
    the relayed roster only when every peer's keys carry a valid signature of that peer's
    rostered key for this run and round, and aborts naming the peer otherwise. Without a
    roster nothing is verified: the server is trusted to relay keys faithfully
    (honest-but-curious).

    Order of calls: :meth:`public_keys` -> (server relays) :meth:`receive_peer_keys` ->
    :meth:`share_messages` -> (server relays) :meth:`receive_shares`, once per fit; then per
    exchange :meth:`mask` and, when the server asks, :meth:`reveal`.

    References
    ----------
    Bonawitz et al., CCS 2017, section 4 (Figure 4); Bell et al., CCS 2020 (SecAgg+).
    """

    def __init__(self, client_id: str, config: SecAggConfig, *, run: str = "",
                 round: int = 0, graph_commit: bytes | None = None):
        _crypto.require()
        self.id = str(client_id)
        self.config = config
        #: SHA-256 of the server's graph seed, sent before this client drew its keys
        self.graph_commit = None if graph_commit is None else bytes(graph_commit)
        self.run, self.setup_round = str(run), int(round)
        self._private = _crypto.generate_private()  # c_u: share keys and pair masks
        self._seeds = shamir.draw_seeds(config.n_slots)  # b_u per slot, (E, LIMBS)
        self._public: dict[str, bytes] | None = None  # its public key fields, once computed
        self._roster: Roster | None = None
        self._shared = False
        # owner -> the opened bytes of its shares: this client's share of b_owner, per slot
        self._blobs: dict[str, bytes] = {}
        # neighbour -> pair_keys(X25519(c_u, c_v)): share keys and s_uv, agreed once per fit
        self._pair: dict[str, bytes] = {}
        self._streams: dict[str, object] = {}  # neighbour -> s_uv's cipher (rebuilt, not dumped)
        self._masked: dict[bytes, tuple[str, ...]] = {}
        self._mask_words: dict[bytes, int] = {}  # exchange label -> the words it masked
        self._slot_of: dict[bytes, int] = {}  # exchange label -> the slot it used
        self._revealed: set[bytes] = set()
        # slot -> {peer: the exchange in which its self-seed share / pair mask was revealed}
        self._self_shown: dict[str, dict[str, str]] = {}
        self._pair_shown: dict[str, dict[str, str]] = {}

    # --- set-up, once per fit -----------------------------------------------------------------
    def public_keys(self, signer=None) -> dict[str, np.ndarray]:
        """The public key of c_u and a SHA-256 commitment to each slot's b_u (uint8 arrays).

        With ``signer`` (the site's :class:`~fedlatent.engine.site.keys.SiteKeys`), also
        ``"signature"``: its Ed25519 signature of the keys, this client's id, the run and the
        set-up round.
        """
        if self._public is None:  # drawn once: computed once
            self._public = {"enc_key": _crypto.public_raw(self._private),
                            "self_commit": b"".join(_crypto.commit_many(self._self_seeds))}
        out = {k: as_u8(v) for k, v in self._public.items()}
        if signer is not None:
            payload = keys_payload({k: v.tobytes() for k, v in out.items()})
            out[SIGNATURE_FIELD] = as_u8(signer.sign(KEYS_PURPOSE, self.key_context(self.id),
                                                     payload))
        return out

    @functools.cached_property
    def _self_seeds(self) -> list[bytes]:
        """Each slot's self-mask seed b_u, 32 bytes (what keys its self mask; drawn once)."""
        return shamir.seed_bytes(self._seeds)

    def key_context(self, site: str) -> dict:
        """What a site's signature of its keys is bound to: the site, the run, the round, and
        the public settings of the set-up."""
        return {"site": str(site), "run": self.run, "round": self.setup_round,
                "threshold": int(self.config.threshold), "slots": self.config.slots}

    def receive_peer_keys(self, roster: Mapping, trust=None) -> None:
        """Take the roster the server broadcasts (:meth:`SecAggServer.collect_keys`): every
        enrolled client's public keys, its own among them unchanged.

        With ``trust`` (a pinned :class:`~fedlatent.engine.site.keys.Roster`), every peer's
        keys must carry its rostered key's signature for this run and round: an unknown,
        unsigned or substituted peer raises SecureAggregationError naming it, before any
        secret is derived from its keys.
        """
        if self._roster is not None:
            raise SecureAggregationError(f"client {self.id!r}: keys are set up once per fit; "
                                         "start a new SecAggClient to rejoin with new keys")
        roster = Roster.from_message(roster, self.config)
        self.public_keys()
        if roster.keys.get(self.id) != self._public:
            raise SecureAggregationError(f"client {self.id!r}: the relayed roster lacks or "
                                         "alters this client's own public keys")
        if self.config.sparse(roster.n):
            self._check_graph(roster)
        if trust is not None:
            self._authenticate(roster, trust)
        self.config.encoding.check_capacity(roster.n)
        self._roster = roster

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
        """Verify every peer's signed keys against the pinned roster ``trust``."""
        from fedlatent.engine.site.keys import AuthenticationError

        for v in sorted(roster.keys):  # the peers whose keys it uses
            if v == self.id:
                continue
            try:
                trust.verify(v, roster.signatures[v], KEYS_PURPOSE, self.key_context(v),
                             keys_payload({f: roster.keys[v][f] for f in KEY_FIELDS}),
                             what="the key announcement")
            except AuthenticationError as err:
                log.warning("client %r: secure aggregation set-up aborted: %s", self.id, err)
                raise SecureAggregationError(
                    f"client {self.id!r}: peer {v!r} is not authenticated: {err}") from err

    def share_messages(self) -> dict[str, np.ndarray]:
        """Shamir shares of every slot's b_u for each neighbour on the masking graph (every other
        enrolled client on the complete graph), dealt at once (:func:`~.shamir.share_seeds`)
        and sealed in one ChaCha20-Poly1305 message per neighbour, under the share key of the
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

    # --- per exchange -------------------------------------------------------------------------
    def mask(self, stats: Mapping[str, np.ndarray], round: int, exchange: str,
             participants: Sequence[str], slot: int | None = None) -> dict[str, np.ndarray]:
        """y_u = encode(x_u) + PRG(b_u,e; label) + sum_{v in P, v != u} +-PRG(s_uv; label) mod 2^64.

        The sign is + when u sorts before v; ``PRG(s_uv; label)`` is the pair's mask of the
        exchange (one AES-256-CTR keystream per neighbour under the exchange's nonce, no key
        agreement: s_uv was agreed at set-up).
        Each (round, exchange) is masked at most once. With per-exchange secrets
        (``config.slots``), ``slot`` is the exchange's number the server announced; each slot
        is used for one exchange only.
        """
        roster = self._need_roster()
        where = describe(round, exchange)
        label = exchange_label(round, exchange)
        P = self._mask_participants(roster, participants, label, where)
        e = self._take_slot(slot, label, where)
        layout, y = self.config.encoding.encode_flat(stats, client=self.id)
        n = y.size
        me = bisect.bisect_left(P, self.id)  # P is sorted: peers before u subtract, after add
        rows = self._pair_masks(P[:me] + P[me + 1:], label, n)
        y += self_mask(self._self_seeds[e], label, n)
        y += rows[me:].sum(axis=0, dtype=np.uint64)  # wraps modulo 2^64, as the ring does
        y -= rows[:me].sum(axis=0, dtype=np.uint64)
        self._masked[label] = tuple(P)
        self._mask_words[label] = n
        return layout.unflatten(y, copy=False)  # y is this reply's own

    def _mask_participants(self, roster: Roster, participants, label: bytes,
                           where: str) -> list[str]:
        """The participants this client masks with (its neighbourhood among them on a sparse
        graph), after every refusal: a second reply, an unknown or excluded participant, too
        few of them."""
        if label in self._masked:
            raise SecureAggregationError(f"client {self.id!r}: already masked a reply in {where}; "
                                         "a second, different reply would expose the difference")
        P = self._members(roster, participants, f"{where}: participants")
        if self.id not in P:
            raise SecureAggregationError(f"client {self.id!r}: asked to mask in {where} but not "
                                         "among its announced participants")
        # its shares come from its neighbourhood only: holding as many, it holds them all
        full = len(self._blobs) == len(roster.graph.closed(self.id))
        missing = [] if full else sorted(set(P).difference(self._blobs))
        if missing:
            raise SecureAggregationError(f"client {self.id!r}: holds no shares of {missing} "
                                         f"(participants of {where}); they did not finish set-up")
        pairs = self._revealed_pair if self._pair_shown else {}
        gone = {v: next(iter(pairs[v].values())) for v in P if pairs.get(v)} if pairs else {}
        if gone:
            v, at = next(iter(gone.items()))
            raise SecureAggregationError(
                f"client {self.id!r}: participant {v!r} of {where} was declared dropped in {at} "
                "and its pair masks revealed; it must rejoin with new keys (a new set-up)")
        t = self.config.share_threshold(roster.n)
        if len(P) < t:
            raise SecureAggregationError(f"{where}: {len(P)} participants{self._of_near(roster)}, "
                                         f"fewer than the {self._kind(roster)}threshold {t}; the "
                                         "sum could never be unmasked")
        return P

    def reveal(self, round: int, exchange: str, survivors: Sequence[str],
               dropped: Sequence[str]) -> dict[str, np.ndarray]:
        """What the server needs to unmask one exchange's sum, for its neighbours on the masking
        graph (and itself), in the sorted order of ``survivors`` and ``dropped``: ``"self"``,
        one row of 32 bytes per survivor v, this client's share of b_v,e; and when a neighbour
        dropped, ``"pair"``, one row per dropped participant d, the pair mask of (d, this
        client) of this exchange only (its uint64 words as bytes, little-endian).

        Refuses (SecureAggregationError) when the split does not match the participants this
        client masked with, when fewer than ``threshold`` survived, when the exchange was already
        revealed, or when a peer would get both its self-seed share and a pair mask of the same
        slot revealed (with one secret per fit: of any two exchanges).
        """
        roster = self._need_roster()
        where = describe(round, exchange)
        label = exchange_label(round, exchange)
        S, D = self._reveal_split(roster, label, survivors, dropped, where)
        e = self._slot_of[label]
        key = str(e)
        held, pairs = self._self_shown.get(key, {}), self._pair_shown.get(key, {})
        for d in D:
            if d in held:
                raise SecureAggregationError(
                    f"client {self.id!r}: refusing to reveal the pair mask of {d!r} (declared "
                    f"dropped in {where}): its self-mask seed was revealed in "
                    f"{held[d]}, and both would expose its replies")
        for u in (S if pairs else ()):  # none revealed yet: nothing to refuse
            if u in pairs:
                raise SecureAggregationError(
                    f"client {self.id!r}: refusing to reveal the self-mask seed of {u!r} in "
                    f"{where}: its pair mask was revealed in {pairs[u]}")
        at, n = e * shamir.SEED_SHARE_BYTES, shamir.SEED_SHARE_BYTES
        blobs = self._blobs
        out = {"self": np.frombuffer(b"".join([blobs[u][at:at + n] for u in S]),
                                     np.uint8).reshape(-1, n).copy()}
        if D:
            words = self._mask_words[label]
            out["pair"] = np.ascontiguousarray(self._pair_masks(D, label, words), "<u8").view(
                np.uint8).reshape(len(D), 8 * words)
        shown = dict.fromkeys(S, where)  # the first exchange to reveal one is kept
        shown.update(held)
        self._self_shown[key] = shown
        if D:
            self._pair_shown[key] = {**dict.fromkeys(D, where), **pairs}
        self._revealed.add(label)
        if D:
            log.info("client %r revealed its pair masks with dropped %s in %s", self.id, D, where)
        return out

    def _reveal_split(self, roster: Roster, label: bytes, survivors, dropped,
                      where: str) -> tuple[list[str], list[str]]:
        """Its survivors and dropped neighbours of an exchange it masked in and has not revealed,
        checked: they split its participants, it is a survivor, enough of them survived."""
        if label not in self._masked:
            raise SecureAggregationError(f"client {self.id!r}: sent no masked reply in {where}; "
                                         "nothing to reveal")
        if label in self._revealed:
            raise SecureAggregationError(f"client {self.id!r}: already revealed shares for "
                                         f"{where}; it reveals once per exchange")
        mine = self._masked[label]
        if not dropped and list(survivors) == list(mine):  # all survived: nothing to sort out
            return list(mine), []
        S = self._members(roster, survivors, f"{where}: survivors")
        D = self._members(roster, dropped, f"{where}: dropped")
        if (set(S) & set(D) or sorted(S + D) != list(mine)) if D else tuple(S) != mine:
            raise SecureAggregationError(
                f"client {self.id!r}: survivors {S} and dropped {D} of {where} must split its "
                f"participants {list(self._masked[label])}, each client once")
        if self.id not in S:
            raise SecureAggregationError(f"client {self.id!r}: declared dropped in {where}, yet "
                                         "asked to reveal")
        t = self.config.share_threshold(roster.n)
        if len(S) < t:
            raise SecureAggregationError(f"{where}: {len(S)} survivors{self._of_near(roster)}, "
                                         f"fewer than the {self._kind(roster)}threshold {t}; "
                                         "refusing to reveal (the sum cannot be unmasked)")
        return S, D

    # --- persistence (a client rebuilt on every message, as on Flower) ------------------------
    def dump(self) -> str:
        """This client's whole state as JSON (its secrets included: it stays on the client,
        like its data; no pickle). :meth:`load` is the inverse."""
        enc = self.config.encoding
        roster = None
        if self._roster is not None:
            msg = self._roster.to_message()
            roster = {k: v if isinstance(v, str) else v.tobytes().hex() for k, v in msg.items()}
        return json.dumps({
            "id": self.id, "run": self.run, "setup_round": self.setup_round,
            "threshold": int(self.config.threshold), "scale": enc.scale,
            "bound": enc.bound, "slots": self.config.slots, "degree": self.config.degree,
            "local_threshold": self.config.local_threshold,
            "graph_commit": None if self.graph_commit is None else self.graph_commit.hex(),
            "private": _crypto.private_raw(self._private).hex(),
            "self_seed": np.ascontiguousarray(self._seeds, dtype="<u4").tobytes().hex(),
            "roster": roster, "shared": self._shared,
            "held": {u: b.hex() for u, b in self._blobs.items()},
            "pair": {v: b.hex() for v, b in self._pair.items()},
            "masked": {k.hex(): list(v) for k, v in self._masked.items()},
            "mask_words": {k.hex(): v for k, v in self._mask_words.items()},
            "slot_of": {k.hex(): v for k, v in self._slot_of.items()},
            "revealed": sorted(k.hex() for k in self._revealed),  # a set: one order
            "revealed_self": _sorted_view(self._self_shown),
            "revealed_pair": _sorted_view(self._pair_shown)})

    @classmethod
    def load(cls, text: str) -> SecAggClient:
        """The client :meth:`dump` wrote."""
        from fedlatent.engine.secagg.encoding import FixedPoint

        d = json.loads(text)
        cfg = SecAggConfig(int(d["threshold"]), FixedPoint(scale=float(d["scale"]),
                                                           bound=d["bound"]), slots=d["slots"],
                           degree=d.get("degree"), local_threshold=d.get("local_threshold"))
        c = cls.__new__(cls)
        c.id, c.config = str(d["id"]), cfg
        c.graph_commit = None if d.get("graph_commit") is None else bytes.fromhex(d["graph_commit"])
        c.run, c.setup_round = str(d.get("run", "")), int(d.get("setup_round", 0))
        c._private = _crypto.load_private(bytes.fromhex(d["private"]))
        c._seeds = np.frombuffer(bytes.fromhex(d["self_seed"]), dtype="<u4").astype(
            np.int64).reshape(cfg.n_slots, shamir.LIMBS)
        c._roster, c._public = None, None
        if d["roster"] is not None:
            msg = _roster_message(d["roster"])
            c._roster = Roster.from_message(msg, cfg)
        c._shared = bool(d["shared"])
        c._blobs = {u: bytes.fromhex(h) for u, h in d["held"].items()}
        c._pair = {v: bytes.fromhex(h) for v, h in d["pair"].items()}
        c._streams = {}
        c._masked = {bytes.fromhex(k): tuple(v) for k, v in d["masked"].items()}
        c._mask_words = {bytes.fromhex(k): int(v) for k, v in d["mask_words"].items()}
        c._slot_of = {bytes.fromhex(k): int(v) for k, v in d["slot_of"].items()}
        c._revealed = {bytes.fromhex(k) for k in d["revealed"]}
        c._self_shown, c._pair_shown = _by_slot(d["revealed_self"]), _by_slot(d["revealed_pair"])
        return c

    @property
    def _revealed_self(self) -> dict[str, dict[str, str]]:
        """``{peer: {slot: the exchange in which this client revealed its share of the
        peer's self-mask seed}}`` (kept by slot: :attr:`_self_shown`)."""
        return _by_peer(self._self_shown)

    @property
    def _revealed_pair(self) -> dict[str, dict[str, str]]:
        """``{peer: {slot: the exchange in which this client revealed its pair mask with the
        peer}}`` (kept by slot: :attr:`_pair_shown`)."""
        return _by_peer(self._pair_shown)

    # --- helpers ------------------------------------------------------------------------------
    def _members(self, roster: Roster, members, what: str) -> list[str]:
        """``_local(roster, roster.check_members(members))``: the sorted distinct enrolled
        members of this client's neighbourhood (errors naming ``what``); without a look at all
        n ids when every member is a neighbour (what the server sends)."""
        members = list(map(str, members))
        if self.config.sparse(roster.n) and roster.graph.closed_set(self.id).issuperset(members):
            if len(set(members)) != len(members):
                raise SecureAggregationError(f"{what}: a client is listed twice")
            return sorted(members)
        return self._local(roster, roster.check_members(members, what=what))

    def _local(self, roster: Roster, members: list[str]) -> list[str]:
        """On a sparse graph, the members in this client's closed neighbourhood (all of them on
        the complete graph): the participants it masks with, the survivors it reveals for."""
        if not self.config.sparse(roster.n):
            return members
        near = roster.graph.closed_set(self.id)
        return members if near.issuperset(members) else [m for m in members if m in near]

    def _of_near(self, roster: Roster) -> str:
        return " in its neighbourhood" if self.config.sparse(roster.n) else ""

    def _kind(self, roster: Roster) -> str:
        return "neighbourhood " if self.config.sparse(roster.n) else ""

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
            shared = _crypto.agree_many(self._private, self._roster.enc_keys(todo))
            self._pair.update(zip(todo, pair_keys_many(shared, self.run, self.id, todo)))
        return [self._pair[v] for v in peers]

    def _pair_block(self, v: str) -> bytes:
        """:func:`~.protocol.pair_keys` of this client and neighbour ``v``: one X25519
        agreement per neighbour per fit (at set-up), kept."""
        got = self._pair.get(v)
        if got is None:
            shared = _crypto.agree(self._private, self._roster.keys[v]["enc_key"])
            got = self._pair[v] = pair_keys(shared, self.run, self.id, v)
        return got

    def _share_key(self, sender: str, recipient: str) -> bytes:
        """The key of the shares ``sender`` deals to ``recipient`` (one of them this client)."""
        block = self._pair_block(recipient if sender == self.id else sender)
        return block[:32]  # both directions; the associated data binds (sender, recipient)

    def _pair_masks(self, peers: Sequence[str], label: bytes, n: int) -> np.ndarray:
        """The pair mask of this client and each of ``peers`` in one exchange, an (m, n) uint64
        array: the keystream of s_uv under the exchange's nonce (:func:`~.protocol.pair_nonce`),
        each pair's cipher made once per fit."""
        streams = self._streams
        try:
            ciphers = [streams[v] for v in peers]
        except KeyError:  # each pair's cipher once per fit (its agreements in one pass)
            todo = [v for v in peers if v not in streams]
            streams.update(zip(todo, _crypto.stream_keys(
                [block[32:] for block in self._pair_blocks(todo)])))
            ciphers = [streams[v] for v in peers]
        return _crypto.keystream_rows(ciphers, n, pair_nonce(label))

    def _take_slot(self, slot: int | None, label: bytes, where: str) -> int:
        """The slot of one exchange: 0 with one secret per fit, else the announced one, each
        used once."""
        if self.config.slots is None:
            self._slot_of[label] = 0
            return 0
        E = self.config.n_slots
        if not isinstance(slot, int | np.integer) or not 0 <= int(slot) < E:
            raise SecureAggregationError(
                f"client {self.id!r}: {where} announced slot {slot!r}; the set-up planned "
                f"slots 0..{E - 1} (one per exchange); set up again with more slots")
        if int(slot) in self._slot_of.values():
            raise SecureAggregationError(
                f"client {self.id!r}: slot {int(slot)} announced for {where} was already used "
                "by another exchange; every exchange uses its own secrets")
        self._slot_of[label] = int(slot)
        return int(slot)



def _by_peer(by_slot: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """``{slot: {peer: where}}`` as ``{peer: {slot: where}}``."""
    out: dict[str, dict[str, str]] = {}
    for slot, shown in by_slot.items():
        for peer, where in shown.items():
            out.setdefault(peer, {})[slot] = where
    return out


def _sorted_view(by_slot: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """:func:`_by_peer` with peers and slots sorted (what a dump writes: one text per state)."""
    return {p: dict(sorted(m.items())) for p, m in sorted(_by_peer(by_slot).items())}


def _by_slot(by_peer: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Inverse of :func:`_by_peer`."""
    out: dict[str, dict[str, str]] = {}
    for peer, shown in by_peer.items():
        for slot, where in shown.items():
            out.setdefault(str(slot), {})[peer] = str(where)
    return out


def _rows_bytes(sealed) -> list:
    """Messages as bytes: the rows of a 2-d uint8 array (one copy, then views), or a list of
    bytes."""
    if isinstance(sealed, np.ndarray) and sealed.ndim == 2:
        raw, w = memoryview(sealed.tobytes()), sealed.shape[1]
        return [raw[i * w:(i + 1) * w] for i in range(len(sealed))]
    return [bytes(m) for m in sealed]


def _roster_message(saved: dict) -> dict:
    """The roster message a dump holds (arrays as hex) back to arrays."""
    rows = len(json.loads(saved.get("members") or saved["ids"]))
    text = ("ids", "members", "graph_seed")
    return {k: v if k in text else np.frombuffer(bytes.fromhex(v), np.uint8).reshape(
        len(json.loads(saved["ids"])) if k == "enc_all" else rows, -1)
        for k, v in saved.items()}
