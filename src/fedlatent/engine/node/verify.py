"""Verified rounds at a site: the transcript of the exchange before, checked, and the server's
step replayed before the site computes anything (issue 38).

Under secure aggregation with verification (the setup's ``verify`` field,
:meth:`~fedlatent.engine.fedem.federation.Federation.verifies`), every exchange's message
carries the transcript of the exchange before: the claimed ring sum ``A`` and its carries
``c``, and this site's leaf index and path in the server's sum tree, as bytes
(:func:`fedlatent.engine.secagg.sumtree.read_transcript`). Before it answers, the site
(:func:`check_exchange`):

1. climbs from its own leaf ``z_w`` of the exchange before (kept by its
   :class:`~fedlatent.engine.secagg.client.SecAggClient`) to the root and checks the root's
   projections are those of ``A`` (:func:`~fedlatent.engine.secagg.sumtree.verify_leaf`): a
   transcript without its leaf, with another, or missing while it holds one, is refused
   naming the round; so is a tree whose leaves are not the set-up's roster in its order
   (``n`` its size, this site's leaf its rank: :func:`~.verify_transcript.roster_place`), or
   in which a site of its neighbourhood that was not in the sum does not hold zero
   (:func:`~.verify_transcript.zeros`): no vector can hide in a leaf outside the roster or in
   a dropped site's slot (these checks live in :mod:`~.verify_transcript`, which the group
   tests of :mod:`~.verify_groups` share);
2. folds the transcript's digest (the root it reached and ``A``, ``c``) into its
   confirmations of this exchange
   (:meth:`~fedlatent.engine.secagg.client.SecAggClient.bind_digest`): a neighbour shown
   another transcript refuses to reveal, so the server cannot show two worlds; and it
   reveals nothing of this exchange unless every neighbour that was in the sum before
   survives it (its tokens carry the digest it checked:
   ``SecAggClient._confirmed_before``), so no leaf goes unchecked; with the digest, its
   setup, units and seed (:func:`~.verify_fields.bound`), bound alone into the fit's first
   exchange (no transcript before it), so a site told other ones than its neighbours reveals
   nothing of any exchange;
3. decodes ``A`` and replays the server (:func:`~fedlatent.engine.node.replay.replay`: the
   FedEM update with the federation's step size and control-variate step, the model's M-step)
   and refuses parameters that differ (:func:`~fedlatent.engine.node.replay.params_refusal`:
   the round, the parameter and the largest difference); the E-step then uses the replayed
   ``S_hat``, never one the server sends.

Accelerated EM (``Federation(acceleration="squarem" | "newton")``): the statistic the
accelerator sends instead of ``F(S_hat)`` and each extra point are replayed from the verified
aggregates (:mod:`~fedlatent.engine.node.verify_points`) and refused when they differ.

What a site cannot replay it refuses under verification: the first round's parameters (a
start) unless its policy allows public starts, and extra points in a fit set up without
acceleration, in the first round, or beyond those the history of aggregates gives.

Participation: verification needs every site in every round (``participation=1``): a site
that took no part in an exchange holds no leaf of it and could only take its neighbours' word
for the transcript; a federation with partial participation is refused verification at the
setup (:meth:`Federation.verifies`) rather than verified by halves. A site of exchange
``t``'s sum that is no survivor of ``t + 1`` (it dropped out, failed or refused) stops the
fit at ``t + 1``'s consistency round, before anything of it is revealed.

Where the parts live: this module, the round's check and the replay's glue;
:mod:`~.verify_transcript`, the transcript's check (and :class:`VerificationRefused`);
:mod:`~.verify_fields`, the round's settings, scale and binding; :mod:`~.verify_kept`, what
the site keeps between rounds; :mod:`~.verify_points`, accelerated EM's points;
:mod:`~.verify_groups`, group tests and discarded rounds; :mod:`~.verify_info`, the
information after the rounds.
"""

from __future__ import annotations

import functools
import json
import operator
import weakref
from types import SimpleNamespace
from typing import Any

import numpy as np

from fedlatent.engine.node import verify_transcript as _vt
from fedlatent.engine.node.verify_fields import CV_KEPT
from fedlatent.engine.node.verify_fields import fields_of as _fields_of
from fedlatent.engine.node.verify_fields import round_refusal as _round_refusal
from fedlatent.engine.node.verify_fields import scale_refusal as _scale_refusal
from fedlatent.engine.node.verify_kept import fedem_step
from fedlatent.engine.node.verify_kept import flat_step as _flat_step
from fedlatent.engine.node.verify_kept import groups as _groups
from fedlatent.engine.node.verify_kept import num as _num
from fedlatent.engine.node.verify_kept import plan as _plan
from fedlatent.engine.node.verify_kept import store as _store
from fedlatent.engine.node.verify_kept import units as _units
from fedlatent.engine.node.verify_transcript import VerificationRefused
from fedlatent.engine.node.verify_transcript import federation as _federation
from fedlatent.engine.node.verify_transcript import refuse as _refuse
from fedlatent.engine.protocol.compiled import MIN_WORK as _MIN_WORK
from fedlatent.engine.protocol.compiled import at_scale as _at_scale
from fedlatent.engine.protocol.messages import pack, unpack
from fedlatent.engine.stats import Stats

__all__ = ["VerificationRefused", "check_exchange", "setup_verification", "verified_message",
           "verifying"]

_V = "verify/"
_SHAPE = operator.attrgetter("shape")


def verifying(node) -> bool:
    """Whether ``node``'s fit runs verified rounds (its setup said so: kept in its state,
    ``verify/on``, which holds the run's name)."""
    return "verify/on" in node.state


def setup_verification(node, msg: dict[str, Any]) -> None:
    """Keep the fit's verification settings (the setup's ``verify`` field: the federation)
    in the node's state, and forget an earlier fit's replay. The same run's setup again (a
    node rebuilt for each message replays it) changes nothing: a run set up verified stays
    verified. A node set up before is sent a new fit, even of the same run (the same
    estimator fitted again on the same sites)."""
    run = np.frombuffer(str(msg.get("run", "")).encode(), np.uint8).copy()
    again, node._verify_set_up = getattr(node, "_verify_set_up", False), True
    if run.size and not again and np.array_equal(node.state.get("verify/on"), run):
        return  # (an unnamed run is a new fit at every setup)
    for k in [k for k in node.state if k.startswith(_V)]:
        del node.state[k]
    raw = msg.get("verify")
    if raw:  # (the mark holds the run: one key fewer for every scan of the state)
        node.state["verify/on"] = run
        node.state["verify/federation"] = np.frombuffer(str(raw).encode(), np.uint8).copy()
        node.state["verify/setup"] = _frozen(np.frombuffer(_setup_digest(msg), np.uint8).copy())


def _setup_digest(msg: dict[str, Any]) -> bytes:
    """SHA-256 of what every site's setup must say alike (the model, its configuration, the
    federation, the disclosure and the differential privacy with its releases), bound into
    every exchange's pair masks (:func:`~.verify_fields.bound`): a server that told one site
    a laxer disclosure than the others (theirs stricter, so each accepts it, their replies
    then empty where that site's is not) would read that site's reply alone in those cells."""
    import hashlib

    said = [str(msg.get(k, "")) for k in ("model", "model_config", "verify", "disclosure",
                                          "privacy")]
    said.append(str(int(msg.get("privacy_releases") or 0)))  # (a Flower node stores 0)
    return hashlib.sha256("\x00".join(said).encode()).digest()


def verified_message(node, method: str, msg: dict[str, Any]):
    """``(message to answer, None)`` or ``(None, refusal reply)`` for a node whose fit runs
    verified rounds: a secure E-step or query after :func:`check_exchange`; a data exchange
    outside secure aggregation refused (the setup promised verified rounds: fail closed)."""
    try:
        if method in ("estep", "query") and "secagg/slot" in msg:
            if node.secagg is None:
                raise VerificationRefused(f"client {node.client_id!r}: a secure exchange "
                                          "before the key set-up")
            return check_exchange(node, method, msg), None
        if method == "cv_init":  # (its S_hat checked at the next E-step, before any use)
            from fedlatent.engine.node.verify_fields import keep_cv_start

            keep_cv_start(node, msg)
            return msg, None
        if method in ("estep", "query", "evaluate"):
            raise VerificationRefused(
                f"client {node.client_id!r}: round {msg.get('round', '?')} refused: the setup "
                f"set up verified rounds, and this {method!r} is not a secure exchange whose "
                "transcript the site can check")
    except VerificationRefused as err:
        import logging

        from fedlatent.engine.protocol.messages import refusal_reply

        logging.getLogger(__name__).log(node.log_level, "%s", err)
        return None, refusal_reply(str(err), "verification")
    return msg, None


def check_exchange(node, method: str, msg: dict[str, Any]) -> dict[str, Any]:
    """The message ``node`` answers after its checks (see the module docstring): ``msg`` with
    the replayed ``S_hat`` (an E-step) and no transcript; VerificationRefused naming the
    client and the round otherwise. Its checks run compiled (numba) where the sites that
    verify in this process together pay numba's set-up (:data:`SITES_FOR_KERNELS`), in
    NumPy otherwise (one deployed site): the same numbers either way."""
    _SITES.add(node)
    with _at_scale(len(_SITES) * (_MIN_WORK // SITES_FOR_KERNELS)):
        return _check_exchange(node, method, msg)


#: from this many verifying sites in one process (a simulation), a check's kernels pay numba's
#: set-up there (~0.4 CPU seconds a process; each site's round is ~60-80 us faster compiled:
#: 100 sites repay it in about 50 rounds), which one deployed site's process never does
SITES_FOR_KERNELS = 100
_SITES: weakref.WeakSet = weakref.WeakSet()  # (this process's verifying nodes, alive)


def _check_exchange(node, method: str, msg: dict[str, Any]) -> dict[str, Any]:
    """:func:`check_exchange`'s checks."""
    rnd = msg.get("secagg/round", msg.get("round", 0))
    rnd = rnd if type(rnd) is int else _num(rnd)
    exch = str(msg.get("secagg/exchange", method))
    who = f"client {node.client_id!r}: round {rnd} refused"
    if node.model is None:  # (a node rebuilt for this message, as on Flower)
        node._setup(msg)
    if "secagg/replay" in msg:  # a group test (its remembered reply again, over a
        if method != "estep":  # sub-cohort, never applied): only of a failure it checked
            raise VerificationRefused(f"{who}: a {method!r} marked as a group test's replay "
                                      "(only a round's remembered reply is replayed)")
        _verify_groups().check_group_test(node, msg, rnd, exch, who)
        node.secagg.keep_leaf = False  # (its leaf of the round kept; scaled as the round was)
        _check_scale(node, msg, method, who)
        return {k: v for k, v in msg.items() if not k.startswith(_V)}
    leaf = node.secagg.take_leaf()
    undone, last, fed = _undone(msg), _last_kind(node), _federation(node)
    if method == "estep":
        _in_order(node, rnd, exch, last, who)
    words = _transcript_before(node, leaf, msg, rnd, exch, who, undone, last)
    node.secagg.keep_leaf = True
    kept = _fields_of(tuple(msg)).kept  # (no verify/ field)
    out = dict(zip(kept, map(msg.__getitem__, kept)))  # (no bytecode a field)
    _commit_seed(node, msg, who)
    _keep_units(node, msg, who)
    if leaf is None:  # (the fit's first exchange: no transcript, but the setup, units and
        node.secagg.bind_digest(rnd, exch, _vt.tools().bound(node, b""))  # seed it was told)
    _check_scale(node, msg, method, who, fed)
    if last == "query" and words is not None:  # a start's exchange, verified
        _keep_start_exchange(node, _vt.decoded(node, words, leaf[1]), _units(node)[0])
    if method != "estep":
        return _check_asked(node, out, None if words is None else _vt.decoded(
            node, words, leaf[1]), last, who)
    out = _replay_round(node, out, words, leaf, rnd, who, undone, last, fed)
    _check_round(node, out, rnd, who, fed)
    node.state["verify/last"] = _ESTEP
    node.shapes_checked = out  # (every point's parameters are the replay's, or the start's
    return out  # declared shapes: the E-step of this very message need not check them again)


def _in_order(node, rnd: int, exch: str, last: str, who: str) -> None:
    """A round's E-step is the exchange ``estep`` of the round after the last one this site
    answered (after a query: a later round): a skipped number would have the site draw other
    mini-batch rows and another refresh of its control variates than the server's replay, a
    repeated or earlier one answer one round's parameters twice or roll its control variate
    back as for a resumed fit (``answer_secure``); VerificationRefused otherwise."""
    if exch != "estep":
        raise VerificationRefused(f"{who}: its E-step is labelled as the exchange {exch!r}, "
                                  "not a round's ('estep')")
    held = node.state.get("verify/round")  # (none before the fit's first round)
    if held is not None and (rnd != _num(held) + 1 if last == "estep" else rnd <= _num(held)):
        raise VerificationRefused(  # (after a query, say the information: never a round back,
            f"{who}: it does not follow round {_num(held)}, the last "  # which would roll
            "this site answered: a verified fit's rounds come in order, one each (it is "  # its
            "never resumed from a checkpoint: fit again to start over)")  # state back)


def _transcript_before(node, leaf, msg: dict[str, Any], rnd: int, exch: str, who: str,
                       undone: list, last: str):
    """The words of the claimed sum of the exchange before (its transcript checked: its
    digest bound to this exchange), or None: the fit's first exchange, or one whose round
    the server discarded (its failure checked: never applied)."""
    if leaf is None:
        if _V + "A" in msg:
            raise VerificationRefused(f"{who}: it shows a transcript of an exchange this site "
                                      "took no part in (it holds no leaf to check it by)")
        if last == "estep":  # (it refused or missed the round before)
            raise VerificationRefused(f"{who}: this site holds no contribution to the "
                                      "exchange before, so it cannot check the aggregate the "
                                      "parameters come from")
        return None
    if undone and json.loads(leaf[0])[0] in undone:
        _verify_groups().check_undone(node, leaf, msg, who, (rnd, exch))  # (failed)
        return None  # its round discarded, never applied: the parameters stay (_same_again)
    return _vt.check_transcript(node, leaf, msg, rnd, exch, who)


def _check_asked(node, out: dict[str, Any], total, last: str, who: str) -> dict[str, Any]:
    """``out`` once a query (not an E-step) is checked: the information after the rounds
    (at the verified parameters), or a start's next query."""
    if last in ("estep", "information"):  # after the rounds: the information
        from fedlatent.engine.node.verify_info import after_rounds  # at verified params

        _refuse(after_rounds(node, out, total, who))
        return out
    asked = {k: v for k, v in out.items() if not k.startswith(("secagg/", "verify/"))}
    _check_query(node, asked)
    node.state["verify/last"] = _QUERY
    node.state["verify/asked"] = _bytes(json.dumps(_jsonable(asked)))
    return out


def _check_scale(node, msg: dict[str, Any], method: str, who: str, fed=None) -> None:
    """The exchange's unit and weight are the site's (:func:`~.verify_fields.scale_refusal`;
    ``fed`` the setup's federation, read when None)."""
    if "verify/units" in node.state:  # (none yet: refused by _keep_units, or a group test
        _refuse(_scale_refusal(node, msg, method, _units(node), (  # before any round)
            fed or _federation(node)).client_weighting, who))


def _check_round(node, msg: dict[str, Any], rnd: int, who: str, fed) -> None:
    """The E-step's settings are the setup's federation's ``fed`` for this round, and the
    control variates' start the replayed ``S_hat`` (:mod:`~.verify_fields`), the replay done:
    its kept ``S_hat`` says whether the server's state is initialized."""
    at = _plan(node)
    init_round = at is None or not at.rows["S_hat"]
    _refuse(_round_refusal(node, fed, msg, rnd, _committed(node, node.state["verify/seed"]),
                           init_round, who))
    if not init_round and CV_KEPT in node.state:  # (once: after cv_init)
        from fedlatent.engine.node.verify_fields import cv_start_refusal

        _refuse(cv_start_refusal(node, unpack(msg, "S_hat"), rnd))


def _verify_groups():
    """:mod:`~.verify_groups` (group tests, discarded rounds: imported when one comes)."""
    from fedlatent.engine.node import verify_groups

    return verify_groups


def _undone(msg: dict[str, Any]) -> list:
    """The rounds the server discarded so far (``secagg/undo``, a JSON list; mostly none)."""
    raw = msg.get("secagg/undo")
    return json.loads(raw) if raw and raw != "[]" else []


#: what ``verify/last`` holds after a query or an E-step: one read-only array each, shared by
#: every node (never written in place), so that the kind is known by identity every round
_QUERY, _ESTEP = np.frombuffer(b"query", np.uint8), np.frombuffer(b"estep", np.uint8)


def _last_kind(node) -> str:
    last = node.state.get("verify/last")
    return ("estep" if last is _ESTEP else "" if last is None  # (a rebuilt node's: parsed)
            else bytes(last).decode())


def _replay_round(node, msg: dict[str, Any], words, leaf, rnd: int, who: str, undone: list,
                  last: str, fed) -> dict[str, Any]:
    """``msg`` with the replayed ``S_hat`` once its parameters are those the replay gives
    (``words``: the claimed sum of the exchange of ``leaf``, checked; None: none to apply)."""
    vp = _deps().verify_points
    accelerated = _vt.accelerated(node)
    if "points" in msg and vp.n_points(msg) > 0 and (not accelerated or last != "estep"):
        raise VerificationRefused(f"{who}: it asks for extra points (accelerated EM), which "
                                  "this site cannot replay " + (
                                      "in the first round" if accelerated else
                                      "in a fit set up with Federation(acceleration=None)"))
    at = _plan(node) if last == "estep" and not accelerated else None
    k_prev = _num(node.state["verify/round"]) if last == "estep" else 0
    if at is not None and at.aligned and words is not None and k_prev not in undone:
        agg = _delta(at, words, leaf[1]) if at.rows["S_hat"] else _vt.decoded(
            node, words, leaf[1])  # (the initialization round's: S_hat the aggregate)
        if agg is not None:  # (every plain round: S_hat's steps by place)
            msg = _next_flat(node, fed, at, msg, agg, rnd, k_prev)
            node.state["verify/round"] = np.array(float(rnd))
            return msg
    total = None if words is None else _vt.decoded(node, words, leaf[1])
    sent = unpack(msg, "params")
    mine = _groups(node)
    n_total, n_clients = _units(node)
    if last == "estep" and k_prev in undone:
        _same_again(node, msg, sent, rnd, mine)  # its round discarded: nothing applied since
        if accelerated:  # (the server restarts its path after a discarded round)
            _refuse(vp.check_points(node, vp.restart(node, fed, n_total), msg, sent, rnd))
    elif last != "estep":  # the first round: its parameters are a start
        _declared(node, msg)
        _start_check(node, sent, n_total, int(n_clients), who)
        node.state.pop("verify/start", None)  # (the start checked: what it was checked by
        node.state.pop("verify/asked", None)  # is never read again)
    else:
        msg = _next_round(node, fed, msg, sent, total, mine, rnd)
    mine["params"] = {k: np.asarray(v) for k, v in sent.items()}
    _store(node, mine)
    node.state["verify/round"] = np.array(float(rnd))
    return msg


def _delta(at, words: np.ndarray, shapes: tuple) -> np.ndarray | None:
    """The aggregate's ``delta/`` fields, as the int64 words of its sum ``words`` (of the
    layout ``shapes``) in one vector in the order of the kept ``S_hat`` (the plan ``at``'s),
    as :func:`~.verify_kept.flat_step` decodes and adds them by place; None where the
    aggregate does not hold every field of ``S_hat`` (the general replay then takes it).
    Where they lie is found once per layout and plan (:func:`_delta_span`): one run of
    words, a view."""
    span = _delta_span(at, shapes)
    if type(span) is slice:  # (one run of words: the common case)
        return words[span].view(np.int64)
    if span is None:
        return None
    fields = _vt.tools().Layout.of_shapes(shapes).unflatten(words.view(np.int64), copy=False)
    return np.concatenate([fields[k] for k in span], axis=None)


@functools.lru_cache(maxsize=16)
def _delta_span(at, shapes: tuple):
    """Where ``S_hat``'s ``delta/`` fields lie in a sum of the layout ``shapes``: one slice
    where they follow each other in the plan ``at``'s order at ``S_hat``'s sizes, else
    their names in that order, or None where one is missing (found once per plan, an object
    per layout kept, and layout: the nodes of a process share both)."""
    names = [k for k, _ in shapes]
    if not at.delta <= set(names):
        return None
    sizes = [int(np.prod(s, dtype=np.int64)) for _, s in shapes]
    first = names.index(next(iter(at.delta)))
    run = range(first, first + len(at.delta))
    if names[first:run.stop] != list(at.delta) or [sizes[i] for i in run] != [
            sl.stop - sl.start for _, _, sl in at.rows["S_hat"]]:
        return list(at.delta)
    return slice(sum(sizes[:first]), sum(sizes[:run.stop]))


def _next_flat(node, fed, at, msg: dict[str, Any], agg, rnd: int, k_prev: int
               ) -> dict[str, Any]:
    """:func:`_next_round` of a round of plain FedEM, on the packed vector
    (:class:`~fedlatent.engine.node.verify_kept.Plan` ``at``; ``agg`` the aggregate's
    ``delta/`` fields' words in one vector, :func:`_delta`, or in the initialization round
    the decoded aggregate by field): the server's FedEM step
    (:func:`~fedlatent.engine.node.verify_kept.flat_step`: the same bits; in the
    initialization round ``S_hat`` is the aggregate and ``V`` zero, as
    :meth:`~fedlatent.engine.fedem.update.FedEMState.advance` starts them), its M-step
    checked forward or replayed (:func:`~fedlatent.engine.node.replay.step_refusal`), then
    the sent parameters and the step kept as one new vector, and ``msg`` given views of its
    ``S_hat`` (the E-step copies them); VerificationRefused otherwise, the kept vector
    unchanged."""
    kept = node.state["verify/kept"]
    sent, listed = _sent(node, at, msg)
    if at.rows["S_hat"]:
        alpha = fed.alpha_for(at.shapes["S_hat"]) if at.rows["V"] else 1.0
        new = _flat_step(kept, at, agg, node.secagg.config.encoding.scale, fed.gamma(k_prev),
                         alpha, listed)
        views = at.views(new, "S_hat")
    else:  # (the initialization round's: the layout gains S_hat and V)
        new, views = None, {k[6:]: v for k, v in agg.items() if k.startswith("delta/")}
    S = Stats(views, copy=False)
    why = _deps().step_refusal(node.model, S, at.lazy(kept, "params"), _units(node)[0], sent,
                               rnd, node.client_id)
    if why:
        _declared(node, msg)  # another shape: the declared-shape refusal, as unverified
        raise VerificationRefused(why)
    if listed is not None and new is not None:
        node.state["verify/kept"] = new  # (a new vector: the one before is never written)
    else:  # (a new layout: the first step's, or other names or shapes than before)
        _store(node, {"params": sent, "S_hat": S, "V": at.views(new, "V") if new is not None
                      else S.zeros_like() if fed.control_variates else {}})
    msg.update(zip(at.messaged, views.values()) if new is not None else pack("S_hat", S))
    return msg


def _sent(node, at, msg: dict[str, Any]) -> tuple[dict, list | None]:
    """``(sent, listed)``: the parameters ``msg`` carries (``{name: array}``) and, where they
    are the kept layout's names and shapes, the arrays in its order (else None); ``msg``
    left without ``S_hat/`` fields (a server's ``S_hat`` is never used: the replayed one
    is). A message with the fields of the last one read with the layout (``at.fields``: no
    ``S_hat/``, the layout's parameters) is read by name without a scan."""
    if msg.keys() == at.fields:
        arrays = list(map(np.asarray, map(msg.__getitem__, at.sent)))
        sent = dict(zip(at.sent.values(), arrays))
    else:
        keys, sent = frozenset(msg), unpack(msg, "params")
        shown = [k for k in msg if k.startswith("S_hat/")]
        for k in shown:
            del msg[k]
        arrays = [sent[n] for n in at.sent.values()] if sent.keys() == at.shapes[
            "params"].keys() else None
        if arrays is not None and not shown:
            at.fields = keys
    return sent, arrays if arrays is not None and list(map(_SHAPE, arrays)) == at.listed \
        else None


def _next_round(node, fed, msg: dict[str, Any], sent: dict, total, mine: dict,
                rnd: int) -> dict[str, Any]:
    """``msg`` with the replayed ``S_hat`` after the exchange before (its decoded ``total``):
    the server's FedEM step and, accelerated, the accelerator's statistic and extra points
    (:mod:`~fedlatent.engine.node.verify_points`); VerificationRefused otherwise."""
    d = _deps()
    vp, replay_refusal, step_refusal = d.verify_points, d.replay_refusal, d.step_refusal
    n_total = _units(node)[0]
    prev = mine["params"]
    state, new, k_prev = fedem_step(node, fed, mine, total)
    accelerated = vp.accelerated(fed)
    if accelerated:  # the statistic the accelerator sends instead of F(S_hat)
        pr, new = vp.accelerated_state(node, fed, state, new, prev, total, k_prev, n_total)
        params = node.model.replay_step(new.S_hat, prev, n_total)  # (its points need them)
        why = replay_refusal(node.model, new.S_hat, prev, n_total, sent, params, rnd,
                             node.client_id)
    else:  # the M-step checked forward, or replayed
        why = step_refusal(node.model, new.S_hat, prev, n_total, sent, rnd, node.client_id)
    if why:
        _declared(node, msg)  # another shape: the declared-shape refusal, as unverified
        raise VerificationRefused(why)
    if accelerated:
        _refuse(vp.check_points(node, pr, msg, params, rnd))
    mine["S_hat"] = new.S_hat.to_dict()
    mine["V"] = {} if new.V is None else new.V.to_dict()
    msg = {k: v for k, v in msg.items() if not k.startswith("S_hat/")}
    msg.update(pack("S_hat", mine["S_hat"]))
    return msg


@functools.cache
def _deps() -> SimpleNamespace:
    """What a verified round's replay calls, imported at the first verified round (a node
    answering plain rounds loads neither the server's update nor the accelerators) and kept:
    no import statement run every round."""
    from fedlatent.engine.node import verify_points
    from fedlatent.engine.node.replay import replay_refusal, step_refusal

    return SimpleNamespace(verify_points=verify_points, replay_refusal=replay_refusal,
                           step_refusal=step_refusal)


def _declared(node, msg: dict[str, Any]) -> None:
    """Declared is evaluated (:func:`~fedlatent.engine.node.declared.check_round`), its
    refusal as a verification refusal."""
    from fedlatent.engine.node.declared import DeclaredShapeError, check_round

    try:
        check_round(node.model, node._data, msg, node.client_id)
    except DeclaredShapeError as err:
        raise VerificationRefused(str(err)) from None


def _same_again(node, msg: dict[str, Any], sent: dict, rnd: int, mine: dict) -> None:
    """After a discarded round (its aggregate never applied) the server's state is the one
    before it: the parameters must be those evaluated then, ``S_hat`` the one kept."""
    from fedlatent.engine.node.replay import params_refusal

    why = params_refusal(sent, mine["params"], rnd, node.client_id)
    if why:
        raise VerificationRefused(why)
    for k in [k for k in msg if k.startswith("S_hat/")]:
        del msg[k]
    msg.update(pack("S_hat", mine["S_hat"]))


def _start_check(node, sent: dict, n_total: float, n_clients: int, who: str) -> None:
    """The first round's parameters: a start replayed from the committed seed and the
    verified aggregates of the start's exchanges (:mod:`~fedlatent.engine.node.replay_start`),
    or, where the site's policy allows public starts (a simulation's sites: the analyst holds
    them all) or the fit is differentially private (each release is DP whatever the
    parameters; a noisy start is not replayed), any start of the declared shapes."""
    from fedlatent.engine.node.replay_start import Exchange, start_refusal

    seen = [Exchange(e["query"], _arrays(e["payload"]), _arrays(e["total"]))
            for e in json.loads(_text(node.state.get("verify/start")) or "[]")]
    seed = node.state.get("verify/seed")
    why = start_refusal(sent, node.model, 0 if seed is None else int(_text(seed)), seen,
                        node.client_id, n_features=int(np.shape(node._raw.X)[1]),
                        n_total=n_total, n_clients=n_clients,
                        public_starts=_public_starts(node))
    if why:
        raise VerificationRefused(why)


def _check_query(node, asked: dict[str, Any]) -> None:
    """A start's query ``asked`` must be the next one the model's start code asks after the
    start's verified exchanges so far, from the committed seed
    (:func:`~fedlatent.engine.node.replay_start.query_refusal`), before it is answered;
    not checked where the first round's start is not (public starts, DP)."""
    from fedlatent.engine.node.replay_start import Exchange, query_refusal

    if _public_starts(node):
        return
    seen = [Exchange(e["query"], _arrays(e["payload"]), _arrays(e["total"]))
            for e in json.loads(_text(node.state.get("verify/start")) or "[]")]
    n_total, n_clients = _units(node)
    _refuse(query_refusal(node.model, _committed(node, node.state["verify/seed"]), seen,
                          Exchange.of(asked, {}), node.client_id,
                          n_features=int(np.shape(node._raw.X)[1]), n_total=n_total,
                          n_clients=int(n_clients)))


def _public_starts(node) -> bool:
    """Whether the site answers any start of the declared shapes: its policy allows public
    starts, or the fit is differentially private within the epsilon its policy bounds
    (``max-epsilon`` or ``lifetime-epsilon``; a privacy the server declares, at an epsilon
    no policy bounds, is no reason: with it a server would switch off the start's checks and
    ask any query)."""
    policy = node.site_policy
    return bool(policy.public_starts or policy.relaxed or (node.privacy is not None and (
        policy.max_epsilon is not None or policy.lifetime_epsilon is not None)))


def _keep_units(node, msg: dict[str, Any], who: str) -> None:
    """The federation's units N and its number of clients (``verify/units``), which the
    replay needs: the first exchange's, kept; a later exchange that says them again must say
    the same."""
    if _V + "units" not in msg:
        if "verify/units" in node.state:
            return
        raise VerificationRefused(f"{who}: it does not say the federation's units and clients "
                                  "(verify/units), which the replay needs")
    units = np.asarray(msg[_V + "units"], dtype=np.float64).reshape(-1)
    before = _units(node) if "verify/units" in node.state else None
    if before is not None and before != (units[0], units[1]):
        raise VerificationRefused(f"{who}: it says {units[0]:g} units over {units[1]:g} clients"
                                  f", not the {before[0]:g} over {before[1]:g} said before")
    if before is None:
        node.state["verify/units"] = _frozen(units[:2].copy())


def _commit_seed(node, msg: dict[str, Any], who: str) -> None:
    """The seed of the first message after the setup that carries one is the fit's; another
    later is refused (:func:`~fedlatent.engine.node.replay_start.seed_refusal`)."""
    if "seed" not in msg:
        return
    held = node.state.get("verify/seed")
    if held is None:
        node.state["verify/seed"] = _frozen(_bytes(str(int(_num(msg["seed"])))))
        return
    seed = msg["seed"]
    seed = seed if type(seed) is int else int(_num(seed))
    if seed == _committed(node, held):
        return  # (the committed seed: every round's case)
    from fedlatent.engine.node.replay_start import seed_refusal

    why = seed_refusal(msg, int(_text(node.state["verify/seed"])), node.client_id,
                       who.split(": ", 1)[1].replace(" refused", ""))
    if why:
        raise VerificationRefused(why)


def _committed(node, held: np.ndarray) -> int:
    """The committed seed (``verify/seed``'s digits ``held``), parsed once per array kept."""
    got = getattr(node, "_verify_seed", None)
    if got is None or got[0] is not held:
        got = node._verify_seed = (held, int(_text(held)))
    return got[1]


def _keep_start_exchange(node, total: dict, n_total: float) -> None:
    """Add the query this site answered last, with its verified total (every field times N,
    as the server multiplies it back), to the start's exchanges."""
    asked = json.loads(_text(node.state.get("verify/asked")) or "{}")
    out = {}
    for k, v in total.items():
        v = np.asarray(v) * n_total
        out[k] = v.reshape(()) if v.size == 1 and (k == "n" or k.startswith("objective")) else v
    kept = json.loads(_text(node.state.get("verify/start")) or "[]")
    payload = {k: v for k, v in asked.items() if k not in ("query", "seed")}
    kept.append({"query": str(_arrays(asked)["query"]), "payload": payload,
                 "total": _jsonable(out)})
    node.state["verify/start"] = _bytes(json.dumps(kept))


def _bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), np.uint8).copy()


def _frozen(a: np.ndarray) -> np.ndarray:
    """``a`` read-only: what the binding's bytes are kept by (:func:`~.verify_fields.bound`:
    by identity) is never written in place."""
    a.flags.writeable = False
    return a


def _text(a) -> str:
    return "" if a is None else np.asarray(a, np.uint8).tobytes().decode()


def _jsonable(d: dict) -> dict:
    """Arrays as ``{"a": values, "s": shape}`` (exact: JSON floats are repr's), the rest as
    it is (strings, numbers)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, str | bytes):
            out[k] = v if isinstance(v, str) else v.decode()
        else:
            a = np.asarray(v)
            out[k] = {"a": a.ravel().tolist(), "s": list(a.shape), "d": a.dtype.str}
    return out


def _arrays(d: dict) -> dict:
    """Inverse of :func:`_jsonable`."""
    return {k: np.asarray(v["a"], dtype=np.dtype(v["d"])).reshape(v["s"])
            if isinstance(v, dict) else v for k, v in d.items()}
