"""Secure aggregation in the engine: the server learns only the sum of each exchange's replies.

``Federation(secure_aggregation=True)`` routes every sum the server uses through the protocol of
:mod:`fedlatent.engine.secagg` (Bonawitz et al. 2017 with per-exchange secrets):

set-up, once per fit (method ``secagg``, steps ``keys``, ``open``, ``roster``, ``shares``)
    the runtime gives the sites it holds keys and a roster if they bring none
    (:meth:`~fedlatent.engine.protocol.runtime.Runtime.provision_identities`); every client
    draws from the OS one X25519 key pair (share encryption and pairwise masks, agreed once per
    neighbour pair), a nonce and, for each of the ``slots`` exchanges the fit may run, a
    self-mask seed, and sends only a commitment; the server closes the list (``open``: its
    digest and size), the clients open their keys, and the server relays the roster and the
    sealed Shamir shares of every seed (one message per neighbour;
    :mod:`~fedlatent.engine.secagg.commitments`). A client's reply to the roster is
    ``{"to": JSON list of its neighbours, "sealed": (k, 12 + 32 slots + 16) uint8 array}``, a
    row per neighbour; the server sorts every row by recipient at once and sends each client
    ``{"from": JSON list, "sealed": rows}`` (one array, not a field per neighbour).
one exchange (a round's ``estep``, or an initialization ``query``)
    the round message carries the participants (bits over the client's closed neighbourhood),
    the exchange's slot and two public factors:
    the client's weight ``w_c`` and ``1 / N`` (N = the federation's units, public since
    set-up). The client computes its reply as without secure aggregation and sends only
    ``encode(x) + masks`` of ``w_c * delta``, ``n / N``, ``objective / N`` (a round; the
    objective in two limbs; a multi-point round also ``w_c *`` each point's mean statistic
    and its objective ``/ N``) or of every field ``/ N`` (a query: moments, hard-assignment or
    random-membership sums); the survivors then confirm their split of their neighbourhood
    (``consistency``: :mod:`~fedlatent.engine.secagg.consistency`) and reveal, by it, the
    shares that remove the masks (``reveal``), and the server decodes the sum and multiplies
    the ``/ N`` fields back.

What the server learns: per exchange, the sums over the survivors, who was asked and who
answered (client sizes were public already). What it cannot do any more: screen one client's
reply (:mod:`fedlatent.engine.rounds.screen`): the checks apply to the aggregate (its
shapes, finite values, the units it claims equal the survivors' units on full passes, and
the model's invariants on the initialization round's sum), and a failing aggregate stops the
fit naming the round and the clients it came from (secure aggregation hides which of them).

Fixed point: the ring Z_{2^64}, one public power-of-two scale, the largest with
``bound * scale * n_clients < 2^62`` (at most 2^40), where ``bound`` (``Federation(
secagg_bound=2**20)``) caps the absolute value of every entry a client sends; those entries are
per-unit means weighted by ``w_c <= 1`` (a client's mean statistics, or its sums divided by
N), so the bound is that of one record's statistic (e.g. ``x_j x_k``): standardize features
whose squares exceed it. Each entry carries at most ``1 / (2 scale)`` of rounding.
A dropped client's masks are recovered from its surviving neighbours' pair masks of that
exchange (every one of them must answer the reveal); it is excluded for the rest of the fit.
Fewer survivors than the threshold stop the fit, naming the round, the count and the
threshold; an abandoned exchange is never retried. A round whose draw of participants (after
exclusions) is below the threshold is skipped and recorded in ``history_``
(:mod:`.secure_round`); an ``'auto'`` size is refused before any exchange
(:func:`refuse_unsupported`).

At scale (SecAgg+, :mod:`fedlatent.engine.secagg.graph`): when
:func:`~fedlatent.engine.secagg.graph.plus_parameters` finds a degree k at most half the other
clients for the federation's clients and participation, every client masks with and deals its
shares to only its k neighbours on a random k-regular graph fixed by a committed seed, each
secret rebuilt from t of its k neighbours' shares; each client is told only its
neighbourhood's part of the participants, survivors and dropped lists, and a participant whose
neighbourhood could not rebuild its secrets is left out of that exchange (named in the errors).
The threshold above is then the server's rule; each client enforces its neighbourhood's.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
from typing import Any

import numpy as np

from fedlatent.data.validation import name_list
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.protocol.messages import (
    ERROR_KEY,
    fault_detail,
    message_nbytes,
    objective_field,
    statistic_field,
)
from fedlatent.engine.secagg.protocol import id_list
from fedlatent.engine.secagg.steps import _KEY, _LIMB, mask_reply, secagg_step

__all__ = ["INIT_SLOTS", "SecureChannel", "default_threshold", "fixed_point", "mask_reply",
           "open_channel", "refuse_clear_query", "refuse_unsupported", "secagg_step",
           "secure_sum_query", "units_slack"]

logger = logging.getLogger(__name__)

#: exchanges reserved for initialization queries beyond the fit's ``max_rounds``
INIT_SLOTS = 8


def default_threshold(n_clients: int) -> int:
    """floor(n / 2) + 1: the smallest threshold the protocol allows (at most n)."""
    return min(n_clients, n_clients // 2 + 1)


def fixed_point(bound: float, n_clients: int):
    """The public encoding: the largest power-of-two scale (<= 2^40) such that a sum of
    ``n_clients`` entries of magnitude ``bound`` stays below 2^62."""
    from fedlatent.engine.secagg import FixedPoint

    bits = math.floor(math.log2(2.0**62 / (float(bound) * max(n_clients, 1))))
    if bits < 10:
        raise ValueError(f"secure aggregation: bound {bound:g} with {n_clients} clients leaves "
                         f"a fixed-point scale of 2^{bits}, too coarse; lower "
                         "Federation(secagg_bound=...) (standardize the features)")
    return FixedPoint(scale=2.0 ** min(bits, 40), bound=float(bound))


def units_slack(n_survivors: int, n_total: float, scale: float) -> float:
    """:meth:`SecureChannel.units_slack` of a fit of ``n_total`` units at fixed-point
    ``scale`` (a verifying site checks a claimed failure with it)."""
    return 0.5 + n_survivors * n_total / (2.0 * scale)


# ---- the server side ------------------------------------------------------------------------
class SecureChannel:
    """The server's secure aggregation for one fit: the set-up and every secure sum.

    Parameters
    ----------
    runtime : Runtime
    n_units : dict of str to int
        The units each client set up (public): N is their total.
    threshold : int or None
        Shares needed to unmask; None: ``floor(n / 2) + 1``.
    bound : float
        Largest magnitude of an entry one client sends (see the module docstring).
    slots : int
        Exchanges the fit may run (its rounds plus :data:`INIT_SLOTS`).
    run : str or None
        The run's id, bound into the sites' signatures of their keys; None: a fresh random id.
    participation : float
        The share of clients each round draws: with the clients' number it fixes the masking
        graph (:func:`~fedlatent.engine.secagg.graph.plus_parameters`; the complete graph when
        a sparse one would not be smaller).
    """

    def __init__(self, runtime, n_units: dict[str, int], *, threshold: int | None,
                 bound: float, slots: int, run: str | None = None,
                 participation: float = 1.0, verify: bool = False):
        import secrets

        from fedlatent.engine.secagg import SecAggConfig, SecAggServer
        from fedlatent.engine.secagg.graph import plus_parameters

        self.run = str(run) if run else secrets.token_hex(16)
        self.runtime = runtime
        self.cids = list(runtime.client_ids)
        self.n_total = float(sum(n_units[c] for c in self.cids))
        n = len(self.cids)
        t = default_threshold(n) if threshold is None else int(threshold)
        k, local = plus_parameters(n, participation, exchanges=int(slots))
        self.config = SecAggConfig(t, fixed_point(bound, n), slots=int(slots),
                                   degree=k if local else None, local_threshold=local or None,
                                   participation=float(participation))
        self.config.check_clients(n)
        self.server = SecAggServer(self.config, run=self.run, round=0)
        #: bytes of the key set-up, (down, up); the initialization round's record adds them
        self.setup_down = self.setup_up = 0
        #: how many times each initialization query was asked (its exchanges' labels)
        self.asked: dict[str, int] = {}
        #: verified rounds (:mod:`fedlatent.engine.node.verify`): each exchange's message
        #: carries the sum tree of the exchange before (:attr:`transcript`)
        self.verify = bool(verify)
        self.server.keep_leaves = self.verify
        #: ``{(round, exchange): (SumTree, its shared fields)}`` of the exchanges unmasked
        #: whose transcript a site has yet to be shown, and each site's last exchange
        self.trees: dict[tuple[int, str], tuple] = {}
        self.last_of: dict[str, tuple[int, str]] = {}

    @property
    def excluded(self) -> dict[str, str]:
        """Clients declared dropped (their pair masks of that exchange revealed): out for the rest
        of the fit."""
        return self.server.excluded

    def units_slack(self, n_survivors: int) -> float:
        """How far a sum's units may be from its survivors' by the fixed-point rounding alone:
        each sends ``n / N`` rounded to ``1 / (2 scale)``, so the sum times N is off by at most
        ``n_survivors N / (2 scale)`` (37 units at 10,000 clients of 200 rows, scale 2^28),
        plus half a unit."""
        return units_slack(n_survivors, self.n_total, self.config.encoding.scale)

    @property
    def setup_bytes(self) -> int:
        return self.setup_down + self.setup_up

    def _call(self, ids, method, msgs) -> dict:
        self.setup_down += sum(message_nbytes(msgs[c]) for c in ids)
        replies = self.runtime.call(ids, method, msgs) if ids else {}
        self.setup_up += sum(message_nbytes(r) for r in replies.values())
        return replies

    def setup(self) -> SecureChannel:
        """Commitments, opened keys, the roster and sealed shares: four messages to every
        client, once per fit (:mod:`~fedlatent.engine.secagg.commitments`)."""
        from fedlatent.engine.secagg import SecureAggregationError
        from fedlatent.engine.secagg.protocol import as_u8

        self.runtime.provision_identities(self.cids)
        enc = self.config.encoding
        base = {"step": "keys", "threshold": int(self.config.threshold), "scale": enc.scale,
                "bound": float(enc.bound), "slots": int(self.config.n_slots), "run": self.run,
                "round": 0, "participation": float(self.config.participation),
                **self._graph_settings(), **({"verify": 1} if self.verify else {})}
        commits = self._call(self.cids, "secagg", {c: base for c in self.cids})
        self._require(commits, "sent no commitment to its keys")
        try:
            close = self.server.collect_commitments(commits)
        except SecureAggregationError as err:
            raise FederatedFitError(f"secure aggregation set-up: {err}") from err
        opened = {"step": "open", "closed": as_u8(close["closed"]), "n": int(close["n"])}
        keys = self._call(self.cids, "secagg", {c: opened for c in self.cids})
        self._require(keys, "opened no keys")
        try:
            self.server.collect_keys(keys)
        except SecureAggregationError as err:
            raise FederatedFitError(f"secure aggregation set-up: {err}") from err
        out = self._call(self.cids, "secagg", {c: {"step": "roster", **self.server.roster_for(c)}
                                               for c in self.cids})
        refused = {c: str(r[ERROR_KEY]) for c, r in out.items() if ERROR_KEY in r}
        if refused:  # a site that cannot authenticate a peer deals no shares: stop here
            raise FederatedFitError(f"secure aggregation set-up: clients "
                                    f"[{name_list(list(refused))}] refused the relayed keys; "
                                    f"{fault_detail(refused)}", faults=refused)
        done = self._call(self.cids, "secagg", self._route(out))
        failed = {c: str(r[ERROR_KEY]) for c, r in done.items() if ERROR_KEY in r}
        if failed:  # as before: they refuse to mask later, and count as dropped
            logger.warning("secure aggregation set-up: clients [%s] could not take the shares "
                           "relayed to them; %s", name_list(list(failed)), fault_detail(failed))
        logger.info("secure aggregation set up for %d clients (threshold %d, scale 2^%d, "
                    "%d exchanges, %d bytes, graph degree %s)", len(self.cids),
                    self.config.threshold, int(math.log2(enc.scale)), self.config.n_slots,
                    self.setup_bytes, self.config.degree or "complete")
        return self

    def _require(self, replies: dict, what: str) -> None:
        """A set-up step every client must answer: FederatedFitError naming those that did
        not (with the reason each gave)."""
        missing = {c: str(replies[c][ERROR_KEY]) if c in replies else "no reply"
                   for c in self.cids if c not in replies or ERROR_KEY in replies[c]}
        if missing:
            raise FederatedFitError(f"secure aggregation set-up: clients "
                                    f"[{name_list(list(missing))}] {what}; every client must "
                                    f"take part in the set-up; {fault_detail(missing)}",
                                    faults=missing)

    def _route(self, out: dict[str, dict]) -> dict[str, dict]:
        """The share messages to relay, ``{recipient: {"step": "shares", "from": JSON ids,
        "sealed": rows}}``, from the senders' ``{"to": JSON ids, "sealed": rows}``: every row
        sorted by recipient at once (a malformed sender is named)."""
        senders, to, rows = [], [], []
        for u in self.cids:
            msg = out.get(u)
            if msg is None:  # no reply: it deals no shares (its peers will not mask with it)
                continue
            try:
                peers = id_list(msg.get("to"), "'to'", error=ValueError)
                sealed = np.asarray(msg.get("sealed"))
                assert sealed.dtype == np.uint8 and sealed.shape[:1] == (len(peers),)
                assert sealed.ndim == 2 and (not rows or sealed.shape[1] == rows[0].shape[1])
            except (ValueError, AssertionError) as err:
                raise FederatedFitError(f"secure aggregation set-up: client {u!r} sent a "
                                        "malformed share message (a JSON list 'to' and one "
                                        "row of 'sealed' per recipient, all of one length)",
                                        faults={u: "malformed shares"}) from err
            senders += [u] * len(peers)
            to += peers
            rows.append(sealed)
        at = dict(zip(self.cids, range(len(self.cids))))
        dest = np.fromiter(map(at.get, to, itertools.repeat(-1)), np.int64, len(to))
        keep = np.flatnonzero(dest >= 0)  # rows to unknown ids are dropped, as before
        order = keep[np.argsort(dest[keep], kind="stable")]
        rows_all = np.concatenate(rows)[order] if rows else np.zeros((0, 0), np.uint8)
        ends = np.cumsum(np.bincount(dest[order], minlength=len(self.cids)))
        senders_sorted = np.array(senders, dtype=object)[order].tolist()
        inbox, lo = {}, 0
        for c, hi in zip(self.cids, ends.tolist()):
            inbox[c] = {"step": "shares", "from": json.dumps(senders_sorted[lo:hi]),
                        "sealed": rows_all[lo:hi]}
            lo = hi
        return inbox

    def _announce(self, asked: list[str], round: int, exchange: str, where: str):
        """``(participants, left out)``: the exchange opened with the clients asked, less those
        whose neighbourhood among them could not rebuild their secrets (a sparse graph)."""
        from fedlatent.engine.secagg import SecureAggregationError

        able = self.server.unmaskable(asked)
        kept = set(able)  # a look-up per client asked (in the sorted list: n^2 / 2 compares)
        thin = {c: "too few of its masking-graph neighbours take part in this exchange to "
                "rebuild its secrets: left out of it" for c in asked if c not in kept}
        if thin:
            logger.warning("round %s, exchange %r: left out [%s]: too few of their masking-graph "
                           "neighbours take part", round, exchange, name_list(list(thin)))
        try:
            return self.server.announce(round, exchange, able), thin
        except SecureAggregationError as err:
            raise FederatedFitError(f"{where}{err}", None, round) from err

    def _near_bits(self, ids: list[str]) -> dict[str, np.ndarray]:
        """``{client: bits}``: ``ids`` as each of them is told them, bits over its closed
        neighbourhood (sorted; every client on the complete graph), little-endian within each
        byte (:meth:`~fedlatent.engine.secagg.client.SecAggClient.announced` reads them)."""
        roster = self.server.roster
        have = np.zeros(roster.n, dtype=bool)
        have[np.array(roster.x_of(ids), dtype=np.int64) - 1] = True
        if not self.config.sparse(roster.n):
            bits = np.packbits(have, bitorder="little")
            return dict.fromkeys(ids, bits)
        at = np.array(roster.x_of(ids), dtype=np.int64) - 1  # every closed neighbourhood
        rows = np.packbits(have[self.server.near_table()[at]], axis=1, bitorder="little")
        return dict(zip(ids, rows))  # has degree + 1 members: one array of them

    def _near(self, ids: list[str]):
        """``client -> JSON list``: ``ids`` as each client is told them, on a sparse graph only
        those of its closed neighbourhood (all it needs and can check), else all of them."""
        full = json.dumps(list(ids))
        roster = self.server.roster
        if not self.config.sparse(roster.n):
            return lambda c: full
        have = set(ids)
        return lambda c: json.dumps([v for v in roster.graph.closed(c) if v in have])

    def _graph_settings(self) -> dict[str, Any]:
        """The set-up message's masking-graph fields: the degree, the neighbourhood threshold
        and the commitment to the graph seed (nothing on the complete graph)."""
        cfg = self.config
        if cfg.degree is None:
            return {}
        return {"degree": int(cfg.degree), "local_threshold": int(cfg.local_threshold),
                "graph_commit": self.server.graph_commit.hex()}

    def sum(self, method: str, msgs: dict[str, dict[str, Any]], *, round: int, exchange: str,
            weights: dict[str, float] | None = None) -> dict[str, Any]:
        """One secure exchange with the clients of ``msgs``.

        Returns ``{"sums": {field: float array}, "survivors": [...], "dropped": [...],
        "errors": {client: text}, "bytes_up": int, "bytes_down": int}``; ``sums`` holds the
        decoded sum over the survivors, with the ``/ N`` fields multiplied back by N.
        Raises FederatedFitError naming the round, the count and the threshold when fewer than
        ``threshold`` clients take part, reply or reveal.
        """
        from fedlatent.engine.secagg import SecureAggregationError

        where = "" if method == "estep" else f"initialization {exchange!r}: "
        P, thin = self._announce(list(msgs), round, exchange, where)
        slot = self.server.slot
        head = {_KEY + "slot": slot, _KEY + "round": int(round), _KEY + "exchange": str(exchange),
                _KEY + "unit": 1.0 / self.n_total}
        told = self._near_bits(P)  # each client's part of the participants (bits)
        out = {c: {**msgs[c], **head, _KEY + "participants": told[c],
                   _KEY + "weight": float((weights or {}).get(c, 0.0))} for c in P}
        test = any("secagg/replay" in m for m in msgs.values())  # a group test: shown the
        down = _nbytes_many(msgs, P, head, told) + self._show_transcript(  # failing round's
            out, (int(round), "estep") if test else None)  # transcript (verified rounds)
        replies = self.runtime.call(P, method, out)
        errors = {**thin, **{c: str(r[ERROR_KEY]) for c, r in replies.items() if ERROR_KEY in r}}
        masked = {c: r for c, r in replies.items() if ERROR_KEY not in r}
        up = sum(message_nbytes(r) for r in replies.values())
        try:
            request = self.server.aggregate(masked)
        except SecureAggregationError as err:
            raise FederatedFitError(f"{where}{err}" + (f"; {fault_detail(errors)}" if errors
                                                       else ""), None, round) from err
        S = request["survivors"]
        alive, gone = (self._near(S), self._near(request["dropped"])) if request["dropped"] \
            else (None, None)  # every participant survived: nothing to tell
        try:
            sums, down2, up2 = self._unmask(S, alive, gone, round, exchange, where)
        except FederatedFitError as err:  # (a verified round stopped by a dropout: say why
            if not request["dropped"]:  # each dropped site is missing)
                raise
            raise FederatedFitError(f"{err}; dropped in this exchange: " + fault_detail(
                {d: errors.get(d, "no reply").removeprefix(f"client {d!r}: ")
                 for d in request["dropped"]}), None,
                round) from err
        if self.verify and not test:  # the sum tree each survivor's next exchange shows it
            self._keep_tree(int(round), str(exchange))
        down, up = down + down2, up + up2
        for k in [k[:-3] for k in sums if k.endswith("/hi") and objective_field(k[:-3])]:
            sums[k] = sums.pop(k + "/hi") * _LIMB + sums.pop(k + "/lo")
        for k in sums:  # scalars cross as one-entry vectors
            if (k == "n" or objective_field(k)) and sums[k].size == 1:
                sums[k] = sums[k].reshape(())
        for k in sums:
            if not (method == "estep" and statistic_field(k)):
                sums[k] = sums[k] * self.n_total
        if request["dropped"]:
            logger.warning("round %s, exchange %r: recovered the masks of dropped [%s] "
                           "(excluded from now on)", round, exchange, name_list(request["dropped"]))
        return {"sums": sums, "survivors": list(S), "dropped": list(request["dropped"]),
                "errors": errors, "bytes_up": int(up), "bytes_down": int(down)}


    def _keep_tree(self, round: int, exchange: str) -> None:
        """The sum tree of the exchange just unmasked (:mod:`.sumtree`), kept until each of
        its survivors was shown it; trees no site needs any more dropped. Its leaves are the
        roster's, in the roster's order (every site knows both): a site not in the sum holds
        a zero leaf, which the survivors of its neighbourhood check (:func:`zero_fields`)."""
        from fedlatent.engine.secagg.sumtree import SumTree, shared_fields

        label, S, leaves = self.server.leaves
        ids = list(self.server.roster.ids)
        at = {u: i for i, u in enumerate(ids)}
        if len(S) != len(ids):  # (the survivors' leaves at their ranks, zeros elsewhere)
            full = np.zeros((len(ids), leaves.shape[1]), dtype=np.uint64)
            full[[at[u] for u in S]] = leaves
            leaves = full
        tree = SumTree(label, ids, leaves)
        key = (round, exchange)
        absent = frozenset(ids).difference(S)
        self.trees[key] = (tree, shared_fields(tree), at, absent)
        self.last_of.update(dict.fromkeys(S, key))
        live = set(self.last_of.values())
        for k in [k for k in self.trees if k not in live]:
            del self.trees[k]

    def _show_transcript(self, out: dict[str, dict], test: tuple[int, str] | None = None
                         ) -> int:
        """Add to each message of ``out`` the transcript of the site's last exchange (verified
        rounds: ``A``, its carries, the site's index and path); to a site's first, the
        federation's units and clients the replay needs (the site keeps them); their bytes.
        ``test``: a group test's ``(round, exchange)``, the failing sum the tests re-run: its
        transcript, its tree kept (a site checks the failure itself before it answers:
        :mod:`fedlatent.engine.node.verify_groups`; none shown where the tree is gone)."""
        if not self.verify or (test is not None and test not in self.trees):
            return 0
        from fedlatent.engine.secagg.sumtree import transcript_fields, zero_fields

        down = 0
        units = {"verify/units": np.array([self.n_total, len(self.cids)])}
        for c, m in out.items():
            key = self.last_of.get(c) if test is None else test
            if key is None:  # (its first exchange: nothing to show)
                m.update(units)
                down += message_nbytes(units)
                continue
            tree, shared, at, absent = self.trees[key]
            own = transcript_fields(tree, at[c])
            if absent:  # the zero leaves of the absent sites of its neighbourhood
                graph = self.server.roster.graph
                near = absent if graph.complete else absent & graph.closed_set(c)
                own.update(zero_fields(tree, sorted(at[u] for u in near)))
            m.update(shared)
            m.update(own)
            down += message_nbytes(shared) + message_nbytes(own)
        return down

    def _unmask(self, S: list[str], alive, gone, round: int, exchange: str, where: str):
        """``(sums, bytes down, bytes up)`` of the open exchange's survivors ``S``: the
        consistency round (each confirms its split, ``alive(c)`` and ``gone(c)``; None: every
        participant survived), then the reveal, each survivor sent the confirmations of the
        peers whose shares it reveals."""
        from fedlatent.engine.secagg import SecureAggregationError

        head = {"round": int(round), "exchange": str(exchange)}
        plain = {"step": "consistency", **head}  # none dropped: every participant survived
        req = {c: {**plain, "survivors": alive(c), "dropped": gone(c)} for c in S} if gone \
            else dict.fromkeys(S, plain)
        signed = self.runtime.call(S, "secagg", req)
        down = len(S) * message_nbytes(plain) if not gone else sum(
            message_nbytes(req[c]) for c in S)
        up = sum(message_nbytes(r) for r in signed.values())
        try:  # the consistency round: every survivor confirms its split, before any reveal
            self.server.collect_confirmations({c: r for c, r in signed.items()
                                               if ERROR_KEY not in r})
        except SecureAggregationError as err:
            why = {c: str(r[ERROR_KEY]) for c, r in signed.items() if ERROR_KEY in r}
            raise FederatedFitError(f"{where}{err}" + (f"; {fault_detail(why)}" if why else ""),
                                    None, round) from err
        words = self.server.confirmations_all()
        req = {c: {"step": "reveal", **head, "confirm": words[c]} for c in S}
        revealed = self.runtime.call(S, "secagg", req)
        down += sum(message_nbytes(req[c]) for c in S)
        up += sum(message_nbytes(r) for r in revealed.values())
        refused = {c: str(r[ERROR_KEY]) for c, r in revealed.items() if ERROR_KEY in r}
        try:
            sums = self.server.unmask({c: r for c, r in revealed.items() if ERROR_KEY not in r})
        except SecureAggregationError as err:
            raise FederatedFitError(f"{where}{err}" + (f"; {fault_detail(refused)}"
                                                       if refused else ""), None, round) from err
        return sums, down, up


def _nbytes_many(msgs: dict, P: list[str], head: dict, told: dict) -> int:
    """The bytes of an exchange's messages ``{**msgs[c], **head, participants: told[c],
    weight}``, each distinct ``msgs[c]`` counted once (a round sends every client one)."""
    seen: dict[int, int] = {}
    total = 0
    extra = message_nbytes(head) + len(_KEY + "participants") + len(_KEY + "weight") + 8
    for c in P:
        m = msgs[c]
        b = seen.get(id(m))
        if b is None:
            b = seen[id(m)] = message_nbytes(m)
        total += b + extra + told[c].nbytes
    return total


def open_channel(runtime, federation, n_units: dict[str, int], max_rounds: int) -> SecureChannel:
    """The set-up of one fit under ``federation``: enough slots for ``max_rounds`` rounds,
    :data:`INIT_SLOTS` initialization exchanges and the group tests of
    :data:`~fedlatent.engine.secagg.secure_checks.CHECK_SLOTS`."""
    from fedlatent.engine.secagg.secure_checks import CHECK_SLOTS

    return SecureChannel(runtime, n_units, threshold=federation.secagg_threshold,
                         bound=federation.secagg_bound,
                         slots=int(max_rounds) + INIT_SLOTS + CHECK_SLOTS,
                         participation=float(federation.participation),
                         verify=federation.verifies).setup()


def secure_sum_query(ctx, query: str, payload: dict[str, Any] | None,
                     shapes: dict[str, tuple], *, what: str) -> dict[str, np.ndarray]:
    """An initialization query whose replies the server needs only summed, through secure
    aggregation: ``{field: sum over every client}``, each field checked for its shape and
    finite values; every client must take part (a dropout stops the fit, naming it)."""
    channel = ctx.secure
    base = {"query": query, "seed": int(ctx.seed), **(payload or {})}
    # every exchange needs its own label: a query asked again (a Lloyd step) is "name#2", ...
    channel.asked[query] = channel.asked.get(query, 0) + 1
    label = query if channel.asked[query] == 1 else f"{query}#{channel.asked[query]}"
    res = channel.sum("query", {c: base for c in ctx.client_ids}, round=0, exchange=label)
    if res["dropped"]:
        faults = {c: res["errors"].get(c, "no reply") for c in res["dropped"]}
        raise FederatedFitError(f"{what}: every client must answer; {fault_detail(faults)}",
                                faults=faults)
    out = {}
    for k, shp in shapes.items():
        v = np.asarray(res["sums"].get(k, np.nan), dtype=np.float64)
        if v.size == int(np.prod(shp)):
            v = v.reshape(shp)
        if v.shape != tuple(shp) or not np.all(np.isfinite(v)):
            raise FederatedFitError(f"{what}: the aggregate field {k!r} has shape {v.shape} "
                                    f"(expected {tuple(shp)}) or non-finite values; secure "
                                    "aggregation hides which client sent it")
        out[k] = v
    return out


def refuse_unsupported(est) -> None:
    """ValueError unless estimator ``est`` can be fitted under secure aggregation: its class
    says why not (``capabilities.secure_refusal``), or a size ``'auto'`` would be chosen by
    per-client held-out scores."""
    name = type(est).__name__
    caps = est.capabilities
    if not caps.secure_aggregation:
        raise ValueError(f"{name} refuses Federation(secure_aggregation=True): "
                         f"{caps.secure_refusal}; fit it with secure_aggregation=False")
    sel = est._selection()
    if sel is not None:
        raise ValueError(f"{name}: a size 'auto' is chosen by scores each client sends in the "
                         f"clear ({sel.param}='auto': its log-likelihood, or its score on "
                         "held-out rows), which secure aggregation would not hide; give "
                         f"{sel.param} a number or fit with secure_aggregation=False")


def refuse_clear_query(query: str, what: str | None) -> None:
    """The error of a per-client query under secure aggregation."""
    raise ValueError(f"query {query!r} ({what or 'an exchange'}) would send each client's reply "
                     "to the server in the clear; under secure aggregation only sums cross "
                     "(FitContext.ask_sum); use a start built from sums, or "
                     "secure_aggregation=False")
