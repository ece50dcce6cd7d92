"""The client side of secure aggregation: keys, shares, masking and the guarded reveal.

One :class:`SecAggClient` lives on a client for a whole fit. Its secrets (two X25519 private keys
and a self-mask seed) come from the operating system; only public keys, AEAD ciphertexts of
shares, masked vectors and the shares the multi-round rule allows ever leave it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto
import fedlatent.engine.secagg.shamir as shamir
from fedlatent.engine.secagg.encoding import Layout
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
    keys_payload,
    pair_mask,
    self_mask,
    slot_item,
)

__all__ = ["SecAggClient", "share_context"]

log = logging.getLogger(__name__)

SEALED_BYTES = 12 + 2 * shamir.SHARE_BYTES + 16  # nonce, two shares, Poly1305 tag


def share_context(sender: str, recipient: str) -> bytes:
    """Associated data (and HKDF context) binding a share message to (sender, recipient)."""
    return b"fedlatent/secagg/share\x00" + json.dumps([str(sender), str(recipient)]).encode()


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
        signature made for one run or round never authenticates keys in another.
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
        E = config.n_slots
        self._mask_privates = [_crypto.generate_private() for _ in range(E)]  # s_u per slot
        self._enc_private = _crypto.generate_private()  # c_u
        self._self_seeds = [_crypto.random_bytes() for _ in range(E)]  # b_u per slot
        self._mask_private, self._self_seed = self._mask_privates[0], self._self_seeds[0]
        self._roster: Roster | None = None
        self._shared = False
        # owner -> the opened bytes of its shares: per slot (share of s_owner, share of b_owner)
        self._blobs: dict[str, bytes] = {}
        self._held = _Held(self._blobs, first=True)  # owner -> (share of s, of b), slot 0
        # owner -> per slot (share of s_owner, share of b_owner)
        self._held_slots = _Held(self._blobs)
        self._pair_secret: dict[tuple[str, int], bytes] = {}
        self._enc_shared: dict[str, bytes] = {}
        self._masked: dict[bytes, tuple[str, ...]] = {}
        self._slot_of: dict[bytes, int] = {}  # exchange label -> the slot it used
        self._revealed: set[bytes] = set()
        self._revealed_self: dict[str, str] = {}  # peer -> the exchange its b was revealed in
        self._revealed_mask: dict[str, str] = {}  # peer -> the exchange its s was revealed in

    # --- set-up, once per fit -----------------------------------------------------------------
    def public_keys(self, signer=None) -> dict[str, np.ndarray]:
        """The public keys of s_u and c_u and a SHA-256 commitment to b_u (uint8 arrays).

        With ``signer`` (the site's :class:`~fedlatent.engine.site.keys.SiteKeys`), also
        ``"signature"``: its Ed25519 signature of the keys, this client's id, the run and the
        set-up round.
        """
        out = {"mask_key": as_u8(b"".join(_crypto.public_raw(k) for k in self._mask_privates)),
               "enc_key": as_u8(_crypto.public_raw(self._enc_private)),
               "self_commit": as_u8(b"".join(_crypto.commit(b) for b in self._self_seeds))}
        if signer is not None:
            payload = keys_payload({k: v.tobytes() for k, v in out.items()})
            out[SIGNATURE_FIELD] = as_u8(signer.sign(KEYS_PURPOSE, self.key_context(self.id),
                                                     payload))
        return out

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
        own = {k: as_bytes(v, what=k) for k, v in self.public_keys().items()}
        if roster.keys.get(self.id) != own:
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
        """Shamir shares of s_u and b_u (every slot's) for each neighbour on the masking graph
        (every other enrolled client on the complete graph), each sealed with
        ChaCha20-Poly1305 under HKDF(X25519(c_u, c_v)) and bound to (u, v): ``{peer: bytes}``."""
        roster = self._need_roster()
        if self._shared:
            raise SecureAggregationError(f"client {self.id!r}: shares are dealt once per fit")
        t = self.config.share_threshold(roster.n)
        near = roster.graph.closed(self.id)
        xs = [roster.index[v] for v in near]
        E = self.config.n_slots
        pairs = [k for e in range(E) for k in (_crypto.private_raw(self._mask_privates[e]),
                                               self._self_seeds[e])]
        blobs = shamir.share_blobs(pairs, xs, t)  # per holder: (s, b) of every slot
        out = {}
        for v in near:
            plain = blobs[roster.index[v]]
            if v == self.id:
                self._blobs[v] = plain
                continue
            ad = share_context(self.id, v)
            key = _crypto.derive_key(self._enc_secret(v), ad)
            out[v] = as_u8(_crypto.aead_seal(key, plain, ad))
        self._shared = True
        return out

    def receive_shares(self, sealed: Mapping[str, np.ndarray]) -> None:
        """Open the shares the server relays ``{sender: bytes}``; a sender whose ciphertext does
        not open is named."""
        roster = self._need_roster()
        for u, msg in sealed.items():
            u = str(u)
            if u not in roster.index or u == self.id:
                raise SecureAggregationError(f"client {self.id!r}: a share from {u!r}, which is "
                                             "not another enrolled client")
            if not roster.graph.adjacent(self.id, u):
                raise SecureAggregationError(f"client {self.id!r}: a share from {u!r}, which is "
                                             "not its neighbour on the masking graph")
            if u in self._held:
                raise SecureAggregationError(f"client {self.id!r}: a second share from {u!r}")
            ad = share_context(u, self.id)
            key = _crypto.derive_key(self._enc_secret(u), ad)
            try:
                plain = _crypto.aead_open(key, as_bytes(msg, what=f"share from {u!r}"), ad)
            except ValueError as exc:
                raise SecureAggregationError(f"client {self.id!r}: the share from {u!r} does not "
                                             f"open ({exc})") from exc
            n = shamir.SHARE_BYTES
            if len(plain) != 2 * n * self.config.n_slots:
                raise SecureAggregationError(
                    f"client {self.id!r}: the share from {u!r} holds {len(plain)} bytes, "
                    f"expected {2 * n * self.config.n_slots} ({self.config.n_slots} slots)")
            if not _field_elements(plain):
                raise SecureAggregationError(f"client {self.id!r}: the share from {u!r} holds a "
                                             "value that is not a field element")
            self._blobs[u] = plain

    @property
    def enrolled(self) -> tuple[str, ...]:
        """Clients whose shares this client holds (itself included): whom it can mask with."""
        return tuple(sorted(self._held))

    # --- per exchange -------------------------------------------------------------------------
    def mask(self, stats: Mapping[str, np.ndarray], round: int, exchange: str,
             participants: Sequence[str], slot: int | None = None) -> dict[str, np.ndarray]:
        """y_u = encode(x_u) + PRG(b_u; k, e) + sum_{v in P, v != u} +-PRG(s_uv; k, e) mod 2^64.

        The sign is + when u sorts before v. Each (round, exchange) is masked at most once.
        With per-exchange secrets (``config.slots``), ``slot`` is the exchange's number the
        server announced; each slot is used for one exchange only.
        """
        roster = self._need_roster()
        where = describe(round, exchange)
        label = exchange_label(round, exchange)
        if label in self._masked:
            raise SecureAggregationError(f"client {self.id!r}: already masked a reply in {where}; "
                                         "a second, different reply would expose the difference")
        P = roster.check_members(participants, what=f"{where}: participants")
        if self.id not in P:
            raise SecureAggregationError(f"client {self.id!r}: asked to mask in {where} but not "
                                         "among its announced participants")
        P = self._local(roster, P)  # on a sparse graph: its neighbourhood among them
        near = set(roster.graph.closed(self.id))
        missing = sorted(set(P) - set(self._held))
        if missing:
            raise SecureAggregationError(f"client {self.id!r}: holds no shares of {missing} "
                                         f"(participants of {where}); they did not finish set-up")
        gone = {v: self._revealed_mask[v] for v in P if v in self._revealed_mask}
        if gone:
            v, at = next(iter(gone.items()))
            raise SecureAggregationError(
                f"client {self.id!r}: participant {v!r} of {where} was declared dropped in {at} "
                "and its mask key revealed; it must rejoin with new keys (a new set-up)")
        t = self.config.share_threshold(roster.n)
        if len(P) < t:
            raise SecureAggregationError(f"{where}: {len(P)} participants{self._of_near(roster)}, "
                                         f"fewer than the {self._kind(roster)}threshold {t}; the "
                                         "sum could never be unmasked")
        e = self._take_slot(slot, label, where)
        encoded = self.config.encoding.encode(stats, client=self.id)
        layout = Layout.of(encoded)
        y = layout.flatten(encoded, np.uint64)
        n = y.size
        y += self_mask(self._self_seeds[e], label, n)
        for v in P:  # its neighbours among the participants (everyone on a complete graph)
            if v == self.id or v not in near:
                continue
            m = pair_mask(self._secret_with(v, e), label, n)
            if self.id < v:
                y += m
            else:
                y -= m
        self._masked[label] = tuple(P)
        return layout.unflatten(y)

    def reveal(self, round: int, exchange: str, survivors: Sequence[str],
               dropped: Sequence[str]) -> dict[str, np.ndarray]:
        """The shares the server needs to unmask one exchange's sum: of b_v for each survivor v
        (key ``"self:v"``) and of s_d for each dropped participant d (key ``"mask:d"``), of its
        neighbours on the masking graph (and itself).

        Refuses (SecureAggregationError) when the split does not match the participants this
        client masked with, when fewer than ``threshold`` survived, when the exchange was already
        revealed, or when a peer would get both kinds of secret revealed over the fit.
        """
        roster = self._need_roster()
        where = describe(round, exchange)
        label = exchange_label(round, exchange)
        if label not in self._masked:
            raise SecureAggregationError(f"client {self.id!r}: sent no masked reply in {where}; "
                                         "nothing to reveal")
        if label in self._revealed:
            raise SecureAggregationError(f"client {self.id!r}: already revealed shares for "
                                         f"{where}; it reveals once per exchange")
        S = self._local(roster, roster.check_members(survivors, what=f"{where}: survivors"))
        D = self._local(roster, roster.check_members(dropped, what=f"{where}: dropped"))
        if set(S) & set(D) or sorted(S + D) != list(self._masked[label]):
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
        e = self._slot_of[label]
        for d in D:
            # one secret per fit: a self-mask seed revealed in any exchange unmasks them all
            if self.config.slots is None and d in self._revealed_self:
                raise SecureAggregationError(
                    f"client {self.id!r}: refusing to reveal the mask key of {d!r} (declared "
                    f"dropped in {where}): its self-mask seed was revealed in "
                    f"{self._revealed_self[d]}, and both would expose its replies")
        for u in S:
            if u in self._revealed_mask:
                raise SecureAggregationError(
                    f"client {self.id!r}: refusing to reveal the self-mask seed of {u!r} in "
                    f"{where}: its mask key was revealed in {self._revealed_mask[u]}")
        out = {}
        for u in S:
            out[f"self:{u}"] = as_u8(self._share_bytes(u, e, 1))
            self._revealed_self.setdefault(u, where)
        for d in D:
            out[f"mask:{d}"] = as_u8(self._share_bytes(d, e, 0))
            self._revealed_mask.setdefault(d, where)
        self._revealed.add(label)
        if D:
            log.info("client %r revealed mask-key shares of dropped %s in %s", self.id, D, where)
        return out

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
            "mask_private": [_crypto.private_raw(k).hex() for k in self._mask_privates],
            "enc_private": _crypto.private_raw(self._enc_private).hex(),
            "self_seed": [b.hex() for b in self._self_seeds],
            "roster": roster, "shared": self._shared,
            "held": {u: [[hex(a), hex(b)] for a, b in v] for u, v in self._held_slots.items()},
            "masked": {k.hex(): list(v) for k, v in self._masked.items()},
            "slot_of": {k.hex(): v for k, v in self._slot_of.items()},
            "revealed": sorted(k.hex() for k in self._revealed),  # a set: one order
            "revealed_self": self._revealed_self, "revealed_mask": self._revealed_mask})

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
        c._mask_privates = [_crypto.load_private(bytes.fromhex(h)) for h in d["mask_private"]]
        c._enc_private = _crypto.load_private(bytes.fromhex(d["enc_private"]))
        c._self_seeds = [bytes.fromhex(h) for h in d["self_seed"]]
        c._mask_private, c._self_seed = c._mask_privates[0], c._self_seeds[0]
        c._roster = None
        if d["roster"] is not None:
            msg = _roster_message(d["roster"])
            c._roster = Roster.from_message(msg, cfg)
        c._shared = bool(d["shared"])
        as33 = shamir.share_to_bytes
        c._blobs = {u: b"".join(as33(int(a, 16)) + as33(int(b, 16)) for a, b in v)
                    for u, v in d["held"].items()}
        c._held, c._held_slots = _Held(c._blobs, first=True), _Held(c._blobs)
        c._pair_secret, c._enc_shared = {}, {}
        c._masked = {bytes.fromhex(k): tuple(v) for k, v in d["masked"].items()}
        c._slot_of = {bytes.fromhex(k): int(v) for k, v in d["slot_of"].items()}
        c._revealed = {bytes.fromhex(k) for k in d["revealed"]}
        c._revealed_self = dict(d["revealed_self"])
        c._revealed_mask = dict(d["revealed_mask"])
        return c

    # --- helpers ------------------------------------------------------------------------------
    def _share_bytes(self, owner: str, slot: int, kind: int) -> bytes:
        """The 33 bytes of this client's share of ``owner``'s secret (kind 0: mask key, 1:
        self-mask seed) of ``slot``, read from the opened bytes."""
        at = (2 * slot + kind) * shamir.SHARE_BYTES
        return self._blobs[owner][at:at + shamir.SHARE_BYTES]

    def _local(self, roster: Roster, members: list[str]) -> list[str]:
        """On a sparse graph, the members in this client's closed neighbourhood (all of them on
        the complete graph): the participants it masks with, the survivors it reveals for."""
        if not self.config.sparse(roster.n):
            return members
        near = set(roster.graph.closed(self.id))
        return [m for m in members if m in near]

    def _of_near(self, roster: Roster) -> str:
        return " in its neighbourhood" if self.config.sparse(roster.n) else ""

    def _kind(self, roster: Roster) -> str:
        return "neighbourhood " if self.config.sparse(roster.n) else ""

    def _need_roster(self) -> Roster:
        if self._roster is None:
            raise SecureAggregationError(f"client {self.id!r}: call receive_peer_keys first (the "
                                         "key set-up precedes every exchange)")
        return self._roster

    def _enc_secret(self, v: str) -> bytes:
        """X25519(c_u, c_v), the secret behind the share keys between u and v (set-up only)."""
        if v not in self._enc_shared:
            self._enc_shared[v] = _crypto.agree(self._enc_private, self._roster.keys[v]["enc_key"])
        return self._enc_shared[v]

    def _secret_with(self, v: str, slot: int) -> bytes:
        if (v, slot) not in self._pair_secret:
            self._pair_secret[v, slot] = _crypto.agree(
                self._mask_privates[slot], slot_item(self._roster.keys[v]["mask_key"], slot))
        return self._pair_secret[v, slot]

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
        used = [lab for lab, s in self._slot_of.items() if s == int(slot)]
        if used:
            raise SecureAggregationError(
                f"client {self.id!r}: slot {int(slot)} announced for {where} was already used "
                "by another exchange; every exchange uses its own secrets")
        self._slot_of[label] = int(slot)
        return int(slot)



def _roster_message(saved: dict) -> dict:
    """The roster message a dump holds (arrays as hex) back to arrays."""
    rows = len(json.loads(saved.get("members") or saved["ids"]))
    text = ("ids", "members", "graph_seed")
    return {k: v if k in text else np.frombuffer(bytes.fromhex(v), np.uint8).reshape(
        len(json.loads(saved["ids"])) if k == "enc_all" else rows, -1)
        for k, v in saved.items()}


class _Held(Mapping):
    """The shares a client holds, read on demand from the opened bytes of each owner:
    ``owner -> [(share of s, share of b) per slot]``, or with ``first`` slot 0's pair only."""

    def __init__(self, blobs: dict[str, bytes], first: bool = False):
        self._blobs, self._first = blobs, first

    def __getitem__(self, owner: str):
        blob, n = self._blobs[owner], shamir.SHARE_BYTES
        read = int.from_bytes
        pairs = [(read(blob[i:i + n], "big"), read(blob[i + n:i + 2 * n], "big"))
                 for i in range(0, len(blob), 2 * n)]
        return pairs[0] if self._first else pairs

    def __iter__(self):
        return iter(self._blobs)

    def __len__(self) -> int:
        return len(self._blobs)


def _field_elements(plain: bytes) -> bool:
    """Whether every 33-byte big-endian share in ``plain`` is below the prime 2^256 + 297."""
    if not any(plain[::shamir.SHARE_BYTES]):  # every leading byte 0: below 2^256
        return True
    a = np.frombuffer(plain, dtype=np.uint8).reshape(-1, shamir.SHARE_BYTES)
    low = a[:, 31].astype(np.int64) * 256 + a[:, 32]
    return bool(np.all((a[:, 0] == 0) | ((a[:, 0] == 1) & ~a[:, 1:31].any(axis=1) & (low < 297))))
