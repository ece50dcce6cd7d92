"""The server side of secure aggregation: relay, sum of masked replies, unmasking.

The server sees commitments, public keys, AEAD ciphertexts it cannot open, masked vectors, the
survivors' confirmations (tokens it cannot forge), and per exchange what the survivors reveal:
shares of each survivor's self-mask seed b_u,e, and, for each dropped participant d, each surviving
neighbour's pair mask with d of that exchange only. From those it learns the sum of the
survivors' inputs and nothing about one client's input beyond it (Bonawitz et al., CCS 2017;
the package docstring gives the argument, against a server that deviates too).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Mapping, Sequence

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto
import fedlatent.engine.secagg.shamir as shamir
from fedlatent.engine.secagg.encoding import Layout
from fedlatent.engine.secagg.protocol import (
    Roster,
    SecAggConfig,
    SecureAggregationError,
    describe,
    exchange_label,
    self_nonce,
)

__all__ = ["SecAggServer", "route_shares"]

log = logging.getLogger(__name__)


def route_shares(outgoing: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, dict]:
    """Relay sealed shares: ``{sender: {recipient: bytes}}`` -> ``{recipient: {sender: bytes}}``."""
    inbox: dict[str, dict] = {}
    for u, msgs in outgoing.items():
        for v, ct in msgs.items():
            inbox.setdefault(str(v), {})[str(u)] = ct
    return inbox


class SecAggServer:
    """The server's secure-aggregation state for a fit.

    Parameters
    ----------
    config : SecAggConfig
        The public threshold and fixed-point encoding.
    run : str
        The run, and ``round`` the round of the set-up (what the clients' commitments bind).
    round : int

    Notes
    -----
    Per fit: :meth:`collect_commitments` (what it returns goes to every client), then
    :meth:`collect_keys` of the opened keys and :meth:`roster_for` each client, then
    :func:`route_shares`. Per exchange: :meth:`announce` the participants, :meth:`aggregate`
    the masked replies (returns who survived and who dropped, to send to the survivors),
    :meth:`collect_confirmations` of their :meth:`SecAggClient.consistency` replies, then
    :meth:`unmask` with the survivors' :meth:`SecAggClient.reveal` replies (each sent
    :meth:`confirmations_for` it).
    """

    def __init__(self, config: SecAggConfig, *, run: str = "", round: int = 0):
        _crypto.require()
        self.config = config
        self.run, self.round = str(run), int(round)
        self.roster: Roster | None = None
        self.excluded: dict[str, str] = {}  # dropped clients whose masks were recovered
        self._pending: dict | None = None
        self._done: set[bytes] = set()
        self._next_slot = 0
        #: keep each survivor's leaf ``z_w`` (verified rounds: :mod:`~.sumtree`); the last
        #: unmasked exchange's ``(label, survivors, leaves)`` in :attr:`leaves`
        self.keep_leaves = False
        self.leaves: tuple[bytes, list[str], np.ndarray] | None = None
        self._closed: tuple | None = None  # (ids, their commitments, the closed digest)
        self._per_fit: dict = {}  # per-fit tables of the graph (places, x-coordinates), by key
        # the seed of the masking graph, committed to before any client draws its keys
        self._graph_seed = _crypto.random_bytes() if config.degree is not None else None

    @property
    def graph_commit(self) -> bytes | None:
        """SHA-256 of the graph seed: what every client gets before it draws its keys (None
        without a degree: the complete graph)."""
        return None if self._graph_seed is None else _crypto.commit(self._graph_seed)

    def collect_commitments(self, commits: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
        """Close the list of clients with their commitments ``{client: commitment()}``; returns
        ``{"closed": its digest (32 bytes), "n": the clients}``, what every client is sent
        before it opens its keys (:mod:`~fedlatent.engine.secagg.commitments`)."""
        from fedlatent.engine.secagg.commitments import closed_digest
        from fedlatent.engine.secagg.protocol import Enrolled, as_bytes

        if self._closed is not None:
            raise SecureAggregationError("the commitments close once per fit; start a new "
                                         "server and new clients to set up again")
        known = Enrolled(commits)
        rows = np.frombuffer(b"".join(
            [as_bytes(commits[u].get("commit"), what=f"client {u!r}: its commitment", size=32)
             for u in known.ids]), dtype=np.uint8).reshape(-1, 32)
        self._closed = (known, rows, closed_digest(known.text, rows))
        return {"closed": self._closed[2], "n": len(known.ids)}

    def collect_keys(self, keys: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
        """Check every committed client's opened public keys ``{client: open()}`` against its
        commitment and return the roster to broadcast, a flat message
        (:meth:`Roster.to_message`); on a sparse graph each client is sent :meth:`roster_for`
        it instead. A client that committed and did not open, one that did not commit, or keys
        that are not the committed ones stop the set-up, named: leaving one out or letting one
        in after the close would change the graph every client checks."""
        from fedlatent.engine.secagg.commitments import commitment

        if self.roster is not None:
            raise SecureAggregationError("keys are set up once per fit; start a new server and "
                                         "new clients to set up again")
        if self._closed is None:
            raise SecureAggregationError("keys before the commitments: call "
                                         "collect_commitments first (the keys open them)")
        known, rows, _ = self._closed
        late, silent = sorted(set(keys) - known.set), sorted(known.set - set(keys))
        if late or silent:
            raise SecureAggregationError(
                f"the keys of {late} came after the commitments closed and {silent} committed "
                "but did not open their keys; every committed client opens, no other: set-up "
                "abandoned (a new set-up draws new keys)")
        roster = Roster(keys, self.config, everyone=known, graph_seed=self._graph_seed)
        for i, u in enumerate(known.ids):  # (the server's own check; each client checks too)
            if commitment(self.run, self.round, u, roster.openings[i].tobytes()) != \
                    rows[i].tobytes():
                raise SecureAggregationError(
                    f"client {u!r}: its opened keys and nonce are not those it committed to; "
                    "set-up abandoned")
        self.roster = roster
        self.config.encoding.check_capacity(self.roster.n)
        return self.roster.to_message()

    def roster_for(self, client: str) -> dict:
        """The roster message for ``client`` (:meth:`Roster.message_for`)."""
        return self._need_roster().message_for(str(client))

    def unmaskable(self, participants: Sequence[str]) -> list[str]:
        """The participants, less those (repeatedly) with fewer than the neighbourhood
        threshold of their neighbours among them: their secrets could not be rebuilt (on the
        complete graph, all of them)."""
        roster = self._need_roster()
        P = sorted(set(map(str, participants)))
        if not self.config.sparse(roster.n):
            return P
        t = self.config.share_threshold(roster.n)
        near = self.near_table()
        at = np.array(roster.x_of(P), dtype=np.int64) - 1
        have = np.zeros(roster.n, dtype=bool)
        have[at] = True
        while True:  # (each client's closed neighbourhood counts itself)
            thin = have[near[at]].sum(axis=1) <= t
            if not thin.any():
                return [roster.ids[i] for i in at.tolist()]
            have[at[thin]] = False
            at = at[~thin]

    def _self_commits(self) -> np.ndarray:
        """Every enrolled client's commitments to its self-mask seeds, an (n, 32 slots) uint8
        array by place among the sorted ids (once per fit)."""
        got = self._per_fit.get("self_commit")
        if got is None:
            roster = self._need_roster()
            got = self._per_fit["self_commit"] = roster.key_rows(("self_commit",), roster.ids)
        return got

    def near_table(self) -> np.ndarray:
        """Every enrolled client's closed neighbourhood on the sparse masking graph, as
        positions among the sorted ids: an (n, degree + 1) int64 array, row i the i-th id's
        (:meth:`~.graph.MaskingGraph.closed_index`; once per fit)."""
        got = self._per_fit.get("near")
        if got is None:
            graph = self._need_roster().graph
            got = self._per_fit["near"] = np.stack([graph.closed_index(u) for u in graph.ids])
        return got

    def announce(self, round: int, exchange: str, participants: Sequence[str]) -> list[str]:
        """Open an exchange; returns the sorted participants to send to each of them."""
        roster = self._need_roster()
        where = describe(round, exchange)
        label = exchange_label(round, exchange)
        if label in self._done:
            raise SecureAggregationError(f"{where} was already aggregated; every exchange needs "
                                         "its own (round, exchange) label")
        P = roster.check_members(participants, what=f"{where}: participants")
        gone = sorted(set(P) & set(self.excluded))
        if gone:
            raise SecureAggregationError(
                f"{where}: {gone} were declared dropped in {self.excluded[gone[0]]} and their "
                "masks recovered; they must rejoin with new keys (a new set-up)")
        t = self.config.threshold
        if len(P) < t:
            raise SecureAggregationError(f"{where}: {len(P)} participants, fewer than the "
                                         f"threshold {t}; add participants or lower the "
                                         "threshold at set-up")
        slot = 0
        if self.config.slots is not None:
            if self._next_slot >= self.config.n_slots:
                raise SecureAggregationError(
                    f"{where}: the {self.config.n_slots} exchanges planned at set-up are used "
                    "up; set up again with more slots (a longer fit needs more)")
            slot = self._next_slot
            self._next_slot += 1
        self._pending = {"round": int(round), "exchange": str(exchange), "label": label,
                         "participants": P, "slot": slot}
        return list(P)

    @property
    def slot(self) -> int:
        """The slot of the open exchange (what the announcement tells the participants)."""
        return int(self._need_pending()["slot"])

    def aggregate(self, masked: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, list[str]]:
        """Sum the masked replies ``{client: {field: uint64 array}}`` of the open exchange.

        Returns ``{"survivors": [...], "dropped": [...]}``, what to send with the reveal request.
        Raises SecureAggregationError naming the client and field of a malformed reply, or the
        exchange, the count and the threshold when fewer than ``threshold`` replied.
        """
        pend = self._need_pending()
        where = describe(pend["round"], pend["exchange"])
        P = pend["participants"]
        stray = sorted(set(map(str, masked)) - set(P))
        if stray:
            raise SecureAggregationError(f"{where}: replies from {stray}, which are not among "
                                         f"the announced participants {P}")
        S = sorted(map(str, masked))
        t = self.config.threshold
        if len(S) < t:
            raise SecureAggregationError(
                f"{where}: {len(S)} of {len(P)} participants replied, fewer than the threshold "
                f"{t}; the sum cannot be unmasked, so this exchange is abandoned")
        layout = Layout.of(masked[S[0]])
        fields = _fields_of(masked, S, layout)  # (None: a reply differs; named below)
        if fields is not None:  # every reply checked: each field summed over them at once
            total = np.concatenate([f.sum(axis=0, dtype=np.uint64).reshape(-1) for f in fields])
            rows = np.concatenate([f.reshape(len(S), -1) for f in fields], axis=1) \
                if self.keep_leaves else None
            pend.update(survivors=S, dropped=sorted(set(P) - set(S)), layout=layout,
                        total=total, rows=rows)
            return {"survivors": list(S), "dropped": list(pend["dropped"])}
        total = np.zeros(layout.size, dtype=np.uint64)
        rows = np.empty((len(S), layout.size), dtype=np.uint64) if self.keep_leaves else None
        for i, u in enumerate(S):
            reply = masked[u]
            if Layout.of(reply) != layout:
                raise SecureAggregationError(
                    f"{where}: client {u!r} sent fields {dict(Layout.of(reply).shapes)}, but "
                    f"client {S[0]!r} sent {dict(layout.shapes)}; every participant sends the "
                    "same fields and shapes")
            for name in layout.names:
                if np.asarray(reply[name]).dtype != np.uint64:
                    raise SecureAggregationError(
                        f"{where}: client {u!r}, field {name!r}: dtype "
                        f"{np.asarray(reply[name]).dtype}, expected uint64 (a masked ring element)")
            y = layout.flatten(reply, np.uint64)
            total += y
            if rows is not None:
                rows[i] = y
        pend.update(survivors=S, dropped=sorted(set(P) - set(S)), layout=layout, total=total,
                    rows=rows)
        return {"survivors": list(S), "dropped": list(pend["dropped"])}

    def collect_confirmations(self, replies: Mapping[str, Mapping[str, np.ndarray]]) -> None:
        """Keep the survivors' confirmations ``{survivor: consistency()}`` of the open exchange
        (one word per member of its closed neighbourhood; each holder is sent those of the
        owners whose shares it reveals: :meth:`confirmations_for`); a survivor without them is
        named (its neighbours will not reveal its shares, so the sum would stay masked)."""
        pend = self._need_pending()
        where = describe(pend["round"], pend["exchange"])
        if "total" not in pend:
            raise SecureAggregationError("call aggregate before collect_confirmations")
        S, graph = pend["survivors"], self.roster.graph
        width = 8 * len(graph.closed(S[0]))
        missing = [u for u in S if u not in replies]
        if missing:
            raise SecureAggregationError(
                f"{where}: survivors {missing} confirmed no split of their neighbourhood; their "
                "neighbours reveal nothing of them, so the sum stays masked")
        rows = [np.asarray(replies[u].get("confirm")) for u in S]
        bad = [u for u, r in zip(S, rows) if r.dtype != np.uint8 or r.shape != (width,)]
        if bad:
            raise SecureAggregationError(f"{where}: the confirmations of {bad[0]!r} are not "
                                         f"{width} bytes (uint8)")
        pend["confirm"] = np.stack(rows).view("<u8")  # (survivors, closed size) words
        pend["row"] = np.full(self.roster.n, -1, dtype=np.int64)
        pend["row"][[self.roster.index[u] - 1 for u in S]] = np.arange(len(S))

    def confirmations_all(self) -> dict[str, np.ndarray]:
        """:meth:`confirmations_for` of every survivor of the open exchange, in one gather."""
        pend = self._need_pending()
        S = pend["survivors"]
        near, place, off = self._place_table()
        at = np.array([self.roster.index[u] - 1 for u in S], dtype=np.int64)
        lengths = off[at + 1] - off[at]
        idx = np.repeat(off[at] - np.cumsum(lengths) + lengths, lengths) + np.arange(
            int(lengths.sum()))
        rows = pend["row"][near[idx]]
        keep = rows >= 0
        words = pend["confirm"][rows[keep], place[idx][keep]]
        ends = np.cumsum(np.add.reduceat(keep, np.r_[0, np.cumsum(lengths)[:-1]])
                         if len(S) else np.zeros(0, np.int64))
        return {u: words[e - n:e] for u, e, n in zip(
            S, ends.tolist(), np.diff(np.r_[0, ends]).tolist())}

    def _place_table(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every enrolled client's :meth:`_places`, flat: ``(near, place, offsets)`` (once per
        fit)."""
        got = self._per_fit.get("")
        if got is None:
            parts = [self._places(u) for u in self.roster.ids]
            off = np.r_[0, np.cumsum([len(a) for a, _ in parts])].astype(np.int64)
            got = self._per_fit[""] = (np.concatenate([a for a, _ in parts]),
                                           np.concatenate([b for _, b in parts]), off)
        return got

    def confirmations_for(self, holder: str) -> np.ndarray:
        """The words ``holder`` needs before it reveals: each surviving neighbour's (itself
        aside, in their sorted order) confirmation of ``holder`` (a uint64 array)."""
        pend = self._need_pending()
        near, place = self._places(str(holder))
        rows = pend["row"][near]
        keep = rows >= 0
        return pend["confirm"][rows[keep], place[keep]]

    def _places(self, holder: str) -> tuple[np.ndarray, np.ndarray]:
        """``(near, place)``: the holder's neighbours (positions among the sorted ids, itself
        aside) and its place in each one's closed neighbourhood (once per holder and fit)."""
        got = self._per_fit.get(holder)
        if got is None:
            graph = self.roster.graph
            near = graph.closed_index(holder)
            me = self.roster.index[holder] - 1
            near = near[near != me]
            place = np.array([bisect.bisect_left(graph.closed(graph.ids[i]), holder)
                              for i in near], dtype=np.int64)
            got = self._per_fit[holder] = (near, place)
        return got

    def unmask(self, revealed: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Remove every mask from the sum with the survivors' revealed shares and decode it.

        Parameters
        ----------
        revealed : mapping of holder id to its :meth:`SecAggClient.reveal` reply
            At least ``threshold`` survivors' replies.

        Returns
        -------
        dict of str to float64 ndarray
            The sum of the survivors' inputs, to within n_survivors / (2 scale) per entry.
        """
        pend = self._need_pending()
        if "total" not in pend:
            raise SecureAggregationError("call aggregate before unmask")
        roster = self.roster
        where = describe(pend["round"], pend["exchange"])
        S, D, label = pend["survivors"], pend["dropped"], pend["label"]
        holders = roster.check_members(revealed, what=f"{where}: revealing clients")
        strangers = sorted(set(holders) - set(S))
        if strangers:
            raise SecureAggregationError(f"{where}: reveals from {strangers}, which are not "
                                         "survivors of this exchange")
        t = self.config.threshold
        if len(holders) < t:
            raise SecureAggregationError(f"{where}: {len(holders)} survivors revealed shares, "
                                         f"fewer than the threshold {t}; the sum stays masked")
        total = pend["total"].copy()
        e, n = pend["slot"], total.size
        got, pairs = self._reveals(revealed, holders, S, D, n, where)
        ts = self.config.share_threshold(roster.n)
        selfs = self._self_masks(got, S, ts, e, label, n, where)
        total -= selfs.sum(axis=0, dtype=np.uint64)
        for d in D:
            total += self._pair_masks_of(d, pairs, S, where)
            self.excluded[d] = where
        if pend["rows"] is not None:  # each survivor's leaf: its reply less what was removed
            self.leaves = (label, list(S), _leaves(pend["rows"], selfs, S, pairs))
        if D:
            log.info("%s: recovered the masks of dropped %s", where, D)
        self._done.add(label)
        self._pending = None
        return self.config.encoding.decode(pend["layout"].unflatten(total))

    def _self_masks(self, got, S, t, e, label, n, where) -> np.ndarray:
        """The survivors' self masks, (len(S), n) uint64: every seed rebuilt at once from the first
        ``t`` (by x-coordinate) of its neighbourhood's revealed shares
        (:func:`~.shamir.reconstruct_seeds`) and checked against its commitment.

        ``got`` is ``(owners, holders, rows)``: for every revealed share, its owner's and its
        holder's x-coordinates and its 32 bytes (a (shares, 32) uint8 array)."""
        roster = self.roster
        owners, holders, rows = got
        xs_S = np.array([roster.index[u] for u in S], dtype=np.int64)
        order = np.lexsort((holders, owners))  # by owner, then by holder
        owners_sorted = owners[order]
        start = np.searchsorted(owners_sorted, xs_S)
        count = np.searchsorted(owners_sorted, xs_S, side="right") - start
        short = np.flatnonzero(count < t)
        if short.size:
            u = S[short[0]]
            raise SecureAggregationError(
                f"{where}: {count[short[0]]} neighbours of {u!r} revealed shares of its "
                f"self-mask seed, fewer than the neighbourhood threshold {t}; the sum stays "
                "masked")
        take = order[start[:, None] + np.arange(t)]  # (survivors, t): the first t holders
        shares = np.ascontiguousarray(rows[take]).view("<u4").reshape(len(S), t, shamir.LIMBS)
        if np.any(shares >= shamir.P31):
            raise SecureAggregationError(f"{where}: a revealed share is not a field element "
                                         "(>= 2^31 - 1); a revealing client sent a wrong share")
        seeds = shamir.seed_bytes(shamir.reconstruct_seeds(holders[take], shares))
        got = np.frombuffer(b"".join(_crypto.commit_many(seeds)), np.uint8).reshape(-1, 32)
        bad = np.flatnonzero((got != self._self_commits()[xs_S - 1, 32 * e:32 * e + 32]).any(1))
        if bad.size:  # (each checked against its commitment at once)
            u = S[int(bad[0])]
            raise SecureAggregationError(f"{where}: the self-mask seed of {u!r} rebuilt from "
                                         "the revealed shares does not match its commitment; "
                                         "a revealing client sent a wrong share")
        return _crypto.prg_rows(seeds, n, nonce=self_nonce(label))

    def _pair_masks_of(self, d, pairs, S, where) -> np.ndarray:
        """What the survivors' pair masks with dropped ``d`` added to the sum, negated: each
        surviving neighbour revealed its pair mask with ``d`` of this exchange (all of them are
        needed: the server holds no key of ``d``); ``pairs`` maps (holder, dropped) to it."""
        alive = set(S)
        peers = [u for u in self.roster.graph.neighbours(d) if u in alive]
        silent = [u for u in peers if (u, d) not in pairs]
        if silent:
            raise SecureAggregationError(
                f"{where}: survivors {silent} masked with dropped {d!r} but revealed no pair "
                "mask of it; every surviving neighbour of a dropped client must answer the "
                "reveal, so the sum stays masked")
        rows = np.stack([pairs[u, d] for u in peers])
        lo = np.array([u < d for u in peers], dtype=bool)  # u added +m if u < d, else -m
        return rows[~lo].sum(axis=0, dtype=np.uint64) - rows[lo].sum(axis=0, dtype=np.uint64)

    def _reveals(self, revealed, holders: list[str], S: list[str], D: list[str], words: int,
                 where: str):
        """``((owners, holders, rows), pairs)`` from the holders' reveals: every self-seed
        share with its owner's and holder's x-coordinates (int64 arrays) and its bytes (a
        (shares, 32) uint8 array), and ``{(holder, dropped): pair mask}`` (``words`` uint64).
        Holder ``h`` must send exactly a ``"self"`` row per survivor, a (rows, 32) uint8 array,
        and a ``"pair"`` row per dropped participant of its closed neighbourhood (sorted), a
        (rows, 8 words) uint8 array."""
        roster, size = self.roster, shamir.SEED_SHARE_BYTES
        graph, index = roster.graph, roster.index
        alive = np.zeros(roster.n + 1, dtype=bool)  # by x-coordinate
        alive[[index[u] for u in S]] = True
        gone = set(D)
        owners, xs, rows, pairs = [], [], [], {}
        sparse = self.config.sparse(roster.n)
        for h in holders:
            near = self._near_x(h, sparse)  # x-coordinates, ascending (itself aside: sparse)
            own = near[alive[near]]
            lost = [v for v in graph.closed(h) if v in gone] if gone else []
            reply = revealed[h]
            need = {"self": own, **({"pair": lost} if lost else {})}
            if set(reply) != set(need):
                raise SecureAggregationError(
                    f"{where}: client {h!r}'s reveal has fields {sorted(reply)}, expected "
                    f"{sorted(need)} (its {len(own)} surviving and {len(lost)} dropped "
                    "neighbours)")
            for kind, who in need.items():
                got, width = np.asarray(reply[kind]), size if kind == "self" else 8 * words
                if got.dtype != np.uint8 or got.shape != (len(who), width):
                    raise SecureAggregationError(
                        f"{where}: client {h!r}, field {kind!r}: expected a ({len(who)}, "
                        f"{width}) uint8 array, got {got.dtype} {got.shape}")
            owners.append(own)
            xs.append(index[h])
            rows.append(reply["self"])
            if lost:
                masks = np.ascontiguousarray(reply["pair"]).view("<u8").astype(np.uint64)
                pairs.update(((h, d), masks[i]) for i, d in enumerate(lost))
        cat = (np.concatenate(owners), np.repeat(np.array(xs, dtype=np.int64),
                                                 [len(o) for o in owners]),
               np.concatenate(rows)) if owners else (
            np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros((0, size), np.uint8))
        return cat, pairs

    def _near_x(self, holder: str, sparse: bool) -> np.ndarray:
        """The x-coordinates of ``holder``'s closed neighbourhood, ascending, itself aside on a
        sparse graph (whose owners' shares it reveals; once per holder and fit)."""
        got = self._per_fit.get(("x", holder))
        if got is None:
            got = self.roster.graph.closed_index(holder) + 1
            if sparse:
                got = got[got != self.roster.index[holder]]
            self._per_fit[("x", holder)] = got
        return got

    def _need_roster(self) -> Roster:
        if self.roster is None:
            raise SecureAggregationError("call collect_keys first (the key set-up precedes "
                                         "every exchange)")
        return self.roster

    def _need_pending(self) -> dict:
        if self._pending is None:
            raise SecureAggregationError("no open exchange: call announce first")
        return self._pending


def _fields_of(masked: Mapping[str, Mapping], S: list[str], layout: Layout
               ) -> list[np.ndarray] | None:
    """Each field of ``layout`` stacked over the replies of ``S`` (a (len(S), *shape) uint64
    array each), or None when a reply has other fields, shapes or dtypes (the caller names
    it)."""
    want = dict(layout.shapes)
    u64 = np.dtype(np.uint64)
    for u in S:
        reply = masked[u]
        if len(reply) != len(want):
            return None
        for k, shape in want.items():
            a = reply.get(k)
            if not isinstance(a, np.ndarray) or a.dtype != u64 or a.shape != shape:
                return None
    return [np.stack([masked[u][k] for u in S]) for k in layout.names]


def _leaves(rows: np.ndarray, selfs: np.ndarray, S: list[str], pairs: dict) -> np.ndarray:
    """Each survivor's leaf ``z_w = y_w - s_w -+ m_wd`` (:mod:`~.sumtree`): its masked reply
    less its self mask and the pair masks it revealed with dropped ``d`` (it added ``+m`` when
    it sorts before ``d``); the leaves sum to the unmasked total in the ring."""
    z = rows - selfs
    at = {u: i for i, u in enumerate(S)}
    for (h, d), m in pairs.items():
        if h in at:
            i = at[h]
            z[i] = z[i] - m if h < d else z[i] + m
    return z
