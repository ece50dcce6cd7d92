"""The client side of secure aggregation: keys, shares, masking, the consistency round and the
guarded reveal.

One :class:`SecAggClient` lives on a client for a whole fit. Its secrets (one X25519 private key,
a nonce, and a self-mask seed per planned exchange) come from the operating system; only a
commitment, public keys, AEAD ciphertexts of shares, masked vectors, its confirmations of
its surviving neighbours (:mod:`~.consistency`), and what the multi-round rule allows (shares
of a surviving neighbour's self-mask seed, a dropped neighbour's pair mask of that exchange)
ever leave it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto
import fedlatent.engine.secagg.consistency as consistency
import fedlatent.engine.secagg.shamir as shamir
from fedlatent.engine.secagg.enrol import Enrolment
from fedlatent.engine.secagg.near import Near
from fedlatent.engine.secagg.protocol import (
    Roster,
    SecAggConfig,
    SecureAggregationError,
    describe,
    exchange_label,
    pair_nonce,
    self_mask,
)

__all__ = ["SecAggClient"]

log = logging.getLogger(__name__)


class SecAggClient(Enrolment):
    """One client's secure-aggregation state for a fit.

    Parameters
    ----------
    client_id : str
        The client's id (its order among the ids fixes the signs of pairwise masks).
    config : SecAggConfig
        The public threshold, fixed-point encoding and graph settings.
    run : str
        The run this set-up belongs to, and ``round`` the round it happens in: both are bound
        into the client's commitment and its signatures (:meth:`public_keys` with a signer), so
        a signature made for one run or round never authenticates keys in another; the set-up
        (its closed list of commitments, which names both) is also bound into every pair's
        keys (:func:`~.protocol.pair_keys`).
    round : int
    graph_commit : bytes, optional
        SHA-256 of the server's graph seed, sent before this client drew its keys.

    Notes
    -----
    Order of calls, once per fit (:mod:`~fedlatent.engine.secagg.enrol`): :meth:`commitment`
    -> (the server closes the list) :meth:`open` -> (the server relays the roster)
    :meth:`receive_peer_keys` -> :meth:`share_messages` -> (the server relays)
    :meth:`receive_shares`; then per exchange :meth:`mask`, :meth:`consistency` (sign the
    split of its neighbourhood) and :meth:`reveal`.

    Authenticated peers: a client given its site's signing key signs its public keys; a
    client given a pinned roster (:class:`fedlatent.engine.site.keys.Roster`) accepts the
    relayed roster only when every peer's keys carry a valid signature of that peer's
    rostered key for this set-up, and then reveals a peer's share only holding that peer's
    confirmation (:mod:`~fedlatent.engine.secagg.consistency`: a token of the pair's secret,
    agreed from the authenticated keys). Without a roster nothing is verified: the server,
    which could then stand in for any peer, is trusted to relay keys and splits faithfully
    (honest-but-curious).

    References
    ----------
    Bonawitz et al., CCS 2017, section 4 (Figure 4) and its malicious-model consistency check;
    Bell et al., CCS 2020 (SecAgg+).
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
        self._nonce = _crypto.random_bytes()  # r_u: what its commitment hides with its key
        self._seeds = shamir.draw_seeds(config.n_slots)  # b_u per slot, (E, LIMBS)
        self._public: dict[str, bytes] | None = None  # its public key fields, once computed
        self._committed = False
        # the closed list's digest and size, as the server sent them before the keys opened
        self._closed: bytes | None = None
        self._closed_n = 0
        # whether its peers' keys were verified against a pinned roster: then it reveals only
        # after the consistency round, by the split it confirmed
        self._authenticated = False
        self._roster: Roster | None = None
        self._shared = False
        # owner -> the opened bytes of its shares: this client's share of b_owner, per slot
        self._blobs: dict[str, bytes] = {}
        # neighbour -> pair_keys(X25519(c_u, c_v)): share keys and s_uv, agreed once per fit
        self._pair: dict[str, bytes] = {}
        self._near_tab: Near | None = None  # its neighbourhood by position (rebuilt, not dumped)
        # (peer keys, secrets) agreed ahead by the in-process runtime's worker (not dumped)
        self._offered: tuple[bytes, bytes] | None = None
        self._masked: dict[bytes, tuple[str, ...]] = {}
        self._mask_words: dict[bytes, int] = {}  # exchange label -> the words it masked
        self._slot_of: dict[bytes, int] = {}  # exchange label -> the slot it used
        self._revealed: set[bytes] = set()
        # exchange label -> (tokens it gives, tokens it expects), by place in its closed
        # neighbourhood (zero where no participant): :func:`~.consistency.split_words`
        self._tokens: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        # exchange label -> (survivors, dropped): the split it signed, and reveals by
        self._split: dict[bytes, tuple[list[str], list[str]]] = {}
        # slot -> {peer: the exchange in which its self-seed share / pair mask was revealed}
        self._self_shown: dict[str, dict[str, str]] = {}
        self._pair_shown: dict[str, dict[str, str]] = {}
        #: verified rounds (:mod:`~.sumtree`): whether to keep its leaf of each exchange
        self.keep_leaf = False
        # (label, layout shapes, z): its last exchange's leaf z_u, its masked reply less its
        # self mask (less the pair masks it revealed, once it revealed)
        self._leaf: tuple[bytes, tuple, np.ndarray] | None = None
        # exchange label -> the digest of the transcript it verified before masking in it,
        # folded into its confirmations (:func:`~.consistency.fold`)
        self._digest: dict[bytes, bytes] = {}
        # (label, survivors, absent) of its leaf's exchange within its closed neighbourhood:
        # the absent ones' leaves must be zero in that exchange's tree (:mod:`~.sumtree`)
        self._leaf_split: tuple[bytes, tuple, tuple] | None = None
        # exchange label -> the neighbours that were in the sum of the exchange before, each
        # of which must confirm this one (it checked its own leaf) before this client reveals
        self._confirm: dict[bytes, tuple[str, ...]] = {}

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
        where, label = describe(round, exchange), exchange_label(round, exchange)
        P = self._mask_participants(roster, participants, label, where)
        return self._mask(stats, label, where, P, self._near().at(P), slot)

    def mask_announced(self, stats: Mapping[str, np.ndarray], round: int, exchange: str,
                       bits, slot: int | None = None) -> dict[str, np.ndarray]:
        """:meth:`mask` of the participants as a round message announces them, ``bits`` over
        this client's closed neighbourhood (:meth:`announced`): the same refusals and the same
        reply, the participants taken by position (distinct members of the neighbourhood,
        sorted, by construction) rather than checked name by name."""
        roster = self._need_roster()
        where, label = describe(round, exchange), exchange_label(round, exchange)
        pos = self._announced_at(bits)
        P = self._near().names(pos)
        self._mask_participants(roster, P, label, where, listed=True)
        return self._mask(stats, label, where, P, pos, slot)

    def _mask(self, stats, label: bytes, where: str, P: list[str], pos: np.ndarray,
              slot) -> dict[str, np.ndarray]:
        """:meth:`mask` of the checked participants ``P`` (sorted), at positions ``pos`` in
        this client's closed neighbourhood: every neighbour's keystream in one array, the
        tokens kept by position, the masks added in two reductions."""
        e = self._take_slot(slot, label, where)
        layout, y = self.config.encoding.encode_flat(stats, client=self.id)
        n = y.size
        me = int(np.searchsorted(pos, self._near().me))  # peers before u subtract, after add
        peers = np.concatenate((pos[:me], pos[me + 1:]))
        rows = self._pair_rows(peers, label, n + consistency.TOKEN_WORDS, e)
        self._keep_tokens(label, rows, peers, me, n)
        y += rows[me:, :n].sum(axis=0, dtype=np.uint64)  # wraps modulo 2^64, as the ring does
        y -= rows[:me, :n].sum(axis=0, dtype=np.uint64)
        if self.keep_leaf:  # its leaf before the self mask (the pair masks of dropped ones
            self._leaf = (label, layout.shapes, y)  # leave at the reveal; the reply: a new
            self._leaf_split = (label, tuple(P), self._near().absent(pos))  # array), its split
        y = np.add(y, self_mask(self._self_seeds[e], label, n), out=None if self.keep_leaf else y)
        self._masked[label] = tuple(P)
        self._mask_words[label] = n
        return layout.unflatten(y, copy=False)  # y is this reply's own

    def _keep_split(self, roster: Roster, label: bytes, S, D) -> None:
        """Keep, with its leaf of ``label``, the survivors ``S`` of its closed neighbourhood
        and the others (not participants, or the dropped ``D``)."""
        closed = roster.graph.closed(self.id)
        absent = () if len(S) == len(closed) else tuple(sorted(set(closed).difference(S)))
        self._leaf_split = (label, tuple(S), absent)

    def leaf_split(self, label: bytes) -> tuple[tuple, tuple] | None:
        """``(survivors, absent)`` of its closed neighbourhood in the exchange ``label`` of
        its kept leaf (None: none kept for it)."""
        got = self._leaf_split
        return None if got is None or got[0] != label else got[1:]

    @property
    def roster_ids(self) -> list[str]:
        """The set-up's roster, in its canonical (sorted) order: a transcript's leaves."""
        return self._need_roster().ids

    def announced(self, bits) -> list[str]:
        """The participants a round message announces as bits over this client's closed
        neighbourhood (sorted), little-endian within each byte (a uint8 array)."""
        return self._near().names(self._announced_at(bits))

    def _announced_at(self, bits) -> np.ndarray:
        """:meth:`announced` as positions in this client's closed neighbourhood."""
        size = len(self._near())
        a = np.asarray(bits)
        if a.dtype != np.uint8 or a.shape != ((size + 7) // 8,):
            raise SecureAggregationError(
                f"client {self.id!r}: the participants announced must be {(size + 7) // 8}"
                f" bytes of bits over its neighbourhood, got {a.dtype} {a.shape}")
        return np.flatnonzero(np.unpackbits(a, count=size, bitorder="little"))

    def _mask_participants(self, roster: Roster, participants, label: bytes,
                           where: str, listed: bool = False) -> list[str]:
        """The participants this client masks with (its neighbourhood among them on a sparse
        graph), after every refusal: a second reply, an unknown or excluded participant, too
        few of them (``listed``: ``participants`` are distinct members of its neighbourhood,
        sorted, as :meth:`announced` gives them)."""
        if label in self._masked:
            raise SecureAggregationError(f"client {self.id!r}: already masked a reply in {where}; "
                                         "a second, different reply would expose the difference")
        P = participants if listed else self._members(roster, participants,
                                                      f"{where}: participants")
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
        if self._holders(roster, P) < t:
            raise SecureAggregationError(f"{where}: {len(P)} participants{self._of_near(roster)}, "
                                         f"fewer than the {self._kind(roster)}threshold {t}; the "
                                         "sum could never be unmasked")
        return P

    def _holders(self, roster: Roster, members) -> int:
        """How many of ``members`` (this client among them) may reveal a share of its seed: on
        a sparse graph its neighbours only (a client never reveals its share of its own seed
        there: the server needs ``t`` of its neighbours), on the complete graph all of them."""
        return len(members) - 1 if self.config.sparse(roster.n) else len(members)

    def _keep_tokens(self, label: bytes, rows: np.ndarray, peers: np.ndarray, me: int,
                     n: int) -> None:
        """The exchange's tokens with each peer (:func:`~.consistency.split_words`; ``peers``
        their positions in this client's closed neighbourhood, ascending, the first ``me`` of
        them before this client), kept by that position (zero where no participant)."""
        size = len(self._near())
        lo, hi = peers[:me], peers[me:]  # split_words's choice of word, written by place directly
        give, want = np.zeros(size, np.uint64), np.zeros(size, np.uint64)
        give[lo], give[hi] = rows[:me, n + 1], rows[me:, n]
        want[lo], want[hi] = rows[:me, n], rows[me:, n + 1]
        self._tokens[label] = (give, want)

    def consistency(self, round: int, exchange: str, survivors: Sequence[str] | None,
                    dropped: Sequence[str]) -> dict[str, np.ndarray]:
        """Confirm this client's split of its participants in one exchange, before any reveal:
        ``{"confirm": uint8 array}``, one word per member of its closed neighbourhood (sorted):
        the token ``tau(self -> w)`` for each surviving ``w``, zero elsewhere
        (:mod:`~.consistency`). ``survivors`` None: every participant but ``dropped`` (what the
        server sends when none dropped).

        Refused (SecureAggregationError): a split that does not divide its participants, in
        which it did not survive or too few did, an exchange it did not mask in, and a second
        split of one exchange (it reveals once, by the split it confirmed: :meth:`reveal`).
        """
        roster = self._need_roster()
        where = describe(round, exchange)
        label = exchange_label(round, exchange)
        if label in self._split or label in self._revealed:
            raise SecureAggregationError(f"client {self.id!r}: already confirmed its split of "
                                         f"{where}; it confirms one per exchange")
        mine = self._masked.get(label, ())
        if survivors is None:  # every participant but the dropped
            gone = set(map(str, dropped))
            survivors = [u for u in mine if u not in gone]
        S, D = self._reveal_split(roster, label, survivors, dropped, where)
        self._confirmed_before(label, S, where)
        self._split[label] = (S, D)
        give = self._tokens[label][0].copy()
        if D:
            give[self._near().at(D)] = 0
        return {"confirm": give.astype("<u8", copy=False).view(np.uint8)}

    def _confirmed_before(self, label: bytes, S, where: str) -> None:
        """Verified rounds: refuse (SecureAggregationError naming them) when a neighbour that
        was in the sum of the exchange before is not a survivor of this one. Only a survivor
        confirms, and its tokens of this exchange carry the digest of the transcript it
        checked its own leaf against; a leaf nobody checks could hold any vector the server
        chose (a ghost in a silent site's leaf), so nothing is revealed without it. (The
        message does not name this client: the server names each refusing client, and the
        refusals of one dropout, alike, are said once.)"""
        need = self._confirm.get(label)
        if not need or need == tuple(S):  # (every one of them survived: the common case)
            return
        alive = set(S)
        missing = [w for w in need if w not in alive and w != self.id]
        if missing:
            names = ", ".join(map(repr, missing[:10])) + (
                f" and {len(missing) - 10} more" if len(missing) > 10 else "")
            raise SecureAggregationError(
                f"{where}: [{names}] took part in the sum of "
                "the exchange before but are not survivors of this one, so nothing shows they "
                "checked their own contributions to that sum (any vector could stand in their "
                "leaves); refusing to reveal anything: the fit stops here, keeping the "
                "parameters of the round before; fit again when those sites are back, or "
                "without them")

    def _near(self) -> Near:
        """Its closed neighbourhood by position (:class:`~.near.Near`: made once, from its
        roster; never dumped)."""
        got = getattr(self, "_near_tab", None)
        if got is None:
            got = self._near_tab = Near(self._need_roster().graph.closed(self.id), self.id)
        return got

    def reveal(self, round: int, exchange: str, survivors: Sequence[str] | None = None,
               dropped: Sequence[str] | None = None, confirmations=None) -> dict[str, np.ndarray]:
        """What the server needs to unmask one exchange's sum, by the split this client
        confirmed (:meth:`consistency`): ``"self"``, one row of 32 bytes per survivor ``v`` of
        its neighbourhood (itself left out on a sparse graph), its share of b_v,e; and when a
        neighbour dropped, ``"pair"``, one row per dropped participant d, the pair mask of (d,
        this client) of this exchange only (its uint64 words as bytes, little-endian).

        ``confirmations``: the tokens of the surviving neighbours whose shares it reveals (one
        word each, in their sorted order, as the server relays them); with a pinned roster each
        must be the token its pair's secret gives (:func:`~.consistency.check`).
        ``survivors`` and ``dropped``, when given, must be the split it confirmed; a client
        without a pinned roster that confirmed none takes them as its split (the server is
        trusted then: honest-but-curious).

        Refuses (SecureAggregationError) what :meth:`consistency` refuses, a reveal before the
        consistency round (with a roster), a missing or wrong confirmation, a second reveal of
        an exchange, and a peer that would get both its self-seed share and a pair mask of the
        same slot revealed (with one secret per fit: of any two exchanges).
        """
        roster = self._need_roster()
        where = describe(round, exchange)
        label = exchange_label(round, exchange)
        S, D = self._signed_split(roster, label, survivors, dropped, where)
        near, others = self._near(), [u for u in S if u != self.id]
        at = near.at(others)  # (the owners of the shares it reveals on a sparse graph)
        owners, at_owners = (others, at) if self.config.sparse(roster.n) else (S, near.at(S))
        if self._authenticated or confirmations is not None:
            consistency.check(self.id, others, confirmations, self._tokens[label][1][at], where,
                              digest=label in self._digest)
        e = self._slot_of[label]
        key = str(e)
        held, pairs = self._self_shown.get(key, {}), self._pair_shown.get(key, {})
        self._never_both(D, owners, held, pairs, where)
        out = {"self": near.held(self._blobs, at_owners, e, shamir.SEED_SHARE_BYTES)}
        if D:
            words = self._mask_words[label]
            masks = self._pair_masks(D, label, words, e)
            out["pair"] = np.ascontiguousarray(masks, "<u8").view(np.uint8).reshape(
                len(D), 8 * words)
            self._leaf_less(label, D, masks)
            if self._leaf_split is not None and self._leaf_split[0] == label:
                self._keep_split(roster, label, S, D)
        shown = dict.fromkeys(owners, where)  # the first exchange to reveal one is kept
        shown.update(held)
        self._self_shown[key] = shown
        if D:
            self._pair_shown[key] = {**dict.fromkeys(D, where), **pairs}
        self._revealed.add(label)
        self._split.pop(label, None)  # revealed once: its split and tokens are done with
        self._tokens.pop(label, None)
        self._digest.pop(label, None)
        self._confirm.pop(label, None)
        if D:
            log.info("client %r revealed its pair masks with dropped %s in %s", self.id, D, where)
        return out

    def _leaf_less(self, label: bytes, D, masks: np.ndarray) -> None:
        """Its leaf of ``label`` less the pair masks it reveals with the dropped ``D`` (it
        added ``+m`` with a peer it sorts before)."""
        if self._leaf is None or self._leaf[0] != label:
            return
        z = self._leaf[2]
        for d, m in zip(D, masks):
            z -= m if self.id < d else -m  # (uint64: - m wraps as the ring does)

    def take_leaf(self, label: bytes | None = None):
        """``(label, layout shapes, z)`` of the last exchange it masked in (None: none
        kept), then forgotten; with ``label`` only that exchange's."""
        leaf = self._leaf
        if leaf is None or (label is not None and leaf[0] != label):
            return None
        self._leaf = None
        return leaf

    def held_leaf(self, label: bytes):
        """Its kept leaf of the exchange ``label`` (as :meth:`take_leaf`), left kept; or None."""
        return self._leaf if self._leaf is not None and self._leaf[0] == label else None

    def revealed_in(self, label: bytes) -> bool:  # (whether it revealed in exchange ``label``)
        return label in self._revealed

    def bind_digest(self, round: int, exchange: str, digest: bytes,
                    confirm: Sequence[str] = ()) -> None:
        """Bind ``digest`` (the transcript it verified before masking in exchange ``(round,
        exchange)``; None: none) into that exchange's pair keystreams (:meth:`_pair_masks`):
        its pair masks and consistency tokens with a neighbour shown another transcript then
        differ, so that neighbour refuses to reveal (no equivocation) at no cost. Before
        :meth:`mask`. ``confirm``: the neighbours in the sum the transcript is of, each of
        which must survive this exchange before this client reveals in it (this one or not)."""
        label = exchange_label(round, exchange)
        if digest is not None:
            self._digest[label] = bytes(digest)
        self._confirm[label] = tuple(confirm)

    def _never_both(self, D, owners, held, pairs, where: str) -> None:
        """Refuse a pair mask of a peer whose self-mask seed share was revealed for the slot
        (``held``), or a share of one whose pair mask was (``pairs``)."""
        for d in D:
            if d in held:
                raise SecureAggregationError(
                    f"client {self.id!r}: refusing to reveal the pair mask of {d!r} (declared "
                    f"dropped in {where}): its self-mask seed was revealed in "
                    f"{held[d]}, and both would expose its replies")
        for u in (owners if pairs else ()):  # none revealed yet: nothing to refuse
            if u in pairs:
                raise SecureAggregationError(
                    f"client {self.id!r}: refusing to reveal the self-mask seed of {u!r} in "
                    f"{where}: its pair mask was revealed in {pairs[u]}")

    def _signed_split(self, roster: Roster, label: bytes, survivors, dropped,
                      where: str) -> tuple[list[str], list[str]]:
        """The split this client reveals by: the one it confirmed (``survivors`` and
        ``dropped``, if given, must be it), or without a pinned roster the one given
        (recorded)."""
        if label in self._revealed:
            raise SecureAggregationError(f"client {self.id!r}: already revealed shares for "
                                         f"{where}; it reveals once per exchange")
        split = self._split.get(label)
        if split is None:
            if self._authenticated:
                raise SecureAggregationError(
                    f"client {self.id!r}: asked to reveal in {where} before the consistency "
                    "round: it reveals only by a split it confirmed, after its peers confirmed "
                    "theirs")
            if survivors is None or dropped is None:
                raise SecureAggregationError(f"client {self.id!r}: {where}: a reveal needs the "
                                             "survivors and the dropped participants")
            split = self._reveal_split(roster, label, survivors, dropped, where)
            self._confirmed_before(label, split[0], where)
            self._split[label] = split
        elif survivors is not None and (sorted(map(str, survivors)) != split[0]
                                        or sorted(map(str, dropped or ())) != split[1]):
            raise SecureAggregationError(
                f"client {self.id!r}: the split of {where} it is asked to reveal by differs from "
                "the one it confirmed; it reveals only by the split it confirmed")
        return split

    def _reveal_split(self, roster: Roster, label: bytes, survivors, dropped,
                      where: str) -> tuple[list[str], list[str]]:
        """Its survivors and dropped neighbours of an exchange it masked in and has not revealed,
        checked: they split its participants, it is a survivor, enough of them survived."""
        if label not in self._masked:
            raise SecureAggregationError(f"client {self.id!r}: sent no masked reply in {where}; "
                                         "nothing to reveal")
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
        if self._holders(roster, S) < t:
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
            "participation": float(self.config.participation),
            "graph_commit": None if self.graph_commit is None else self.graph_commit.hex(),
            "private": _crypto.private_raw(self._private).hex(), "nonce": self._nonce.hex(),
            "committed": self._committed, "closed_n": self._closed_n,
            "closed": None if self._closed is None else self._closed.hex(),
            "authenticated": self._authenticated,
            "tokens": {k.hex(): [np.ascontiguousarray(a, "<u8").tobytes().hex() for a in v]
                       for k, v in self._tokens.items()},
            "split": {k.hex(): list(v) for k, v in self._split.items()},
            "self_seed": np.ascontiguousarray(self._seeds, dtype="<u4").tobytes().hex(),
            "roster": roster, "shared": self._shared,
            "held": {u: b.hex() for u, b in self._blobs.items()},
            "pair": {v: b.hex() for v, b in self._pair.items()},
            "masked": {k.hex(): list(v) for k, v in self._masked.items()},
            "mask_words": {k.hex(): v for k, v in self._mask_words.items()},
            "slot_of": {k.hex(): v for k, v in self._slot_of.items()},
            "revealed": sorted(k.hex() for k in self._revealed),  # a set: one order
            "revealed_self": _sorted_view(self._self_shown),
            "revealed_pair": _sorted_view(self._pair_shown),
            "keep_leaf": self.keep_leaf,
            "leaf": None if self._leaf is None else [
                self._leaf[0].hex(), [[k, list(v)] for k, v in self._leaf[1]],
                np.ascontiguousarray(self._leaf[2], "<u8").tobytes().hex()],
            "digest": {k.hex(): v.hex() for k, v in self._digest.items()},
            "leaf_split": None if self._leaf_split is None else [
                self._leaf_split[0].hex(), list(self._leaf_split[1]), list(self._leaf_split[2])],
            "confirm": {k.hex(): list(v) for k, v in self._confirm.items()}})

    @classmethod
    def load(cls, text: str) -> SecAggClient:
        """The client :meth:`dump` wrote."""
        from fedlatent.engine.secagg.encoding import FixedPoint

        d = json.loads(text)
        cfg = SecAggConfig(int(d["threshold"]), FixedPoint(scale=float(d["scale"]),
                                                           bound=d["bound"]), slots=d["slots"],
                           degree=d.get("degree"), local_threshold=d.get("local_threshold"),
                           participation=float(d.get("participation", 1.0)))
        c = cls.__new__(cls)
        c.id, c.config = str(d["id"]), cfg
        c.graph_commit = None if d.get("graph_commit") is None else bytes.fromhex(d["graph_commit"])
        c.run, c.setup_round = str(d.get("run", "")), int(d.get("setup_round", 0))
        c._private = _crypto.load_private(bytes.fromhex(d["private"]))
        c._nonce, c._committed = bytes.fromhex(d["nonce"]), bool(d["committed"])
        c._closed = None if d["closed"] is None else bytes.fromhex(d["closed"])
        c._closed_n = int(d["closed_n"])
        c._authenticated = bool(d["authenticated"])
        c._tokens = {bytes.fromhex(k): tuple(np.frombuffer(bytes.fromhex(h), "<u8").astype(
            np.uint64) for h in v) for k, v in d["tokens"].items()}
        c._split = {bytes.fromhex(k): (list(v[0]), list(v[1])) for k, v in d["split"].items()}
        c._seeds = np.frombuffer(bytes.fromhex(d["self_seed"]), dtype="<u4").astype(
            np.int64).reshape(cfg.n_slots, shamir.LIMBS)
        c._roster, c._public = None, None
        if d["roster"] is not None:
            msg = _roster_message(d["roster"])
            c._roster = Roster.from_message(msg, cfg)
        c._shared = bool(d["shared"])
        c._blobs = {u: bytes.fromhex(h) for u, h in d["held"].items()}
        c._pair = {v: bytes.fromhex(h) for v, h in d["pair"].items()}
        c._near_tab = None
        c._masked = {bytes.fromhex(k): tuple(v) for k, v in d["masked"].items()}
        c._mask_words = {bytes.fromhex(k): int(v) for k, v in d["mask_words"].items()}
        c._slot_of = {bytes.fromhex(k): int(v) for k, v in d["slot_of"].items()}
        c._revealed = {bytes.fromhex(k) for k in d["revealed"]}
        c._self_shown, c._pair_shown = _by_slot(d["revealed_self"]), _by_slot(d["revealed_pair"])
        c.keep_leaf = bool(d.get("keep_leaf", False))
        leaf = d.get("leaf")
        c._leaf = None if leaf is None else (
            bytes.fromhex(leaf[0]), tuple((str(k), tuple(int(n) for n in v)) for k, v in leaf[1]),
            np.frombuffer(bytes.fromhex(leaf[2]), "<u8").astype(np.uint64))
        c._digest = {bytes.fromhex(k): bytes.fromhex(v) for k, v in d.get("digest", {}).items()}
        split = d.get("leaf_split")
        c._leaf_split = None if split is None else (bytes.fromhex(split[0]), tuple(split[1]),
                                                    tuple(split[2]))
        c._confirm = {bytes.fromhex(k): tuple(v) for k, v in d.get("confirm", {}).items()}
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

    def _pair_masks(self, peers: Sequence[str], label: bytes, n: int, slot: int) -> np.ndarray:
        """The keystream of this client and each of ``peers`` in one exchange, an (m, n)
        uint64 array (:meth:`_pair_rows` of their positions)."""
        return self._pair_rows(self._near().at(peers), label, n, slot)

    def _pair_rows(self, pos: np.ndarray, label: bytes, n: int, slot: int) -> np.ndarray:
        """The keystream of this client and each neighbour at positions ``pos`` in one
        exchange, an (m, n) uint64 array: that of s_uv under the exchange's nonce
        (:func:`~.protocol.pair_nonce` of its label and slot), each pair's AES-GCM object made
        once per fit (:meth:`~.near.Near.streams`); its first words are the pair mask, the two
        after it the pair's tokens (:mod:`~.consistency`)."""
        streams = self._near().streams(pos, self._mask_secrets)
        digest = self._digest.get(label)  # verified rounds: the transcript bound in
        bound = label if digest is None else label + b"\x00transcript\x00" + digest
        return _crypto.ctr_rows(streams, n, pair_nonce(bound, slot))

    def _mask_secrets(self, peers: list[str]) -> list[bytes]:
        """The mask secret s_uv of this client's pair with each of ``peers`` (bytes 32..64
        of the pair's keys, :func:`~.protocol.pair_keys`)."""
        return [block[32:] for block in self._pair_blocks(peers)]

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


def _roster_message(saved: dict) -> dict:
    """The roster message a dump holds (arrays as hex) back to arrays."""
    rows = len(json.loads(saved.get("members") or saved["ids"]))
    text = ("ids", "members", "graph_seed")
    return {k: v if k in text else np.frombuffer(bytes.fromhex(v), np.uint8).reshape(
        len(json.loads(saved["ids"])) if k == "openings" else rows, -1)
        for k, v in saved.items()}
