"""A verifying site's part in the group tests of a failing round, and in its discard.

Under secure aggregation a failing aggregate is discarded and its liar located by group tests
(:mod:`fedlatent.engine.secagg.secure_checks`): the round's survivors re-send their reply of
the round (``secagg/replay``) in secure sums over sub-cohorts, and the difference of two
tested sums is the sum over the sites one cohort left out. Asked by a server that claims an
honest aggregate failed, two such sums would give one site's reply. So a verifying site takes
part in a group test of round ``k`` (:func:`check_group_test`) only when:

1. the test's message carries round ``k``'s transcript (as the next round's message would:
   ``verify/A``, ``verify/path``, ``verify/zero``) and the site's own contribution to round
   ``k`` (its kept leaf, which the test does not take) reaches its root, from its place in
   the set-up's roster, with a zero leaf for each site of its neighbourhood that was not in
   the sum (:func:`_verified`: the round's own check,
   :func:`~.verify_transcript.checked`, which this module shares with
   :mod:`~.verify`);
2. round ``k``'s aggregate, decoded from that transcript, fails a check the server runs
   (:func:`failure`): the ring's range, the units it claims (full passes), the model's
   invariants on the statistic rebuilt as the server rebuilds it
   (:func:`~fedlatent.engine.secagg.secure_checks.rebuild`: ``A + W S_hat (+ V)`` with the
   ``S_hat`` and ``V`` the site replayed; under verification every site is in every round, so
   ``W`` is 1 and the units the federation's), with the same slack;
3. the round's first test holds every site of its sum, each binding the transcript's digest
   into the test's pair masks and requiring every neighbour of the sum to survive it (as a
   round does: ``SecAggClient._confirmed_before``), so that a site reveals in it only when
   all of them checked their own contribution in the same transcript (a cohort alone does
   not see the leaves of the sites it leaves out, which a server could otherwise alter);
   a later test must show that transcript (the digest the site confirmed in a first test it
   revealed in), leave out at most ``len(S) - t`` of the round's sites (what a search above
   the threshold ``t`` leaves out) and be among the first
   :func:`~fedlatent.engine.secagg.secure_checks.group_test_limit` after the first
   (counted in the site's state, ``verify/group-tests``).

An honest aggregate passes every check, so a server cannot start a search at will; what a
real liar's search reveals the search module's docstring says. A site that cannot tell
(sites of its neighbourhood were not in the sum, a sum short of the federation's units on a
sparse graph) refuses: it answers only a failure it has checked.

A round the server lists as discarded (``secagg/undo``) whose contribution the site holds is
checked the same way at the next exchange (:func:`check_undone`: its transcript, and that its
aggregate fails where the site can tell) before the site treats it as discarded.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from fedlatent.data.validation import name_list
from fedlatent.engine.node.verify_kept import groups, plan, units
from fedlatent.engine.node.verify_transcript import (
    VerificationRefused,
    checked,
    decoded,
    federation,
    tools,
)
from fedlatent.engine.stats import Stats

__all__ = ["check_group_test", "check_undone", "failure"]

_V = "verify/"
#: ``[round, group tests of it answered after its first]``: at most the search's limit
_COUNT = "verify/group-tests"
#: ``[group tests answered in the fit]`` (every round's): at most ``CHECK_SLOTS``
_TOTAL = "verify/group-total"
#: the round's first group test (over every site of its sum): JSON ``[round, the transcript's
#: digest, the test's exchange label]`` (hex), as uint8
_FIRST = "verify/group-first"


def check_group_test(node, msg: dict[str, Any], rnd: int, exch: str, who: str) -> None:
    """VerificationRefused (naming the round and why) unless ``node`` may answer the group
    test ``msg`` (exchange ``exch``) of round ``rnd``; the test counted otherwise (see the
    module docstring)."""
    from fedlatent.engine.secagg.protocol import exchange_label

    test = f"{who}: group test {exch!r} of round {rnd}"
    leaf = node.secagg.held_leaf(exchange_label(rnd, "estep"))  # (not taken: kept)
    if leaf is None:
        _no(f"{test}: this site holds no contribution to round {rnd}'s sum (it re-sends "
             "only the reply of the round its kept contribution is of)")
    if _V + "A" not in msg:
        _no(f"{test}: it carries no transcript of round {rnd}'s sum, so this site cannot "
             "check that the round's aggregate failed; it takes part in a group test only "
             "of a failure it has checked")
    fields, digest, split = _verified(node, leaf, msg, test, f"round {rnd}'s sum")
    if failure(node, fields, split, rnd, test) is None:
        _no(f"{test}: round {rnd}'s aggregate, rebuilt from its verified transcript, "
             "passes every check the server runs on it (ring range, units, the model's "
             "invariants): a group test of an aggregate that did not fail is refused")
    out = _cohort(node, msg, split, test, rnd)
    bound = tools().bound(node, digest)
    confirmed = _confirmed(node, rnd)
    if confirmed is None:  # the round's first test: every site of the sum, each confirming
        if out:  # (its tokens carry the digest) it checked its own leaf in this transcript
            _no(f"{test}: it leaves out {out} of round {rnd}'s sites, and no group test of "
                 "the round over every site of its sum has confirmed the round's "
                 "transcript yet: each checks its own contribution in it before any "
                 "sub-cohort is summed")
        _count_fit(node, test)
        node.secagg.bind_digest(rnd, exch, bound, confirm=split[0])
        node.state[_FIRST] = np.frombuffer(json.dumps(
            [rnd, digest.hex(), exchange_label(rnd, exch).hex()]).encode(), np.uint8).copy()
        return
    if digest != confirmed:
        _no(f"{test}: its transcript is not the one every site of round {rnd}'s sum "
             "confirmed in the round's first group test")
    _count(node, rnd, test)
    _count_fit(node, test)
    node.secagg.bind_digest(rnd, exch, bound, confirm=())


def _confirmed(node, rnd: int) -> bytes | None:
    """The digest of round ``rnd``'s transcript that every site of its sum confirmed (the
    round's first group test, over all of them, in which this site revealed: it checked
    their confirmations), or None."""
    held = node.state.get(_FIRST)
    if held is None:
        return None
    k, digest, label = json.loads(np.asarray(held, np.uint8).tobytes().decode())
    return bytes.fromhex(digest) if k == rnd and node.secagg.revealed_in(
        bytes.fromhex(label)) else None


def _count(node, rnd: int, test: str) -> None:
    """Count a group test of round ``rnd`` after the first; refused beyond the most a
    search runs (:func:`~fedlatent.engine.secagg.secure_checks.group_test_limit`)."""
    from fedlatent.engine.secagg.secure_checks import group_test_limit

    held = node.state.get(_COUNT)
    done = 0 if held is None or int(held[0]) != rnd else int(held[1])
    n_clients = int(units(node)[1])
    limit = group_test_limit(n_clients)
    if done >= limit:
        _no(f"{test}: this site answered {done} group tests of round {rnd} after its "
             f"first already, the most a search over {n_clients} sites runs ({limit})")
    node.state[_COUNT] = np.array([float(rnd), float(done + 1)])


def _count_fit(node, test: str) -> None:
    """Count a group test of the fit (any round's, a first one included); refused beyond
    :data:`~fedlatent.engine.secagg.secure_checks.CHECK_SLOTS`, the most an honest server
    runs in a fit (the exchanges it reserves for them at set-up). Each failing round's
    search is bounded by :func:`_count`; this bounds how many searches a server that makes
    rounds fail (with a site that lies for it) runs in a fit."""
    from fedlatent.engine.secagg.secure_checks import CHECK_SLOTS

    held = node.state.get(_TOTAL)
    done = 0 if held is None else int(np.ravel(held)[0])
    if done >= CHECK_SLOTS:
        _no(f"{test}: this site answered {done} group tests in this fit already, the most "
             f"a server runs in a fit (the {CHECK_SLOTS} exchanges it reserves for them "
             "at set-up)")
    node.state[_TOTAL] = np.array([float(done + 1)])


def check_undone(node, leaf, msg: dict[str, Any], who: str, at: tuple[int, str]) -> None:
    """The round of ``leaf`` (this site's contribution), which ``msg``'s exchange (round and
    exchange ``at``) says the server discarded: VerificationRefused unless ``msg`` carries
    that round's transcript and, where the contribution is in it, its aggregate fails a check
    the server runs (:func:`failure`). Nothing of the round is applied, so its digest is not
    bound: a site whose contribution is missing from the sum (a reply altered in transit)
    holds none to bind, and its neighbours must reveal this exchange with it. Such a site,
    and one that answered no group test of the round, then answers the discarded round's
    question again only over the neighbours that were in its sum (:func:`_same_cohort`):
    else a server that showed every site a sum without its leaf, or that named a site as
    the liar with no search (a site lying for it), had the question re-asked without one
    site, the two sums differing by its reply. (A search's first test counts against the
    fit's group tests: a site's reply left out so is one of the differences they bound.)"""
    k = json.loads(leaf[0])[0]
    what = f"{who}: round {k}, which the server says it discarded"
    if _V + "A" not in msg:
        _no(f"{what}, is not shown (no transcript of it), so this site cannot check that "
             "its aggregate failed")
    got = _verified(node, leaf, msg, what, f"round {k}'s sum", missing_ok=True)
    if got is None:  # its contribution is not in the sum shown: not the sites' sum (say, a
        return _same_cohort(node, leaf, at, what)  # reply altered in transit): discarded
    fields, _, split = got
    try:
        why = failure(node, fields, split, k, what)
    except VerificationRefused:  # it cannot tell (sites were not in the sum): nothing of
        return _same_cohort(node, leaf, at, what)  # it applied, no group test answered
    if why is None:
        _no(f"{what}: its aggregate, rebuilt from its verified transcript, passes every "
             "check the server runs on it (ring range, units, the model's invariants): "
             "an aggregate that did not fail is never discarded")
    if _confirmed(node, k) is None:  # no search of it (no group test answered): no site
        _same_cohort(node, leaf, at, what)  # of its sum is left out of its question again


def _same_cohort(node, leaf, at: tuple[int, str], what: str) -> None:
    """Issue 38: every neighbour that was in the sum of ``leaf``'s discarded round (this
    site's own split of it) must survive the exchange ``at``, which asks that round's
    question again, before this site reveals in it (``SecAggClient._confirmed_before``)."""
    split = node.secagg.leaf_split(leaf[0])
    if split is None:  # (a state written before it kept its neighbourhood's split)
        _no(f"{what}: this site kept no record of which of its neighbours were in its sum, "
             "so it cannot ask that the round's question goes to them again")
    node.secagg.bind_digest(*at, None, confirm=split[0])


def _verified(node, leaf, msg: dict[str, Any], who: str, what: str, missing_ok=False):
    """``(fields, digest, (survivors, absent))``: the decoded aggregate of ``leaf``'s
    exchange once its transcript in ``msg`` is checked as a round's is
    (:func:`~.verify_transcript.checked`: its own leaf, its roster place, the zero leaves of
    its neighbourhood's absent sites); VerificationRefused otherwise (``missing_ok``: None
    where the site's own leaf does not reach the root)."""
    try:
        got = checked(node, leaf, msg, who, what, missing_ok)
    except tools().SecureAggregationError as err:
        raise VerificationRefused(f"{who}: the transcript it shows is not that of {what} with "
                                  f"this site's contribution ({err})") from None
    return None if got is None else (decoded(node, got[0], leaf[1]), *got[1:])


def _cohort(node, msg: dict[str, Any], split, test: str, rnd: int) -> int:
    """How many of round ``rnd``'s sites the test's cohort leaves out (as this site is told
    it: its neighbourhood's part); refused when the cohort holds a site not in the round's
    sum or leaves out more than ``len(S) - t`` (``t`` the threshold this site's shares
    need: what a search above the threshold leaves out)."""
    cohort = set(node.secagg.announced(msg.get("secagg/participants")))
    S = split[0]
    stray = sorted(cohort.difference(S))
    if stray:
        _no(f"{test}: its cohort holds {name_list(stray)}, which were not in round {rnd}'s "
             "sum")
    t = node.secagg.config.share_threshold(len(node.secagg.roster_ids))
    out = len(S) - len(cohort)
    if out > len(S) - t:
        _no(f"{test}: its cohort leaves out {out} of round {rnd}'s {len(S)} sites (of "
             f"those this site masks with), more than the {len(S) - t} a search above the "
             f"threshold {t} leaves out")
    return out


def failure(node, fields: dict[str, np.ndarray], split, rnd: int, who: str) -> str | None:
    """Why round ``rnd``'s decoded aggregate ``fields`` (its ring sum over the scale: the
    ``/ N`` fields not multiplied back) fails a check the server runs on it (None: it
    passes every one); VerificationRefused when the site cannot rebuild it (sites of its
    neighbourhood, ``split[1]``, were not in the sum; units short of the federation's on a
    sparse graph, where the site cannot tell a site left out from a lie)."""
    from fedlatent.engine.fedem.update import round_message
    from fedlatent.engine.secagg.secure import units_slack
    from fedlatent.engine.secagg.secure_checks import ring_problem

    if split[1]:
        _no(f"{who}: [{name_list(split[1])}] of this site's neighbourhood were not in round "
             f"{rnd}'s sum, so it cannot rebuild the round's statistic to check a failure")
    fed, (n_total, n_clients) = federation(node), units(node)
    enc = node.secagg.config.encoding
    ring = ring_problem(fields, [None] * int(n_clients), enc.bound)
    if ring:
        return ring
    at = plan(node)
    init_round = at is None or not at.rows["S_hat"]
    mode = round_message(fed, 0, rnd, init_round, 1.0)["mode"]
    claimed = float(np.ravel(fields["n"])[0]) * n_total
    if mode in ("full", "spider-refresh") and abs(claimed - n_total) > units_slack(
            int(n_clients), n_total, enc.scale):
        if node.secagg.config.sparse(len(node.secagg.roster_ids)):
            _no(f"{who}: round {rnd}'s sum claims {claimed:.6g} units of the federation's "
                 f"{n_total:g}; on a sparse masking graph this site cannot tell sites left "
                 "out of it from a lie")
        return f"claims {claimed:.6g} units, the federation's sites set up {n_total:g}"
    return _model_failure(node, fed, fields, init_round, rnd, mode)


def _model_failure(node, fed, fields, init_round: bool, rnd: int, mode: str) -> str | None:
    """The model's invariants on the statistic rebuilt from the aggregate as the server
    rebuilds it (:func:`~fedlatent.engine.secagg.secure_checks.rebuild`), and on each extra
    point's (None: they hold; not checked where the server checks none, nor under
    differential privacy, whose noise bound this site does not hold)."""
    from fedlatent.engine.contract.model import FederatedModel
    from fedlatent.engine.protocol.messages import point_keys
    from fedlatent.engine.secagg.secure_checks import points_problem, rebuild, v_drift

    model = node.model
    if type(model).check is FederatedModel.check or node.privacy is not None:
        return None
    n_total, n_clients = units(node)
    scale = node.secagg.config.encoding.scale
    half = n_clients / (2 * scale)
    if fed.quantizer is None and mode == "full":
        kept = groups(node)
        S_hat = None if init_round else Stats(kept["S_hat"], copy=False)
        with_v = bool(fed.control_variates) and not init_round
        V = Stats(kept["V"], copy=False) if with_v and kept["V"] else None
        if not with_v or V is not None:
            Q = Stats({k[6:]: np.asarray(v) for k, v in fields.items()
                       if k.startswith("delta/")}, copy=False)
            extra = v_drift(int(n_clients), scale, fed.alpha_for(
                {k: np.shape(v) for k, v in Q.items()}), rnd) if with_v else 0.0
            with np.errstate(over="ignore", invalid="ignore"):
                why = model.check(*rebuild(Q, S_hat, V, 1.0, n_total, half + extra))
            if why:
                return f"breaks the model's invariants: {why}"
    points, heads = [], {k.partition("/")[0] for k in fields}
    while point_keys(len(points) + 1)[0] in heads:  # (a multi-point round's extra points)
        prefix = point_keys(len(points) + 1)[0] + "/"
        points.append(Stats({k[len(prefix):]: np.asarray(v) for k, v in fields.items()
                             if k.startswith(prefix)}, copy=False))
    return points_problem(model, points, n_total, 1.0, half) if points else None


def _no(why: str) -> None:
    """Refuse: VerificationRefused with ``why``."""
    raise VerificationRefused(why)
