"""What each round's replies must mean before anything is aggregated, written once for every
collector, and the server's mirror of the clients' control variates.

Every reply: the units claimed (``n``) equal the units the client set up (full passes) or lie in
``[1, n_units]`` (mini-batches, SPIDER corrections), and no sum is beyond what can be
aggregated. Where the server can rebuild the client's own statistic ``S_c`` (the initialization
round, which sends ``S_c`` itself; later rounds without a quantizer, from ``Q_c + S_hat (+
V_c)``, with ``V_c`` mirrored from the client's replies), the model's invariants
(:meth:`~fedlatent.engine.contract.model.FederatedModel.check`) on ``S_c`` scaled to sums; the
rebuilt entries carry a rounding ``slack`` (and, under differential privacy, the noise's). Not
rebuilt, so only the generic checks: quantized differences, SPIDER corrections (a difference of
mini-batch terms, not a statistic of data), and with control variates a client whose ``V_c``
the server lost track of (a reply that never arrived).

The replies are rows of an array (:class:`~fedlatent.engine.node.batched.BatchReply`), whether they
came one by one or from a batched step: every check is made on all rows at once; only the rows
a vectorized test flags are then judged one by one, so a refused reply carries the same
reason, word for word, whichever collector gathered it. The mirror costs the server one
statistic per client, as much as one round's replies, and is checkpointed (a resumed run
checks as much as the uninterrupted one).
"""

from __future__ import annotations

import numpy as np

import fedlatent.engine.rounds.batched_round as rows_math
from fedlatent.engine.contract.model import FederatedModel
from fedlatent.engine.fedem.federation import Federation
from fedlatent.engine.node.rows import as_slice
from fedlatent.engine.protocol.messages import ClientReplyError, check_reply, pack
from fedlatent.engine.protocol.reply_rows import MAX_SUM, ReplyRows, RowSum
from fedlatent.engine.stats import Stats

__all__ = ["MAX_SUM", "REBUILD_EPS", "Mirror", "Screen"]

#: rounding allowed, per unit of magnitude, when a statistic is rebuilt as Q_c + S_hat + V_c
REBUILD_EPS = 64 * np.finfo(np.float64).eps
#: what a refused reply sent, in the error of ``on_invalid="raise"``
INVALID, UNTRUE = "an invalid reply", "statistics that cannot be true"


class Mirror:
    """``V_c`` as each client holds it, for all clients at once (rows of an array; ``known``
    says whose the server can follow), and the clients told to go back to it (``resync``).

    Kept only with control variates and without a quantizer (``active``).
    """

    def __init__(self, ids: list[str], active: bool):
        self.ids = list(ids)
        self.pos = {c: i for i, c in enumerate(self.ids)}
        self.active = bool(active)
        self.arr: np.ndarray | None = None
        self.template: Stats | None = None
        self.known = np.zeros(len(self.ids), dtype=bool)
        self.resync = np.zeros(len(self.ids), dtype=bool)

    def load(self, mirror: dict, resync: set) -> None:
        """Take the per-client form (a checkpoint's): ``{client: V_c or None}``, clients."""
        self.known[:] = False
        self.resync[:] = False
        for c, V in mirror.items():
            if V is not None:
                if self.arr is None:
                    self.template = V.zeros_like()
                    self.arr = np.zeros((len(self.ids), V.size))
                self.arr[self.pos[c]] = V.flatten()
                self.known[self.pos[c]] = True
        for c in resync:
            self.resync[self.pos[c]] = True

    def dump(self) -> tuple[dict, set]:
        """The per-client form: ``({client: V_c or None}, clients to resync)``."""
        if self.arr is None:
            return {}, set()
        mirror = {c: (self.template.unflatten(self.arr[i]) if self.known[i] else None)
                  for i, c in enumerate(self.ids)}
        return mirror, {self.ids[i] for i in np.flatnonzero(self.resync)}

    def checkpointed(self):
        """``(mirror, resync)`` for a checkpoint, None when no mirror is kept."""
        return self.dump() if self.active else None

    def resets(self, idx: np.ndarray) -> dict[int, np.ndarray]:
        """The ``V_c`` of the clients at ``idx`` whose last reply was refused (they adopt it
        before their step)."""
        if not self.resync.any() or self.arr is None:
            return {}
        who = idx[self.resync[idx] & self.known[idx]]
        return {int(i): self.arr[i].copy() for i in who}

    def reset_blocks(self, i: int) -> dict[str, np.ndarray]:
        """The ``V_reset/`` blocks of the message to the client at position ``i``."""
        return {f"V_reset/{k}": np.array(v, copy=True)
                for k, v in self.template.unflatten(self.arr[i]).items()}

    def reset_bytes(self, count: int) -> int:
        """Bytes of ``count`` resets in messages."""
        if self.template is None:
            return 0
        return count * sum(len(f"V_reset/{k}") + v.nbytes for k, v in self.template.items())

    def follow(self, init_round: bool, acc, S_hat_new: Stats, alpha: float) -> None:
        """Follow every client's ``V_c``: ``S_c0 - S_hat_0`` after the initialization round,
        then ``V_c + alpha Q_c`` for every reply aggregated; unknown after a reply that did not
        arrive; unchanged when it raised (a client that raises keeps its state).

        A refused reply (malformed, or breaking the invariants) enters neither ``S_hat`` nor
        ``V`` nor the mirror: the client did ``V_c += alpha Q_c`` with what it meant to send,
        which the server cannot know (a lie, or a reply corrupted on the way). So the mirror
        keeps the last accepted ``V_c`` and the client is marked to resync: its next round
        message carries that ``V_c`` (``V_reset/``), which it adopts before its step. Then
        ``V = sum_c w_c V_c`` still holds, an honest client whose one reply was corrupted is
        rebuilt exactly (and accepted) from its next reply on, and a client that keeps lying is
        checked against the true ``V_c`` every round (and refused every round)."""
        rows = acc.rows
        if not self.active:
            return
        if init_round:
            if rows is None:
                return
            if self.arr is None:
                self.arr = np.zeros((len(self.ids), rows.Q.shape[1]))
                self.template = rows.template.zeros_like()
            self.known[:] = False
            if rows.clients.size == len(self.ids) and np.array_equal(
                    rows.clients, np.arange(len(self.ids))):  # every client, in order
                np.subtract(rows.Q, _flat(S_hat_new, rows.template)[None, :], out=self.arr)
            else:
                self.arr[rows.clients] = rows.Q - _flat(S_hat_new, rows.template)[None, :]
            self.known[rows.clients] = True
            self.resync[:] = False
            return
        self.known[acc.absent] = False
        self.resync[acc.absent] = False
        if self.arr is None or rows is None:
            return
        refused = acc.refused
        self.resync[refused[self.known[refused]]] = True
        ok = rows.clients[acc.mask]
        self.resync[ok] = False
        step = rows.Q if alpha == 1.0 else alpha * rows.Q
        if ok.size == len(self.ids) and self.known.all():  # everyone: in place
            self.arr += step
            return
        upd = ok[self.known[ok]]
        self.arr[upd] = self.arr[upd] + step[acc.mask][self.known[ok]]


#: rows of a round's replies checked against the model's invariants in one call (the model's
#: check reads them where they are, or builds them a chunk at a time: ReplyRows.chunks)
_CHECK_SPAN = 8192


class Screen:
    """The checks of a round's replies (see the module docstring), for every collector."""

    #: under differential privacy: each client's noise standard deviation per block (sum scale)
    dp_stds: dict[str, float] | None = None
    #: a client's noise is judged honest within this many standard deviations
    DP_SIGMAS = 7.0

    def __init__(self, model, n_units: dict[str, int], federation: Federation,
                 ids: list[str]):
        self.model, self.n_units = model, n_units
        self.ids = list(ids)
        self.units = np.array([n_units[c] for c in self.ids], dtype=np.float64)
        self.exact = federation.quantizer is None
        self.use_cv = bool(federation.control_variates)
        #: the model states invariants (else rebuilding S_c per client would be wasted work)
        self.has_check = type(model).check is not FederatedModel.check
        #: replies of the last screen refused as malformed (not parsed)
        self.malformed = 0
        #: the last screen's ``sum_c w_c Q_c`` (1, F) when its check took it while reading
        #: every row, all accepted (None: take it apart)
        self.total: np.ndarray | None = None

    def units_problem(self, c: str, n, mode: str) -> str | None:
        """Why the units client ``c`` claims cannot be right (None: they can)."""
        try:
            n = float(n)
        except (TypeError, ValueError):
            return f"claims {n!r} units"
        m = self.n_units[c]
        if n != round(n) and float(m).is_integer():  # weighted units may be fractional
            return f"claims {n:g} units, not a whole number"
        if mode in ("full", "spider-refresh"):
            if n != m:
                return f"claims {n:g} units, {m} at setup"
        elif not (1 <= n <= m if float(m).is_integer() else 0 < n <= m):
            return f"claims {n:g} units in a mini-batch, it has {m}"
        return None

    def set_privacy(self, dp, noise_multiplier: float, params, threshold: int | None) -> None:
        """The noise a client adds this round (the invariants then hold up to it)."""
        from fedlatent.engine.privacy.client_dp import release_stds

        parties = 1 if dp.noise == "local" else int(threshold)
        self.dp_stds = release_stds(self.model.dp_sensitivity(params, dp), noise_multiplier,
                                    n_parties=parties)

    def dp_slack(self, Q: Stats, shares: int = 1) -> Stats | None:
        """Per-entry slack (sum scale) for the noise of ``shares`` clients' replies."""
        if self.dp_stds is None:
            return None
        f = self.DP_SIGMAS * float(np.sqrt(shares))
        return Stats({k: np.full(np.shape(v), f * self.dp_stds.get(k, 0.0)) for k, v in
                      Q.items()}, copy=False)

    # ---- all rows at once ----------------------------------------------------------------
    def screen(self, rep, mode: str, S_hat: Stats | None, mirror: Mirror | None,
               weights: np.ndarray | None = None):
        """``(accepted, reasons)``: a mask over the reply's rows and ``{row: (reason, sent)}``
        of the refused ones, in row order. The rows are tested in chunks (each chunk's rebuilt
        statistics stay in cache, or are read where they are by the model's compiled check;
        nothing of the size of the reply is allocated). With ``weights`` (one per row), a
        compiled check may add ``sum_r w_r Q_r`` as it reads the rows: :attr:`total` when it
        read every row, in order, and every row is accepted (else None)."""
        Q, n, idx = rep.Q, rep.n, rep.clients
        self.total = None
        m = self.units[idx]
        suspect = ~(np.isfinite(n) & np.isfinite(rep.objective))
        if mode in ("full", "spider-refresh"):
            suspect |= n != m
        else:
            suspect |= (n != np.round(n)) | (n < 1) | (n > m)
        exact = S_hat is None or (self.exact and mode != "spider")
        rebuilt = self.rebuildable(rep, S_hat, mirror) if self.has_check and exact else None
        scale = np.maximum(n, 1.0)
        tally = None if weights is None or rebuilt is None else RowSum(weights, Q.shape[1])
        start, sized = 0, False  # (the rows from here are checked against the invariants next)
        for lo, hi in rows_math._chunks(len(n)):  # a chunk of rows at a time, in cache
            if not sized:
                suspect[lo:hi] |= _too_big(Q, slice(lo, hi), scale)
            if rebuilt is not None and (hi - start >= _CHECK_SPAN or hi == len(n)):
                sized = self.check_span(rep, (start, hi), suspect, rebuilt, S_hat, mirror,
                                        tally, sized)
                start = hi
        reasons: dict[int, tuple[str, str]] = {}
        self.malformed = 0
        for r in np.flatnonzero(suspect):
            reason, sent = self.judge_one(rep, int(r), mode, rebuilt, S_hat, mirror)
            self.malformed += sent == INVALID
            if reason:
                reasons[int(r)] = (reason, sent)
        accepted = np.ones(len(n), dtype=bool)
        accepted[list(reasons)] = False
        if tally is not None and tally.count == len(n) and not suspect.any():
            self.total = tally.total[None, :]  # (every row added once, in order: no suspect)
        return accepted, reasons

    def check_span(self, rep, span, suspect, rebuilt, S_hat, mirror, tally, sized) -> bool:
        """Rows ``span`` (lo, hi) that are rebuilt and not yet suspect checked against the
        model's invariants (``suspect`` updated). ``sized``: the span's rows were not size
        tested before (the previous span's check tested them as it read them): then the
        rows this check does not read are tested here. Returns whether this check read every
        row it was given and tested its size (``tally``'s count grew by them): the next span
        goes to it untested."""
        lo, hi = span
        r = lo + np.flatnonzero(rebuilt[lo:hi] & ~suspect[lo:hi])
        count = -1 if tally is None else tally.count
        if r.size:
            suspect[r[self.check_rows(rep, r, rep.n, S_hat, mirror, len(rep.n), tally)]] = True
        read = r.size > 0 and tally is not None and tally.count - count == r.size
        if read:
            suspect[r[tally.big[r]]] = True  # (its size test, made as the rows were read)
        if sized:  # the rows not read: tested apart
            rest = lo + np.flatnonzero(~suspect[lo:hi] & (~rebuilt[lo:hi] if read else True))
            suspect[rest[_too_big(rep.Q, rest, np.maximum(rep.n, 1.0))]] = True
        return read

    def rebuildable(self, rep, S_hat: Stats | None, mirror: Mirror | None) -> np.ndarray:
        """Which rows' statistics ``S_c`` the server can rebuild (with control variates, those
        of the clients whose ``V_c`` it follows)."""
        if S_hat is None or not self.use_cv:
            return np.ones(len(rep.n), dtype=bool)
        if mirror is None or mirror.arr is None:
            return np.zeros(len(rep.n), dtype=bool)
        return mirror.known[rep.clients].copy()

    def rebuild_rows(self, rep, rows: np.ndarray, S_hat: Stats | None, mirror) -> np.ndarray:
        """``S_c = Q_c + S_hat + V_c`` of some rows (A_r, F), added in that order."""
        rows = as_slice(rows)
        if S_hat is None:
            return rep.Q[rows]  # a view when the rows are consecutive: read only
        S_c = rep.Q[rows] + _flat(S_hat, rep.template)[None, :]
        if self.use_cv:
            S_c += mirror.arr[rep.clients[rows]]
        return S_c

    def slack(self, rep, r: int, S_hat: Stats | None, mirror) -> np.ndarray | None:
        """The rounding bound of row ``r``'s rebuilt statistic (None: sent as is)."""
        if S_hat is None:
            return None
        mag = np.abs(rep.Q[r]) + np.abs(_flat(S_hat, rep.template))
        if self.use_cv:
            mag = mag + np.abs(mirror.arr[rep.clients[r]])
        return REBUILD_EPS * mag

    def check_rows(self, rep, rows: np.ndarray, n, S_hat, mirror, work: int = 0,
                   tally: RowSum | None = None) -> np.ndarray:
        """Which of ``rows`` (indices into the reply) may break the model's invariants (a
        mask over them: the model's :meth:`~fedlatent.engine.contract.model.FederatedModel.
        check_rows`, a superset of its ``check``), given the statistics as the server rebuilds
        them (:class:`~fedlatent.engine.protocol.reply_rows.ReplyRows`: nothing of the size of
        the round's statistics is built here); ``work``: the rows of the whole screen;
        ``tally``: where a compiled check adds the rows' weighted sum."""
        V = vrow = None
        if S_hat is not None and self.use_cv:
            V, vrow = mirror.arr, rep.clients[rows]
        view = ReplyRows(rep.Q, rows, n[rows], None if S_hat is None else
                         _flat(S_hat, rep.template), V, vrow, rep.template, REBUILD_EPS,
                         max(int(work), rows.size), tally)
        with np.errstate(over="ignore", invalid="ignore"):
            return np.asarray(self.model.check_rows(view), dtype=bool)

    def judge_one(self, rep, r: int, mode: str, rebuilt, S_hat, mirror):
        """Row ``r``'s reason (None: acceptable) and what it sent; ``rebuilt`` (None: no
        check of the statistics) says which rows can be rebuilt."""
        c = self.ids[rep.clients[r]]
        reply = {**pack("delta", rep.stats(r).to_dict()), "n": rep.n[r],
                 "objective": rep.objective[r]}
        try:
            Q = check_reply(c, reply, rep.template.shapes)
        except ClientReplyError as err:
            return err.reason, INVALID
        reason = self.units_problem(c, reply["n"], mode)
        if reason:
            return reason, UNTRUE
        nf = float(reply["n"])
        for key, v in Q.items():
            big = float(np.max(np.abs(v))) if v.size else 0.0
            if big * max(nf, 1.0) > MAX_SUM:
                return f"statistic {key!r} reaches {big:.3g} per unit, beyond any sum of " \
                    "data", UNTRUE
        if rebuilt is None or not rebuilt[r]:
            return None, UNTRUE
        tmpl = rep.template
        sl = self.slack(rep, r, S_hat, mirror)
        slack = None if sl is None else tmpl.unflatten(sl) * nf
        noise = self.dp_slack(Q)
        if noise is not None:
            slack = noise if slack is None else slack + noise
        S_c = self.rebuild_rows(rep, np.array([r]), S_hat, mirror)[0]
        with np.errstate(over="ignore", invalid="ignore"):
            return self.model.check(tmpl.unflatten(S_c) * nf, nf, slack), UNTRUE


def _too_big(Q: np.ndarray, at, scale: np.ndarray) -> np.ndarray:
    """Which rows ``at`` of ``Q`` (a slice or indices) are beyond what can be aggregated: an
    entry not finite, or ``max |Q_r|`` times the row's ``scale`` (its units, at least 1)
    above :data:`MAX_SUM`."""
    if not Q.shape[1]:
        return np.zeros(len(scale[at]), dtype=bool)
    with np.errstate(invalid="ignore", over="ignore"):  # (NaN: not <=)
        return ~(np.abs(Q[at]).max(axis=1) * scale[at] <= MAX_SUM)


def _flat(S: Stats, template: Stats) -> np.ndarray:
    """``S`` flattened in the block order of the rows' ``template``."""
    return np.concatenate([np.ravel(S[k]) for k in template]) if len(template) else \
        np.zeros(0)

