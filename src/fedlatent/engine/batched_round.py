"""The server's side of a batched round: the replies of all the round's clients screened and
aggregated as arrays of shape (n_clients, F), with the checks of the per-client path.

Every check :class:`~fedlatent.engine.update.ReplyScreen` makes on a reply is made here on all
replies at once (finite values, the units claimed, magnitudes, the model's invariants on the
rebuilt statistic ``S_c = Q_c + S_hat + V_c``); only the clients a vectorized test flags are
then judged one by one, so a refused reply carries the same reason, word for word, as on the
per-client path. The mirror of the clients' control variates is an array (``known`` says whose
``V_c`` the server can follow).
"""

from __future__ import annotations

import numpy as np

from .batched import _as_slice
from .messages import ClientReplyError, check_reply, pack
from .stats import Stats
from .update import _MAX_SUM, _REBUILD_EPS

__all__ = ["BatchedServer"]

#: rows of a reply screened at once (a few MiB of rebuilt statistics, in cache)
_CHUNK = 2048


class BatchedServer:
    """What the round loop keeps for batched rounds: client positions and the array mirror."""

    def __init__(self, rounds, runtime):
        self.rd = rounds
        self.rt = runtime
        self.ids = list(rounds.cids)
        self.pos = {c: i for i, c in enumerate(self.ids)}
        self.n_units = np.array([rounds.screen.n_units[c] for c in self.ids], dtype=np.float64)
        self.w = np.array([rounds.weights[c] for c in self.ids])
        self.mirror: np.ndarray | None = None
        self.known = np.zeros(len(self.ids), dtype=bool)
        self.resync = np.zeros(len(self.ids), dtype=bool)
        self.template: Stats | None = None
        #: replies of the last screen refused as malformed (not parsed)
        self.malformed = 0

    # ---- the mirror <-> the per-client form (checkpoints, fallback) --------------------------
    def load_mirror(self, mirror: dict, resync: set) -> None:
        self.known[:] = False
        self.resync[:] = False
        for c, V in mirror.items():
            if V is not None:
                if self.mirror is None:
                    self.template = V.zeros_like()
                    self.mirror = np.zeros((len(self.ids), V.size))
                self.mirror[self.pos[c]] = V.flatten()
                self.known[self.pos[c]] = True
        for c in resync:
            self.resync[self.pos[c]] = True

    def dump_mirror(self):
        if self.mirror is None:
            return {}, set()
        mirror = {c: (self.template.unflatten(self.mirror[i]) if self.known[i] else None)
                  for i, c in enumerate(self.ids)}
        return mirror, {self.ids[i] for i in np.flatnonzero(self.resync)}

    # ---- one round -------------------------------------------------------------------------
    def resets(self, idx: np.ndarray) -> tuple[dict[int, np.ndarray], int]:
        """The ``V_reset`` of the round's clients whose last reply was refused, and its bytes."""
        if not self.resync.any() or self.mirror is None:
            return {}, 0
        who = idx[self.resync[idx] & self.known[idx]]
        per = sum(len(f"V_reset/{k}") + v.nbytes for k, v in self.template.items())
        return {int(i): self.mirror[i].copy() for i in who}, per * len(who)

    def screen(self, k: int, rep, mode: str, S_hat: Stats | None, exact_rebuild: bool,
               what: str | None = None):
        """``(accepted, reasons)``: a mask over the reply's rows and ``{row: reason}`` of the
        refused ones (the per-client path's reasons; ``on_invalid="raise"`` raises on the
        first, in client order). The rows are tested in chunks (each chunk's rebuilt
        statistics stay in cache; nothing of the size of the reply is allocated)."""
        rd = self.rd
        Q, n, idx = rep.Q, rep.n, rep.clients
        if self.template is None:
            self.template = rep.template.zeros_like()
        m = self.n_units[idx]
        A = len(n)
        suspect = ~(np.isfinite(n) & np.isfinite(rep.objective))
        if mode in ("full", "spider-refresh"):
            suspect |= n != m
        else:
            suspect |= (n != np.round(n)) | (n < 1) | (n > m)
        rebuilt = self.rebuildable(rep, S_hat) if rd.screen.has_check and exact_rebuild \
            else None
        scale = np.maximum(n, 1.0)
        for lo, hi in _chunks(A):  # one pass over the replies, a chunk of rows at a time
            if Q.shape[1]:
                Qc = Q[lo:hi]
                with np.errstate(invalid="ignore", over="ignore"):
                    suspect[lo:hi] |= ~np.isfinite(Qc).all(axis=1) | (
                        np.abs(Qc).max(axis=1) * scale[lo:hi] > _MAX_SUM)
            if rebuilt is not None:
                r = lo + np.flatnonzero(rebuilt[lo:hi] & ~suspect[lo:hi])
                if r.size:
                    suspect[r[self.check_rows(rep, r, n, S_hat)]] = True
        reasons: dict[int, str] = {}
        self.malformed = 0
        for r in np.flatnonzero(suspect):
            reason, sent = self.judge_one(rep, int(r), mode, rebuilt, S_hat)
            self.malformed += sent == "an invalid reply"
            if reason:
                reasons[int(r)] = reason
                if rd.fed.on_invalid == "raise":
                    from .loop import FederatedFitError

                    raise FederatedFitError(
                        f"round {k}: client {self.ids[idx[r]]!r} sent {what or sent}: {reason}"
                        f"; stopped (on_invalid='raise'), kept the parameters of round {k - 1}",
                        rd.params, k)
        accepted = np.ones(len(n), dtype=bool)
        accepted[list(reasons)] = False
        return accepted, reasons

    def gather(self, k, msg, init_round, gamma, p, alpha, raw_bytes, quant_bytes):
        """Round ``k`` for the clients drawn (the per-client path's draw), all at once."""
        from .loop import Gathered, logger
        from .messages import fault_detail, message_nbytes
        from .model import server_rng

        rd = self.rd
        n = len(self.ids)
        if init_round or p >= 1.0:
            idx = np.arange(n)
        else:
            idx = np.flatnonzero(server_rng(int(rd.opt.seed), k).random(n) < p)
        resets, reset_bytes = self.resets(idx)
        bytes_down = message_nbytes(msg) * idx.size + reset_bytes
        mode = str(msg.get("mode", "full"))
        if idx.size == 0:
            state = rd.state.after_round_flat(np.zeros((0, 0)), np.zeros(0), gamma, p, alpha)
            return Gathered(state, [], {}, {}, 0.0, 0, 0, bytes_down, 0, lambda S: None, True)
        rep = self.rt.call_batched("estep", idx, msg, resets)
        exact = rd.screen.exact and mode != "spider"
        accepted, reasons = self.screen(k, rep, mode, rd.state.S_hat, exact)
        rejected = {self.ids[idx[r]]: why for r, why in reasons.items()}
        if rejected:
            logger.warning("round %d: left out %s", k, fault_detail(rejected))
        parsed = idx.size - self.malformed
        bytes_up = (raw_bytes if init_round else quant_bytes) * parsed
        total = weighted_rows(rep.Q, self.w[idx], accepted)  # sum_c w_c Q_c, (1, F) or (0, F)
        obj = rep.objective[accepted]
        obj_sum = float(np.cumsum(obj)[-1]) if obj.size else 0.0  # client order, as summed one
        # by one
        obj_n = int(rep.n[accepted].sum())
        if init_round:
            rd.refuse_incomplete_init(k, rejected)
            state = rd.state.after_init_flat(total, np.ones(len(total)), rep.template,
                                             rd.use_cv)
        else:
            state = rd.state.after_round_flat(total, np.ones(len(total)), gamma, p, alpha)

        def after(S_hat_new):
            self.after_round(init_round, rep, accepted, S_hat_new, alpha)

        def dominant():
            from .update import dominant_client

            rows = np.flatnonzero(accepted)
            return dominant_client([self.ids[i] for i in idx[rows]], rep.Q[rows],
                                   self.w[idx[rows]])

        return Gathered(state, [], rejected, {}, obj_sum, obj_n, int(accepted.sum()),
                        bytes_down, bytes_up, after, True, dominant=dominant)

    def rebuildable(self, rep, S_hat: Stats | None) -> np.ndarray:
        """Which rows' statistics ``S_c`` the server can rebuild (with control variates, those
        of the clients whose ``V_c`` it follows)."""
        if S_hat is None or not self.rd.screen.use_cv:
            return np.ones(len(rep.n), dtype=bool)
        if self.mirror is None:
            return np.zeros(len(rep.n), dtype=bool)
        return self.known[rep.clients].copy()

    def rebuild_rows(self, rep, rows: np.ndarray, S_hat: Stats | None) -> np.ndarray:
        """``S_c = Q_c + S_hat + V_c`` of some rows (A_r, F), added in the per-client path's
        order."""
        rows = _as_slice(rows)
        if S_hat is None:
            return rep.Q[rows]  # a view when the rows are consecutive: read only
        S_c = rep.Q[rows] + S_hat.flatten()[None, :]
        if self.rd.screen.use_cv:
            S_c += self.mirror[rep.clients[rows]]
        return S_c

    def slack(self, rep, r: int, S_hat: Stats | None) -> np.ndarray | None:
        """The rounding bound of row ``r``'s rebuilt statistic (None: sent as is)."""
        if S_hat is None:
            return None
        mag = np.abs(rep.Q[r]) + np.abs(S_hat.flatten())
        if self.rd.screen.use_cv:
            mag = mag + np.abs(self.mirror[rep.clients[r]])
        return _REBUILD_EPS * mag

    def check_rows(self, rep, rows: np.ndarray, n, S_hat) -> np.ndarray:
        """Which of ``rows`` (indices into the reply) may break the model's invariants (a
        mask over them: the model's ``check_many`` superset, or its ``check`` one by one)."""
        model = self.rd.model
        nn = n[rows]
        flat = self.rebuild_rows(rep, rows, S_hat) * nn[:, None]
        if S_hat is not None:
            who_all = rep.clients[rows]
            s_abs = np.abs(S_hat.flatten())[None, :]

            def sl_rows(r):  # the slack of some of these rows, computed when asked
                out = np.abs(rep.Q[rows[r]]) + s_abs
                if self.rd.screen.use_cv:
                    out += np.abs(self.mirror[who_all[r]])
                out *= (_REBUILD_EPS * (1.0 - 1e-9) * nn[r])[:, None]  # a hair under
                return out
        many = getattr(model, "check_many", None)
        tmpl = rep.template
        with np.errstate(over="ignore", invalid="ignore"):
            if many is not None:
                lazy = None if S_hat is None else (lambda r: _blocks(tmpl, sl_rows(r)))
                return np.asarray(many(_blocks(tmpl, flat), nn, lazy), dtype=bool)
            return np.array([model.check(tmpl.unflatten(flat[i]), nn[i], None if S_hat is None
                                         else tmpl.unflatten(sl_rows(np.array([i]))[0]))
                             is not None for i in range(flat.shape[0])], dtype=bool)

    def judge_one(self, rep, r: int, mode: str, rebuilt, S_hat):
        """The per-client path's reason for row ``r`` (None: acceptable) and what it sent;
        ``rebuilt`` (None: no check of the statistics) says which rows can be rebuilt."""
        rd = self.rd
        c = self.ids[rep.clients[r]]
        reply = {**pack("delta", rep.stats(r).to_dict()), "n": rep.n[r],
                 "objective": rep.objective[r]}
        try:
            Q = check_reply(c, reply, rd.model.stat_shapes(rd.params) if rd.params else
                            rep.template.shapes)
        except ClientReplyError as err:
            return err.reason, "an invalid reply"
        sent = "statistics that cannot be true"
        reason = rd.screen.units_problem(c, reply["n"], mode)
        if reason:
            return reason, sent
        nf = float(reply["n"])
        for key, v in Q.items():
            bigv = float(np.max(np.abs(v))) if v.size else 0.0
            if bigv * max(nf, 1.0) > _MAX_SUM:
                return f"statistic {key!r} reaches {bigv:.3g} per unit, beyond any sum of data", \
                    sent
        if rebuilt is None or not rd.screen.has_check or not rebuilt[r]:
            return None, sent
        slack = self.slack(rep, r, S_hat)
        tmpl = rep.template
        S_c = self.rebuild_rows(rep, np.array([r]), S_hat)[0]
        with np.errstate(over="ignore", invalid="ignore"):
            reason = rd.model.check(tmpl.unflatten(S_c) * nf, nf,
                                    None if slack is None else tmpl.unflatten(slack) * nf)
        return reason, sent

    def after_round(self, init_round: bool, rep, accepted: np.ndarray, S_hat_new: Stats,
                    alpha: float) -> None:
        """The mirror ``V_c`` (see ReplyScreen.after_round), for all clients at once."""
        scr = self.rd.screen
        if not (scr.use_cv and scr.exact):
            return
        idx = rep.clients
        if init_round:
            if self.mirror is None:
                self.mirror = np.zeros((len(self.ids), rep.Q.shape[1]))
            self.known[:] = False
            self.mirror[idx] = rep.Q - S_hat_new.flatten()[None, :]
            self.known[idx] = True
            self.resync[:] = False
            return
        if self.mirror is None:
            return
        refused = idx[~accepted]
        self.resync[refused[self.known[refused]]] = True
        ok = idx[accepted]
        self.resync[ok] = False
        step = rep.Q if alpha == 1.0 else alpha * rep.Q
        if ok.size == len(self.ids) and self.known.all():  # everyone: in place
            self.mirror += step
            return
        upd = ok[self.known[ok]]
        self.mirror[upd] = self.mirror[upd] + step[accepted][self.known[ok]]

    def h_norm2(self, k: int, params, S_hat: Stats, rejected: dict[str, str]):
        """``||mean_c S_c(params) - S_hat||^2`` from one batched evaluation (see
        ``_Rounds.h_norm2``); ``rejected`` gets the refused evaluations."""
        rd = self.rd
        msg = {"seed": int(rd.opt.seed), "round": k, **pack("params", params)}
        idx = np.arange(len(self.ids))
        rep = self.rt.call_batched("evaluate", idx, msg)
        accepted, reasons = self.screen(k, rep, "full", None, True,
                                        "an evaluation that cannot be true")
        rejected = dict(rejected)
        for r, reason in reasons.items():
            c = self.ids[idx[r]]
            rejected[c] = "; ".join(filter(None, (rejected.get(c), f"evaluate: {reason}")))
        w = self.w[idx][accepted]
        total = float(w.sum())
        if total <= 0.0:
            return float("nan"), rejected
        mean = S_hat.unflatten(weighted_rows(rep.Q, self.w[idx], accepted)[0])
        if not accepted.all():
            mean = mean * (1.0 / total)
        return (mean - S_hat).squared_norm(), rejected


def weighted_rows(Q: np.ndarray, w: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``sum_c w_c Q_c`` over the rows in ``mask``, as one row (1, F) (none: (0, F)).

    The products are added row after row in client order, as the per-client path adds them
    (``update._weighted_sum``: a reduction over the leading axis accumulates row after row),
    so the sum has the same bits; a chunk at a time, the running sum carried as the first row
    of the next chunk's buffer, so no array of the size of ``Q`` is made.
    """
    rows = np.flatnonzero(mask)
    F = Q.shape[1]
    if rows.size == 0:
        return np.zeros((0, F))
    every = rows.size == len(w)
    buf = np.empty((min(rows.size, _CHUNK) + 1, F))
    acc = None
    for lo, hi in _chunks(rows.size):
        Qc, wc = (Q[lo:hi], w[lo:hi]) if every else (Q[rows[lo:hi]], w[rows[lo:hi]])
        if acc is None:
            np.multiply(Qc, wc[:, None], out=buf[1:hi - lo + 1])
            acc = np.add.reduce(buf[1:hi - lo + 1], axis=0)
        else:
            buf[0] = acc
            np.multiply(Qc, wc[:, None], out=buf[1:hi - lo + 1])
            acc = np.add.reduce(buf[:hi - lo + 1], axis=0)
    return acc[None, :]


def _chunks(n: int):
    """``(lo, hi)`` bounds of consecutive chunks of ``range(n)`` (``_CHUNK`` long)."""
    return ((lo, min(lo + _CHUNK, n)) for lo in range(0, n, _CHUNK))


def _blocks(template: Stats, flat: np.ndarray) -> dict[str, np.ndarray]:
    out, lo = {}, 0
    for key, v in template.items():
        out[key] = flat[:, lo:lo + v.size].reshape(flat.shape[0], *v.shape)
        lo += v.size
    return out
