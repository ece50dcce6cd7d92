"""One gather interface, interchangeable collectors.

A collector asks the round's clients for their step and returns an :class:`Aggregate`; the
loop never asks which collector it has. :class:`OneByOne` calls the clients one by one (any
runtime); :class:`Batched` computes every drawn client's step at once (the in-process runtime,
for models with a batched step); the secure collector
(:class:`fedlatent.engine.rounds.secure_round.SecureCollector`) gets only the round's sum. The first
two turn the replies into rows (:class:`Stacked`) and share everything after: the screen, the
weighted sum, the record (:func:`aggregate_rows`).
"""

from __future__ import annotations

import logging
from typing import Protocol

import numpy as np

from fedlatent.data.validation import name_list
from fedlatent.engine.faults import FederatedFitError
from fedlatent.engine.node.batched import BatchReply
from fedlatent.engine.protocol.messages import (
    ERROR_KEY,
    ClientReplyError,
    check_reply,
    fault_detail,
    message_nbytes,
    point_keys,
)
from fedlatent.engine.rounds.aggregate import Accepted, Aggregate, Stacked
from fedlatent.engine.rounds.batched_round import weighted_rows
from fedlatent.engine.rounds.plan import RoundPlan
from fedlatent.engine.rounds.screen import INVALID
from fedlatent.engine.stats import Stats, units_number

__all__ = ["Batched", "Collector", "OneByOne", "aggregate_rows", "point_bytes",
           "refuse_incomplete_init", "screen_points", "stack_replies"]

logger = logging.getLogger("fedlatent.engine.rounds.loop")


class Collector(Protocol):
    """What the loop asks of a collector (``rd``: the loop's state between rounds)."""

    def gather(self, plan: RoundPlan) -> Aggregate:
        """The round's replies, screened and summed."""

    def evaluate(self, msg: dict) -> Stacked:
        """Every client's mean statistic at the message's parameters (for ``||h||^2``)."""

    def init_control_variates(self, msg: dict) -> int:
        """Tell every client ``S_hat_0`` (its ``V_c = S_c0 - S_hat_0``); returns bytes sent."""


def _flat(q: Stats, order: list[str]) -> np.ndarray:
    return np.concatenate([np.ravel(q[k]) for k in order]) if order else np.zeros(0)


def _point_blocks(c: str, rep: dict, shapes, m: int, order: list[str]):
    """A multi-point reply's ``m`` points, each ``(row, objective)`` checked as
    :func:`~fedlatent.engine.protocol.messages.check_reply` checks the round's statistic;
    ClientReplyError naming the first point that is not well formed."""
    out = []
    for j in range(1, m + 1):
        prefix, obj = point_keys(j)
        try:
            q = check_reply(c, rep, shapes, prefix=prefix, scalars=(obj,))
        except ClientReplyError as err:
            raise ClientReplyError(c, f"extra point {j}: {err.reason}") from err
        out.append((_flat(q, order), float(rep[obj])))
    return out


def stack_replies(ids: list[str], idx: np.ndarray, replies: dict, shapes,
                  template: Stats | None, points: int = 0) -> Stacked:
    """The replies of the clients at ``idx`` as rows: the well-formed ones (checked by
    :func:`~fedlatent.engine.protocol.messages.check_reply`) in client order, flattened in the block
    order of ``template`` (None: of ``shapes``); with ``points`` extra points, a reply is well
    formed when each point's blocks are too (the rows' ``points``)."""
    out = Stacked(None)
    pos, Q, n, obj = [], [], [], []
    extra: list[list] = []
    order = list(template) if template is not None else list(shapes)
    for i in idx:
        c = ids[i]
        rep = replies.get(c)
        if rep is None:
            out.missing.append(c)
            continue
        if ERROR_KEY in rep:
            out.errors[c] = str(rep[ERROR_KEY])
            out.missing.append(c)
            continue
        try:
            q = check_reply(c, rep, shapes)
            more = _point_blocks(c, rep, shapes, points, order) if points else []
        except ClientReplyError as err:
            out.malformed[int(i)] = err.reason
            continue
        pos.append(int(i))
        Q.append(_flat(q, order))
        n.append(float(rep["n"]))
        obj.append(float(rep["objective"]))
        extra.append(more)
    if pos:
        tmpl = Stats({k: np.zeros(shapes[k]) for k in order}, copy=False)
        rows = (lambda a: np.array(a, dtype=np.float64).reshape(len(pos), -1))
        pts = tuple((rows([e[j][0] for e in extra]), np.array([e[j][1] for e in extra]))
                    for j in range(points))
        out.rows = BatchReply(np.array(pos), rows(Q), np.array(n), np.array(obj), tmpl, pts)
    return out


def refuse_incomplete_init(rd, k: int, why: dict[str, str]) -> None:
    """Stop the fit when a client did not answer the initialization round validly."""
    if why:
        raise FederatedFitError(
            f"clients [{name_list(why)}] did not answer the initialization round validly "
            f"(every client must): {fault_detail(why)}", rd.params, k, faults=why)


def refusals(rd, k: int, st: Stacked, reasons: dict[int, tuple[str, str]],
             what: str | None = None) -> dict[str, str]:
    """Client -> why its reply is refused (malformed or untrue), in client order; with
    ``on_invalid="raise"`` the first one stops the run, naming the client and the round."""
    rows = st.rows
    by_pos = {p: (why, "an invalid reply") for p, why in st.malformed.items()}
    by_pos.update({int(rows.clients[r]): v for r, v in reasons.items()})
    ordered = sorted(by_pos)
    if ordered and rd.fed.on_invalid == "raise":
        p = ordered[0]
        reason, sent = by_pos[p]
        raise FederatedFitError(
            f"round {k}: client {rd.cids[p]!r} sent {what or sent}: {reason}"
            f"; stopped (on_invalid='raise'), kept the parameters of round {k - 1}",
            rd.params, k)
    return {rd.cids[p]: by_pos[p][0] for p in ordered}


def screen_points(rd, rows: BatchReply, accepted: np.ndarray,
                  reasons: dict[int, tuple[str, str]]) -> int:
    """A multi-point round: each point's rows screened as raw statistics (the screen of the
    initialization round's: counts in ``[0, n]``, moments positive semi-definite...); a
    client refused whole when its round statistic or any point fails (the first failure
    named). Updates ``accepted`` and ``reasons`` in place; returns the replies that were not
    well formed (their primary or a point)."""
    for j, (Qj, obj) in enumerate(rows.points, 1):
        ok, why = rd.screen.screen(BatchReply(rows.clients, Qj, rows.n, obj, rows.template),
                                   "full", None, None)
        for r, (reason, sent) in why.items():
            reasons.setdefault(r, (f"extra point {j}: {reason}", sent))
        accepted &= ok
    return sum(sent == INVALID for _, sent in reasons.values())


def _point_sums(rd, rows: BatchReply, accepted: np.ndarray) -> list[tuple[Stats, float]]:
    """``(sum_c w_c S_c(T(x_j)), sum of objectives)`` of each extra point over the accepted
    rows, in the order ``total`` is summed."""
    w = rd.w[rows.clients]
    return [(rows.template.unflatten(weighted_rows(Qj, w, accepted)[0]),
             float(np.cumsum(obj[accepted])[-1])) for Qj, obj in rows.points]


def aggregate_rows(rd, plan: RoundPlan, st: Stacked, bytes_down: int) -> Aggregate:
    """The round's :class:`Aggregate` from its stacked replies: screened, refusals recorded
    (and logged), the accepted rows summed ``sum_c w_c Q_c`` in client order (and each extra
    point's mean statistics over the same rows, :attr:`Aggregate.points`)."""
    k, rows = plan.k, st.rows
    accepted, reasons = (np.zeros(0, dtype=bool), {}) if rows is None else \
        rd.screen.screen(rows, plan.mode, rd.state.S_hat, rd.mirror, rd.w[rows.clients])
    malformed, fused = rd.screen.malformed, rd.screen.total  # (the sum, if read with the rows)
    if rows is not None and rows.points:
        malformed = screen_points(rd, rows, accepted, reasons)
    rejected = refusals(rd, k, st, reasons)
    if st.missing:
        logger.warning("round %d: %d client(s) [%s] did not answer; treated as absent%s", k,
                       len(st.missing), name_list(st.missing),
                       f"; {fault_detail(st.errors)}" if st.errors else "")
    if rejected:
        logger.warning("round %d: left out %s", k, fault_detail(rejected))
    if plan.init_round:
        refuse_incomplete_init(rd, k, {**{c: st.errors.get(c, "no reply") for c in st.missing},
                                       **rejected})
    pos = rd.mirror.pos
    refused = np.array([pos[c] for c in rejected], dtype=np.int64)
    absent = np.array([pos[c] for c in st.missing if c not in st.errors], dtype=np.int64)
    acc = Accepted(rows, accepted, refused, absent, rd.cids, rd.w)
    if rows is None:
        return Aggregate(None, 0, 0.0, 0, bytes_down, 0, st.missing, rejected, st.errors,
                         accepted=acc)
    parsed = len(rows.n) - malformed
    total = fused if fused is not None and accepted.all() else \
        weighted_rows(rows.Q, rd.w[rows.clients], accepted)
    obj = rows.objective[accepted]
    return Aggregate(
        rows.template.unflatten(total[0]) if len(total) else None, int(accepted.sum()),
        float(np.cumsum(obj)[-1]) if obj.size else 0.0,  # client order, as summed one by one
        units_number(rows.n[accepted].sum()), bytes_down,
        (plan.reply_bytes + len(rows.points) * point_bytes(plan.shapes)) * parsed, st.missing,
        rejected, st.errors, accepted=acc,
        points=_point_sums(rd, rows, accepted) if rows.points and obj.size else [])


def point_bytes(shapes) -> int:
    """Bytes one extra point adds to a reply: its statistic uncompressed and its objective."""
    return int(sum(8 * int(np.prod(s)) for s in shapes.values())) + 8


class OneByOne:
    """The collector that calls the round's clients one by one, through any runtime."""

    def __init__(self, rd):
        self.rd = rd

    def gather(self, plan: RoundPlan) -> Aggregate:
        rd = self.rd
        active = [rd.cids[i] for i in plan.idx]
        msgs = {c: plan.msg for c in active}
        bytes_down = message_nbytes(plan.msg) * len(active)
        # a client whose last reply was refused goes back to its mirrored V_c
        for i in rd.mirror.resets(plan.idx):
            reset = rd.mirror.reset_blocks(i)
            msgs[rd.cids[i]] = {**plan.msg, **reset}
            bytes_down += message_nbytes(reset)
        replies = rd.runtime.call(active, "estep", msgs) if active else {}
        st = stack_replies(rd.cids, plan.idx, replies, plan.shapes, rd.mirror.template,
                           len(plan.points))
        return aggregate_rows(rd, plan, st, bytes_down)

    def evaluate(self, msg: dict) -> Stacked:
        rd = self.rd
        replies = rd.runtime.broadcast(rd.cids, "evaluate", msg)
        return stack_replies(rd.cids, np.arange(len(rd.cids)), replies, rd.shapes,
                             rd.mirror.template)

    def init_control_variates(self, msg: dict) -> int:
        self.rd.runtime.broadcast(self.rd.cids, "cv_init", msg)
        return message_nbytes(msg) * len(self.rd.cids)


class Batched(OneByOne):
    """The collector that computes every drawn client's step at once (the in-process
    runtime's batched client step); its replies are rows from the start. Raises
    NotImplementedError when the model has no batched step for these settings."""

    def gather(self, plan: RoundPlan) -> Aggregate:
        rd = self.rd
        idx = plan.idx
        resets = rd.mirror.resets(idx)
        bytes_down = message_nbytes(plan.msg) * idx.size + rd.mirror.reset_bytes(len(resets))
        if idx.size == 0:
            return aggregate_rows(rd, plan, Stacked(None), bytes_down)
        rep = rd.runtime.call_batched("estep", idx, plan.msg, resets)
        return aggregate_rows(rd, plan, Stacked(rep), bytes_down)

    def evaluate(self, msg: dict) -> Stacked:
        rd = self.rd
        return Stacked(rd.runtime.call_batched("evaluate", np.arange(len(rd.cids)), msg))

    def init_control_variates(self, msg: dict) -> int:
        rd = self.rd
        rd.runtime.call_batched("cv_init", np.arange(len(rd.cids)), msg)
        return message_nbytes(msg) * len(rd.cids)

