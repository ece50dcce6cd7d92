"""Liars under secure aggregation: every aggregate checked, a failing one never applied, the liar
located by group testing.

The server sees only sums. It still knows what every sum must mean, so each round's aggregate
is checked (:func:`aggregate_problem`): each decoded entry within the range honest encodings can
reach (``bound`` times the survivors; a ring element shifted by 2^62 decodes far beyond it and
is reported as a malformed masked reply, never as a statistic), the units it claims (full
passes), and the model's invariants (counts, PSD moments, ...) on the statistic rebuilt from
the sum: ``sum_c w_c S_c = sum_c w_c Q_c + W S_hat (+ V)`` (exact without a quantizer; with
control variates only when every client of the run answered, ``V`` being the sum of all
``V_c``), with the fixed point's rounding as slack (with control variates also the rounding
``V`` gathered since the initialization round: it follows the decoded sums).

A failing aggregate is discarded: the round is recorded (``history_``: ``skipped``), the last
good state kept, and the clients told to undo the round's control-variate update
(``secagg/undo``); a client also undoes a round at or after the one it is asked (a fit
stopped in it and resumed from its checkpoint), its model state too. Each client keeps its
last round in its state (``secure_last/``), which outlives a node rebuilt for each message.
The server then locates the liar by group testing: the round's survivors
re-send their cached reply of the round (``secagg/replay``; with control variates as
``Q_c + V_c``, the statistic minus ``S_hat``, rebuildable for any cohort) in secure sums over
sub-cohorts of at least the threshold, leaving out a block of the remaining candidates each
time (a binary search: about log2(n) + 1 exchanges); a client is named only when a last
cohort holding it and clients of passing cohorts fails again, so a lie that does not reproduce
names no one. The named client is excluded for the rest of the fit (in the initialization
round, which needs every client, the fit stops naming it). In a verified fit each test's
messages carry the failing round's transcript, a site answers only a failure it checked itself
(:mod:`fedlatent.engine.node.verify_groups`), and the search starts with a test over every
survivor (:func:`_first_test`: each confirms the transcript before any sub-cohort is summed),
then at most :func:`group_test_limit` more. The search has
:data:`CHECK_SLOTS` exchanges per fit (reserved at set-up, apart from the rounds'); when no
client can be named the round is still discarded, and :data:`UNEXPLAINED_STOP` such rounds in
a row stop the fit.

What group testing reveals: the difference of two tested sums is the sum over the block left
out, a sum of fewer clients than the threshold (the threshold is above half the clients, so
any two cohorts overlap). The search runs only after a failing aggregate and only over blocks
whose records pass the disclosure count rule (:func:`~fedlatent.engine.privacy.disclosure.
check_aggregate`); it reveals at most what a fit without secure aggregation shows of every
reply. A liar that stays inside every invariant cannot be caught by them: it can move
``S_hat`` by its weight ``w_c`` times the distance between its statistic and any valid one
within the encoding's bound (see the tests' figure).
"""

from __future__ import annotations

import json
import logging
import math

import numpy as np

from fedlatent.data.validation import name_list
from fedlatent.engine.protocol.messages import (
    ERROR_KEY,
    ClientReplyError,
    check_reply,
    point_keys,
    statistic_field,
)
from fedlatent.engine.stats import Stats

__all__ = ["CHECK_SLOTS", "aggregate_problem", "answer_secure", "group_test_limit", "locate",
           "point_sums", "rebuild", "ring_problem", "v_drift", "with_undo"]

logger = logging.getLogger("fedlatent.engine.rounds.secure_round")

#: secure exchanges reserved per fit for group testing (one search over 2^7 clients)
CHECK_SLOTS = 8
#: discarded rounds in a row, none explained by a named client, that stop the fit
UNEXPLAINED_STOP = 3
_REPLAY, _UNDO = "secagg/replay", "secagg/undo"


# ---- the client side ------------------------------------------------------------------------
#: where a client keeps its last secure round in its state (so that it survives a node rebuilt
#: for each message, as on Flower, and an in-process checkpoint): the round, the reply, the
#: state the round started from
_LAST = "secure_last/"
#: the state a round changes: the control variate; the model's own state (FedGMM's pi_c, HLCR's
#: labels), restored only for a round the fit stopped in (a discarded round's next round
#: takes the model state on, as an accelerated fit's adopted point is in it)
_UNDONE = ("V/", "model/")


def _state(node, prefixes: tuple[str, ...] = _UNDONE) -> dict[str, np.ndarray]:
    return {k: np.array(v, copy=True) for k, v in node.state.items() if k.startswith(prefixes)}


def _restore(node, before: dict, prefixes: tuple[str, ...]) -> None:
    """The state under ``prefixes`` back to ``before``'s."""
    for k in [k for k in node.state if k.startswith(prefixes)]:
        del node.state[k]
    node.state.update({k: v for k, v in before.items() if k.startswith(prefixes)})


def _cv(state: dict) -> dict[str, np.ndarray]:
    return {k[2:]: v for k, v in state.items() if k.startswith("V/")}


def _remembered_round(node) -> int | None:
    """The round of the client's last secure E-step (None: none)."""
    got = node.state.get(_LAST + "round")
    return None if got is None else int(np.ravel(got)[0])  # (a record's shape: (1,))


def _remembered(node) -> tuple[int, dict, dict] | None:
    """``(round, reply, state before it)`` of the client's last secure E-step (None: none)."""
    st, rnd = node.state, _remembered_round(node)
    if rnd is None:
        return None
    reply = {k[len(_LAST) + 6:]: (v[()] if v.ndim == 0 else v) for k, v in st.items()
             if k.startswith(_LAST + "reply/")}
    before = {k[len(_LAST):]: v for k, v in st.items() if k.startswith(_LAST) and
              k[len(_LAST):].startswith(_UNDONE)}
    return rnd, reply, before


def _remember(node, rnd: int | None, reply: dict | None = None,
              before: dict | None = None) -> None:
    """Keep round ``rnd``'s reply and the state it started from (None: forget them)."""
    for k in [k for k in node.state if k.startswith(_LAST)]:
        del node.state[k]
    if rnd is None:
        return
    node.state[_LAST + "round"] = np.array(rnd, dtype=np.int64)
    node.state.update({_LAST + "reply/" + k: np.array(v, copy=True) for k, v in reply.items()
                       if not isinstance(v, str)})
    node.state.update({_LAST + k: v for k, v in before.items()})


def answer_secure(node, method: str, msg: dict) -> dict:
    """A client's answer under secure aggregation (masked by the caller): the E-step as
    without it, remembered with the control variate it started from; the remembered reply of
    the round when the server asks for a replay (group testing). The updates of a round the
    server never applied are undone first: of the control variate for a round it discarded
    (``secagg/undo``), of the control variate and the model state for a round at or after
    the one it now asks (the fit stopped in it and was resumed from the round before)."""
    if method != "estep":
        return node._answer(method, msg)
    held = _remembered_round(node)  # the whole record read only when it is used
    undo = json.loads(msg[_UNDO]) if _UNDO in msg else ()
    rnd = int(msg["round"])
    stopped = held is not None and _REPLAY not in msg and rnd > 1 and held >= rnd
    if held is not None and (stopped or held in undo):
        _restore(node, _remembered(node)[2], _UNDONE if stopped else ("V/",))
        _remember(node, None)
        held = None
    if _REPLAY in msg:
        if held is None or held != rnd:
            raise ValueError(f"client {node.client_id!r}: asked to replay round {rnd}, whose "
                             "reply it does not hold")
        last = _remembered(node)
        reply = dict(last[1])
        for k, v in _cv(last[2]).items():  # Q_c + V_c: the statistic minus S_hat
            reply["delta/" + k] = reply["delta/" + k] + v
        return reply
    before = _state(node)
    reply = node._answer(method, msg)
    if ERROR_KEY not in reply:
        _remember(node, rnd, reply, before)
    return reply


def with_undo(channel, msg: dict) -> dict:
    """The round message with the rounds discarded so far (their updates are undone)."""
    gone = sorted(getattr(channel, "discarded", ()))
    return {**msg, _UNDO: json.dumps(gone)} if gone else msg


# ---- the server side ------------------------------------------------------------------------
def ring_problem(sums: dict, survivors: list[str], bound: float) -> str | None:
    """Why a decoded sum cannot come from honest encodings (None: it can): an entry of a
    weighted statistic beyond ``bound`` times the survivors."""
    cap = float(bound) * len(survivors) * (1 + 1e-9)
    for k in sorted(sums):
        if not statistic_field(k):
            continue
        v = np.abs(np.asarray(sums[k], dtype=np.float64)).ravel()
        bad = np.flatnonzero(~(v <= cap))
        if bad.size:
            return (f"field {k!r} decodes to {v[bad[0]]:.6g} at index {int(bad[0])}, beyond "
                    f"what {len(survivors)} honest encodings can reach ({cap:.6g}): a ring "
                    "element out of range, i.e. a malformed masked reply (e.g. shifted by "
                    "2^62), not a sum of statistics")
    return None


def v_drift(n_clients: int, scale: float, alpha: float, k: int) -> float:
    """How far the server's ``V`` may be from ``sum_c w_c V_c`` as the clients hold it, per
    entry, in round ``k`` of ``n_clients`` clients: ``V`` follows the decoded sums, each within
    ``n / (2 scale)`` of the clients' ``sum_c w_c Q_c``, so it carries the initialization
    round's rounding (``S_hat_0``, from which every ``V_c`` starts) and ``alpha`` times that
    of every round since."""
    n = n_clients / (2 * scale)
    return n * (1.0 + abs(alpha) * max(k - 2, 0))


def _v_drift(rounds, plan) -> float:
    """:func:`v_drift` of round ``plan.k`` of the fit."""
    return v_drift(len(rounds.cids), rounds.secure.config.encoding.scale, plan.alpha, plan.k)


def rebuild(Q: Stats, S_hat: Stats | None, V: Stats | None, W: float, units: float,
            half: float) -> tuple[Stats, float, Stats]:
    """``(statistic, units, slack)``: the sum statistic over ``units`` rebuilt from an
    aggregate's ``Q = sum_c w_c Q_c`` (its clients' weights summing to ``W``) as
    ``Q + W S_hat (+ V)``, times ``units / W``, and the bound on each entry's error: the
    fixed point's rounding ``half`` (per entry, before the scaling) and 64 ulps of each
    term. The server's check of an aggregate (:func:`aggregate_problem`) and a verifying
    site's of a claimed failure (:mod:`fedlatent.engine.node.verify_groups`) both use it."""
    total = Q.copy()
    mag = Stats({k: np.abs(v) for k, v in Q.items()}, copy=False)
    if S_hat is not None:
        total = total + S_hat * W
        mag = mag + Stats({k: np.abs(v) for k, v in S_hat.items()}, copy=False) * W
    if V is not None:
        total = total + V
        mag = mag + Stats({k: np.abs(v) for k, v in V.items()}, copy=False)
    f = units / W
    slack = Stats({k: (64 * np.finfo(np.float64).eps * v + half) * f
                   for k, v in mag.items()}, copy=False)
    return total * f, units, slack


def _rebuilt(rounds, plan, Q: Stats, S: list[str], replay: bool):
    """``(total, units, slack)``: the sum statistic of the clients ``S`` over their units, and
    its rounding bound (:func:`rebuild`); None when the aggregate cannot be rebuilt into one."""
    fed = rounds.fed
    if fed.quantizer is not None or plan.mode != "full" or not rounds.screen.has_check:
        return None
    W = float(sum(rounds.weights[c] for c in S))
    units = float(sum(rounds.screen.n_units[c] for c in S))
    S_hat, V = rounds.state.S_hat, rounds.state.V
    with_v = rounds.use_cv and not replay and not plan.init_round
    if with_v and (len(S) != len(rounds.cids) or V is None):
        return None
    enc = rounds.secure.config.encoding
    half = len(S) / (2 * enc.scale)
    if with_v:
        half += _v_drift(rounds, plan)
    total, units, slack = rebuild(Q, None if plan.init_round else S_hat,
                                  V if with_v else None, W, units, half)
    noise = rounds.screen.dp_slack(total, len(S))
    return total, units, (slack if noise is None else slack + noise)


def aggregate_problem(rounds, plan, S: list[str], sums: dict, *, replay: bool = False
                      ) -> tuple[Stats | None, str | None]:
    """``(Q, reason)``: the round's checked sum over the survivors ``S`` and why it cannot be
    true (None: it can): shapes and finite values, the ring's range, the units it claims (full
    passes), the model's invariants on the rebuilt statistic."""
    who = f"the aggregate of clients [{name_list(S)}]"
    try:
        Q = check_reply(who, {**sums, "n": 0.0, "objective": 0.0}, plan.shapes)
    except ClientReplyError as err:
        return None, f"is not valid ({err.reason})"
    ring = ring_problem(sums, S, rounds.secure.config.encoding.bound)
    if ring:
        return None, ring
    n_sum = float(sums["n"])
    units = float(sum(rounds.screen.n_units[c] for c in S))
    if plan.mode in ("full", "spider-refresh") and abs(n_sum - units) > \
            rounds.secure.units_slack(len(S)):
        return None, f"claims {n_sum:.6g} units, its clients set up {units:g}"
    got = _rebuilt(rounds, plan, Q, S, replay)
    if got is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            why = rounds.model.check(*got)
        if why:
            return None, f"breaks the model's invariants: {why}"
    why = _points_problem(rounds, plan, S, sums, who) if plan.points else None
    return (None, why) if why else (Q, None)


def point_sums(plan, sums: dict, who: str) -> list[tuple[Stats, float]]:
    """A multi-point round's aggregate: each extra point's ``(sum_c w_c S_c(T(x_j)), sum of
    objectives)``, checked for shapes and finite values (ClientReplyError naming the point)."""
    out = []
    for j in range(1, len(plan.points) + 1):
        prefix, obj = point_keys(j)
        try:
            P = check_reply(who, sums, plan.shapes, prefix, scalars=(obj,))
        except ClientReplyError as err:
            raise ClientReplyError(who, f"extra point {j}: {err.reason}") from err
        out.append((P, float(sums[obj])))
    return out


def _points_problem(rounds, plan, S: list[str], sums: dict, who: str) -> str | None:
    """Why the extra points' sums cannot be true (None: they can): shapes, finite values, and
    the model's invariants of each point's statistic (raw means: ``sum_c w_c S_c`` over the
    survivors' units, the fixed point's rounding as slack)."""
    try:
        points = point_sums(plan, sums, who)
    except ClientReplyError as err:
        return f"is not valid ({err.reason})"
    if not rounds.screen.has_check:
        return None
    units = float(sum(rounds.screen.n_units[c] for c in S))
    W = float(sum(rounds.weights[c] for c in S))
    half = len(S) / (2 * rounds.secure.config.encoding.scale)
    return points_problem(rounds.model, [P for P, _ in points], units, W, half)


def points_problem(model, points: list[Stats], units: float, W: float, half: float
                   ) -> str | None:
    """Why an extra point's statistic breaks the model's invariants (None: none does):
    each point's ``sum_c w_c S_c`` (weights summing to ``W``) as a sum over ``units``, the
    fixed point's rounding ``half`` per entry as slack."""
    f = units / W  # weighted means -> sums
    for j, P in enumerate(points, 1):
        slack = Stats({k: (64 * np.finfo(np.float64).eps * np.abs(v) + half) * f
                       for k, v in P.items()}, copy=False)
        with np.errstate(over="ignore", invalid="ignore"):
            why = model.check(P * f, units, slack)
        if why:
            return f"breaks the model's invariants at extra point {j}: {why}"
    return None


def _test(rounds, plan, cohort: list[str], j: int) -> bool | None:
    """Whether the replayed sum of ``cohort`` passes the checks (None: the exchange failed)."""
    from fedlatent.engine.faults import FederatedFitError

    channel = rounds.secure
    channel.checks_used = getattr(channel, "checks_used", 0) + 1
    msg = {**with_undo(channel, plan.msg), _REPLAY: 1}
    try:
        res = rounds.secure.sum("estep", {c: msg for c in cohort}, round=plan.k,
                                exchange=f"estep/check{j}",
                                weights={c: rounds.weights[c] for c in cohort})
    except FederatedFitError as err:
        logger.warning("round %d: group test %d failed (%s)", plan.k, j, err)
        return None
    if res["dropped"]:
        return None
    return aggregate_problem(rounds, plan, res["survivors"], res["sums"], replay=True)[1] is None


def _block_refused(rounds, block: list[str]) -> str | None:
    from fedlatent.engine.privacy.disclosure import check_aggregate, effective

    policy = effective(rounds.fed.disclosure, True)
    units = float(sum(rounds.screen.n_units[c] for c in block))
    return check_aggregate(policy, units, "a group test's block", block)


def group_test_limit(n: int) -> int:
    """The group tests one failing round's search over ``n`` survivors may run: its binary
    search's (at most ``ceil(log2 n) + 1`` above the threshold) and the confirming test. A
    verifying site answers no more (:mod:`fedlatent.engine.node.verify_groups`)."""
    return math.ceil(math.log2(max(int(n), 2))) + 2


def _spent(rounds, j: int = 0, n: int = 0) -> str | None:
    """Why no further group test may run (None: one may): the exchanges reserved at set-up
    are used up, or the ``j`` tests run already are the most a search over ``n`` may run."""
    if getattr(rounds.secure, "checks_used", 0) >= CHECK_SLOTS:
        return f"the {CHECK_SLOTS} group-test exchanges of the fit are used up"
    if j >= group_test_limit(n):
        return f"the {j} group tests a search over {n} survivors may run are used up"
    return None


def locate(rounds, plan, S: list[str]) -> tuple[str | None, str]:
    """Group testing over sub-cohorts of the survivors ``S`` of round ``plan.k`` (see the
    module docstring): ``(liar or None, what the search did)``."""
    t = rounds.secure.config.threshold
    cand, cleared, j = list(S), [], 0
    first = _first_test(rounds, plan, S) if rounds.secure.verify else None
    if first:
        return None, first
    while len(cand) > 1:
        block = cand[:min((len(cand) + 1) // 2, len(S) - t)]
        if not block:
            return None, f"{len(S)} survivors leave no block out above the threshold {t}"
        if _block_refused(rounds, block):
            return None, "a block to leave out holds too few records for the disclosure rule"
        spent = _spent(rounds, j, len(S))
        if spent:
            return None, spent
        j += 1
        ok = _test(rounds, plan, [c for c in S if c not in block], j)
        if ok is None:
            return None, f"group test {j} could not be completed"
        if ok:
            cleared += [c for c in S if c not in block and c not in cleared]
            cand = block
        else:
            cand = [c for c in cand if c not in block]
    suspect = cand[0]
    keep = [c for c in cleared if c != suspect][:max(t - 1, 0)]
    if len(keep) < t - 1:  # only clients of a passing cohort vouch: else no one is named
        return None, f"{j} group tests cleared too few clients to confirm a suspect"
    spent = _spent(rounds, j, len(S))
    if spent:
        return None, spent
    j += 1
    ok = _test(rounds, plan, [suspect, *keep], j)
    if ok is None or ok:
        return None, (f"{j} group tests; the lie did not reproduce (the failing sum was not "
                      "sent again): no client named")
    return suspect, f"located by {j} group tests over sub-cohorts of at least {t} clients"


def _first_test(rounds, plan, S: list[str]) -> str | None:
    """A verified fit's first group test, over every survivor ``S`` (it shows the server
    nothing new: the round's replies summed again): each site confirms in it that it checked
    its own contribution in the round's transcript before any sub-cohort is summed
    (:mod:`fedlatent.engine.node.verify_groups`). Why the search stops there (None: it goes
    on)."""
    spent = _spent(rounds)
    if spent:
        return spent
    ok = _test(rounds, plan, list(S), 0)
    if ok is None:
        return "group test 0, over every survivor, could not be completed: no client named"
    if ok:
        return ("group test 0, over every survivor; the lie did not reproduce (the failing "
                "sum was not sent again): no client named")
    return None


def discard(rounds, plan, S: list[str], why: str):
    """Locate the liar of round ``plan.k``'s failing aggregate and exclude it; the record of
    the discarded round (``Aggregate.skipped``). In the initialization round the fit stops."""
    from fedlatent.engine.faults import FederatedFitError

    k = plan.k
    liar, how = locate(rounds, plan, S)
    head = f"round {k}: the aggregate of clients [{name_list(S)}] {why}"
    if liar is None:
        blame = f"secure aggregation hides which client sent it ({how})"
    elif plan.init_round:
        blame = f"client {liar!r} sent it ({how}); fit again without it"
    else:
        blame = f"client {liar!r} sent it ({how}); excluded from now on"
        rounds.secure.server.excluded[liar] = f"round {k} (its reply broke the checks)"
    if plan.init_round:
        raise FederatedFitError(f"{head}; {blame}; kept the parameters of round {k - 1}",
                                rounds.params, k,
                                faults=None if liar is None else {liar: why})
    channel = rounds.secure
    channel.discarded = getattr(channel, "discarded", set()) | {k}
    if liar is None:
        channel.unexplained = getattr(channel, "unexplained", set()) | {k}
        if all(k - i in channel.unexplained for i in range(UNEXPLAINED_STOP)):
            raise FederatedFitError(
                f"{head}; {blame}; {UNEXPLAINED_STOP} aggregates in a row broke the checks and "
                "no client could be named (a liar whose replies stay inside the invariants "
                "one round at a time, or a corrupted channel): stopped, kept the parameters of "
                f"round {k - UNEXPLAINED_STOP}", rounds.params, k)
    out = f"{head}; {blame}; discarded, the parameters of round {k - 1} kept"
    logger.warning("%s", out)
    return out
