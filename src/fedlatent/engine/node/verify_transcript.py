"""A verifying site's check of a transcript (issue 38), shared by the round's check
(:mod:`~fedlatent.engine.node.verify`) and by the group tests and discards of a failing round
(:mod:`~fedlatent.engine.node.verify_groups`), which both import this module (it imports
neither).

What lives here:

- :class:`VerificationRefused`, the refusal of a verifying site (public as
  ``fedlatent.engine.node.verify.VerificationRefused``), and :func:`refuse`;
- :func:`checked`: the transcript of the exchange of the site's kept leaf, read from a message
  (:func:`~fedlatent.engine.secagg.sumtree.read_transcript`), checked (the site's own leaf
  and path reach the root whose projections are those of the claimed sum ``A``:
  :func:`~fedlatent.engine.secagg.sumtree.verify_leaf`; the tree's leaves are the set-up's
  roster in its order: :func:`roster_place`; each site of its neighbourhood that was not in
  the sum holds zero: :func:`zeros`), and :func:`decoded`, ``A``'s fields;
- :func:`check_transcript`: that check for a round's message (the exchange before), its
  digest then bound into this exchange's confirmations
  (:meth:`~fedlatent.engine.secagg.client.SecAggClient.bind_digest`, with the setup, units
  and seed: :func:`~.verify_fields.bound`);
- :func:`federation` and :func:`accelerated`: the setup's federation, parsed once per node
  and setup.

The secure-aggregation modules are imported at the first check (:func:`tools`): a node that
answers plain rounds loads none of them.
"""

from __future__ import annotations

import functools
import json
from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = ["VerificationRefused", "accelerated", "check_transcript", "checked", "decoded",
           "federation", "refuse", "roster_place", "tools", "zeros"]

_V = "verify/"
#: what the round's check says of the exchange its transcript is of
BEFORE = "the sum of the exchange before"


class VerificationRefused(ValueError):
    """A verifying site refuses an exchange (a transcript or parameters it cannot accept)."""


def refuse(why: str | None) -> None:
    """VerificationRefused with ``why`` (nothing when None)."""
    if why:
        raise VerificationRefused(why)


@functools.cache
def tools() -> SimpleNamespace:
    """What a transcript's check calls, imported at the first one and kept (no import
    statement run every round)."""
    import bisect

    from fedlatent.engine.node.verify_fields import bound
    from fedlatent.engine.secagg import sumtree
    from fedlatent.engine.secagg.encoding import Layout
    from fedlatent.engine.secagg.protocol import SecureAggregationError

    return SimpleNamespace(bisect=bisect, bound=bound, sumtree=sumtree, Layout=Layout,
                           SecureAggregationError=SecureAggregationError)


def check_transcript(node, leaf, msg: dict[str, Any], rnd: int, exch: str,
                     who: str) -> np.ndarray:
    """The claimed sum's words (``A``: :func:`decoded` gives its fields) of the exchange
    ``leaf`` is from, once its transcript in ``msg`` is checked (:func:`checked`); the digest
    bound to this exchange's confirmations (each neighbour in that sum must confirm it before
    this site reveals)."""
    if _V + "A" not in msg:
        raise VerificationRefused(f"{who}: it carries no transcript of the exchange before "
                                  f"({leaf[0].decode()}), in which this site took part: the "
                                  "aggregate the parameters come from is unverified")
    t = tools()
    try:
        words, digest, split = checked(node, leaf, msg, who)
    except t.SecureAggregationError as err:
        raise VerificationRefused(f"{who}: {err}") from None
    node.secagg.bind_digest(rnd, exch, t.bound(node, digest), confirm=split[0])
    return words


def checked(node, leaf, msg: dict[str, Any], who: str, what: str = BEFORE,
            missing_ok: bool = False):
    """``(A, digest, (survivors, absent))``: the claimed sum's words (uint64: :func:`decoded`
    gives its fields) of the exchange of ``leaf`` (``(label, shapes, z)``, this site's kept
    contribution to ``what``), its transcript's digest and the split of this site's
    neighbourhood in it, once the transcript
    in ``msg`` is checked (see the module docstring). SecureAggregationError when the
    transcript is unreadable or its tree does not hold this site's leaf (the caller words it;
    ``missing_ok``: None where the site's own leaf does not reach the root);
    VerificationRefused for a tree of other leaves than the roster's."""
    t = tools()
    tree = t.sumtree
    label, _, z = leaf
    at, n, A, c, path = tree.read_transcript(msg, z.size)
    sa = node.secagg
    ids = sa.roster_ids
    roster_place(node.client_id, ids, at, n, who)
    claim = tree.claim_bytes(msg)  # (hashed as sent)
    try:
        digest = tree.verify_leaf(label, at, n, node.client_id, z, A, c, None, path, claim)
    except t.SecureAggregationError:
        if missing_ok:
            return None
        raise
    split = sa.leaf_split(label)
    if split is None:  # (a state written before it kept its neighbourhood's split)
        raise VerificationRefused(f"{who}: this site kept no record of which of its "
                                  f"neighbours were in {what}, so it cannot check their "
                                  "leaves")
    zeros(label, ids, split[1], msg, (A, c, claim), digest, who)
    return A, digest, split


def decoded(node, A: np.ndarray, shapes: tuple) -> dict[str, np.ndarray]:
    """The fields of the claimed sum ``A`` (its words, of the layout ``shapes``: the site's
    own leaf's), decoded in one pass (FixedPoint.decode's arithmetic on every word: the int64
    words as float64, divided by the scale), then split by field (the layout's spans made
    once)."""
    values = A.view(np.int64) / node.secagg.config.encoding.scale
    return tools().Layout.of_shapes(shapes).unflatten(values, copy=False)


def roster_place(me: str, ids: list[str], at: int, n: int, who: str) -> None:
    """The tree's leaves are the set-up's roster in its order: ``n`` its size, this site's
    leaf its rank; VerificationRefused naming the round otherwise (a leaf outside the roster
    could hold any vector)."""
    if n == len(ids) and 0 <= at < n and ids[at] == me:  # (its place: the common case)
        return
    mine = tools().bisect.bisect_left(ids, me)
    if n != len(ids) or at != mine:
        raise VerificationRefused(
            f"{who}: its transcript's tree has {n} leaves with this site's at {at}; the "
            f"set-up's roster has {len(ids)} sites with this site at {mine}: a tree of other "
            "leaves than the roster's could hold a vector no site answered for")


def zeros(label: bytes, ids: list[str], absent, msg, claim, digest: bytes, who: str) -> None:
    """Each site of this site's neighbourhood that was not in the exchange's sum (dropped,
    or no participant) holds a zero leaf in the tree this site's own leaf reached
    (:func:`~fedlatent.engine.secagg.sumtree.verify_zero`; ``claim``: ``(A, c, its bytes)``);
    VerificationRefused naming the first that does not, or whose path is missing."""
    if not absent:
        return
    t = tools()
    paths = t.sumtree.read_paths(msg)
    A, c, raw = claim
    for u in absent:
        i = t.bisect.bisect_left(ids, u)
        n, path = paths.get(i, (len(ids), None))
        if path is None or n != len(ids) or not t.sumtree.verify_zero(
                label, i, n, u, A, c, path, digest, raw):
            raise VerificationRefused(
                f"{who}: {u!r} was not in the sum of the exchange before (it dropped out or "
                f"took no part), yet its leaf ({i}) in the tree is not shown to hold zero: the "
                "aggregate may hold a vector no site answered for")


def federation(node):
    """The setup's federation (parsed once per node and setup)."""
    return _setup_of(node)[1]


def accelerated(node) -> bool:
    """Whether the setup's federation runs accelerated EM (its rounds may carry points)."""
    return _setup_of(node)[2]


def _setup_of(node) -> tuple:
    """``(the state's array, its federation, whether it is accelerated)``, kept on the node
    while the state holds the same array (``verify/federation``)."""
    held = node.state["verify/federation"]
    got = getattr(node, "_verify_federation", None)
    if got is None or got[0] is not held:
        from fedlatent.engine.fedem.acceleration import resolve_acceleration
        from fedlatent.engine.fedem.federation import Federation

        fed = Federation.from_config(json.loads(held.tobytes().decode())["federation"])
        got = (held, fed, resolve_acceleration(fed.acceleration) is not None)
        node._verify_federation = got
    return got
