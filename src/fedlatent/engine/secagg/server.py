"""The server side of secure aggregation: relay, sum of masked replies, unmasking.

The server sees public keys, AEAD ciphertexts it cannot open, masked vectors, and per exchange the
shares the survivors reveal: of each survivor's self-mask seed b_u, and of each dropped
participant's mask key s_d. From those it learns the sum of the survivors' inputs and nothing
about one client's input beyond it (Bonawitz et al., CCS 2017, Theorem 6.2, honest-but-curious).
"""

from __future__ import annotations

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
    as_bytes,
    describe,
    exchange_label,
    pair_mask,
    self_mask,
    slot_item,
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

    Notes
    -----
    Per fit: :meth:`collect_keys` (its result is broadcast to every client), then
    :func:`route_shares`. Per exchange: :meth:`announce` the participants, :meth:`aggregate` the
    masked replies (returns who survived and who dropped, to send to the survivors), then
    :meth:`unmask` with the survivors' :meth:`SecAggClient.reveal` replies.
    """

    def __init__(self, config: SecAggConfig):
        _crypto.require()
        self.config = config
        self.roster: Roster | None = None
        self.excluded: dict[str, str] = {}  # dropped clients whose mask key was rebuilt
        self._pending: dict | None = None
        self._done: set[bytes] = set()
        self._next_slot = 0
        # the seed of the masking graph, committed to before any client draws its keys
        self._graph_seed = _crypto.random_bytes() if config.degree is not None else None

    @property
    def graph_commit(self) -> bytes | None:
        """SHA-256 of the graph seed: what every client gets before it draws its keys (None
        without a degree: the complete graph)."""
        return None if self._graph_seed is None else _crypto.commit(self._graph_seed)

    def collect_keys(self, keys: Mapping[str, Mapping[str, np.ndarray]]) -> dict:
        """Check every client's public keys ``{client: public_keys()}`` and return the roster to
        broadcast, a flat message (:meth:`Roster.to_message`); on a sparse graph each client is
        sent :meth:`roster_for` it instead."""
        if self.roster is not None:
            raise SecureAggregationError("keys are set up once per fit; start a new server and "
                                         "new clients to set up again")
        self.roster = Roster(keys, self.config, graph_seed=self._graph_seed)
        self.config.encoding.check_capacity(self.roster.n)
        return self.roster.to_message()

    def roster_for(self, client: str) -> dict:
        """The roster message for ``client`` (:meth:`Roster.message_for`)."""
        return self._need_roster().message_for(str(client))

    def unmaskable(self, participants: Sequence[str]) -> list[str]:
        """The participants, less those (repeatedly) with fewer than the neighbourhood
        threshold of their closed neighbourhood among them: their secrets could not be rebuilt
        if they dropped (on the complete graph, all of them)."""
        roster = self._need_roster()
        P = set(map(str, participants))
        if not self.config.sparse(roster.n):
            return sorted(P)
        t = self.config.share_threshold(roster.n)
        while True:
            thin = {u for u in P if len(P.intersection(roster.graph.closed(u))) < t}
            if not thin:
                return sorted(P)
            P -= thin

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
                "mask keys rebuilt; they must rejoin with new keys (a new set-up)")
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
        total = np.zeros(layout.size, dtype=np.uint64)
        for u in S:
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
            total += layout.flatten(reply, np.uint64)
        pend.update(survivors=S, dropped=sorted(set(P) - set(S)), layout=layout, total=total)
        return {"survivors": list(S), "dropped": list(pend["dropped"])}

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
        graph, alive, gone = roster.graph, set(S), set(D)
        want = {h: [f"self:{u}" for u in graph.closed(h) if u in alive]
                + [f"mask:{d}" for d in graph.closed(h) if d in gone] for h in holders}
        shares = self._shares(revealed, want, where)
        total = pend["total"].copy()
        e, n = pend["slot"], total.size
        ts = self.config.share_threshold(roster.n)
        total -= self._self_masks(shares, S, ts, e, label, n, where)
        for d in D:
            total += self._pair_masks_of(d, shares, S, ts, e, label, n, where)
            self.excluded[d] = where
        if D:
            log.info("%s: recovered the masks of dropped %s", where, D)
        self._done.add(label)
        self._pending = None
        return self.config.encoding.decode(pend["layout"].unflatten(total))

    def _enough(self, shares: dict, key: str, t: int, where: str) -> dict[int, int]:
        got = shares.get(key, {})
        if len(got) < t:
            kind, who = key.split(":", 1)
            raise SecureAggregationError(
                f"{where}: {len(got)} neighbours of {who!r} revealed shares of its "
                f"{'self-mask seed' if kind == 'self' else 'mask key'}, fewer than the "
                f"neighbourhood threshold {t}; the sum stays masked")
        return got

    def _self_masks(self, shares, S, t, e, label, n, where) -> np.ndarray:
        """The sum of the survivors' self masks, each seed rebuilt and checked against its
        commitment (the seeds rebuilt at once)."""
        roster = self.roster
        seeds = shamir.reconstruct_many([self._enough(shares, f"self:{u}", t, where)
                                         for u in S], t)
        out = np.zeros(n, dtype=np.uint64)
        for u, seed in zip(S, seeds):
            if _crypto.commit(seed) != slot_item(roster.keys[u]["self_commit"], e):
                raise SecureAggregationError(f"{where}: the self-mask seed of {u!r} rebuilt from "
                                             "the revealed shares does not match its commitment; "
                                             "a revealing client sent a wrong share")
            out += self_mask(seed, label, n)
        return out

    def _pair_masks_of(self, d, shares, S, t, e, label, n, where) -> np.ndarray:
        """What the survivors' pair masks with dropped ``d`` added to the sum, negated: d's mask
        key rebuilt and checked, then the masks of d's neighbours among the survivors."""
        roster = self.roster
        (raw,) = shamir.reconstruct_many([self._enough(shares, f"mask:{d}", t, where)], t)
        private = _crypto.load_private(raw)
        if _crypto.public_raw(private) != slot_item(roster.keys[d]["mask_key"], e):
            raise SecureAggregationError(f"{where}: the mask key of dropped {d!r} rebuilt "
                                         "from the revealed shares does not match its public "
                                         "key; a revealing client sent a wrong share")
        out = np.zeros(n, dtype=np.uint64)
        alive = set(S)
        for u in roster.graph.neighbours(d):  # u added +m if u < d else -m; remove it
            if u not in alive:
                continue
            m = pair_mask(_crypto.agree(private, slot_item(roster.keys[u]["mask_key"], e)),
                          label, n)
            if u < d:
                out -= m
            else:
                out += m
        return out

    def _shares(self, revealed, want: dict[str, list[str]], where: str) -> dict[str, dict]:
        """``{secret: {holder index: share}}`` from the holders' reveals; each holder ``h`` must
        reveal exactly the secrets ``want[h]`` (those of its neighbours)."""
        shares: dict[str, dict[int, int]] = {}
        for h, keys in want.items():
            reply = revealed[h]
            if len(reply) != len(keys) or not all(k in reply for k in keys):
                missing = sorted(set(keys) - set(reply))
                extra = sorted(set(reply) - set(keys))
                raise SecureAggregationError(f"{where}: client {h!r}'s reveal lacks {missing} "
                                             f"and has unexpected {extra}")
            x = self.roster.index[h]
            for k in keys:
                y = shamir.int_from_share(as_bytes(reply[k], what=f"client {h!r}, field {k!r}",
                                                   size=shamir.SHARE_BYTES))
                shares.setdefault(k, {})[x] = y
        return shares

    def _need_roster(self) -> Roster:
        if self.roster is None:
            raise SecureAggregationError("call collect_keys first (the key set-up precedes "
                                         "every exchange)")
        return self.roster

    def _need_pending(self) -> dict:
        if self._pending is None:
            raise SecureAggregationError("no open exchange: call announce first")
        return self._pending
