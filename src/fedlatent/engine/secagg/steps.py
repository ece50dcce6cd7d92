"""The site's side of secure aggregation in the engine: its answers to method ``secagg`` (the
set-up's steps, the consistency round and the reveal) and the masked form of its replies.

:mod:`fedlatent.engine.secagg.secure` says what crosses and why; a node calls these
(:class:`~fedlatent.engine.node.client.ClientNode`), the secrets staying in its
:class:`~fedlatent.engine.secagg.client.SecAggClient`.
"""

from __future__ import annotations

import functools
import json
import math
from typing import Any

import numpy as np

from fedlatent.engine.protocol.messages import ERROR_KEY, objective_field, statistic_field
from fedlatent.engine.secagg.encoding import Flat, Layout
from fedlatent.engine.secagg.protocol import id_list

__all__ = ["mask_reply", "node_identity", "reply_fields", "secagg_step"]

_KEY = "secagg/"
#: the objective (a log-likelihood, unbounded below) crosses as two limbs, hi * 2^20 + lo,
#: hi an integer and 0 <= lo < 2^20: per-unit objectives down to -2^40 keep full resolution
_LIMB = 2.0**20



def _config(msg: dict[str, Any]):
    from fedlatent.engine.secagg import FixedPoint, SecAggConfig

    degree, local = msg.get("degree"), msg.get("local_threshold")
    if msg.get("participation") is None:
        raise ValueError("the secure aggregation set-up names no participation: a client "
                         "cannot check the masking graph's degree and threshold without it")
    return SecAggConfig(int(msg["threshold"]),
                        FixedPoint(scale=float(msg["scale"]), bound=float(msg["bound"])),
                        slots=int(msg["slots"]), degree=None if degree is None else int(degree),
                        local_threshold=None if local is None else int(local),
                        participation=float(msg["participation"]))


#: the fields of a roster message (:meth:`~fedlatent.engine.secagg.protocol.Roster.to_message`)
_ROSTER_FIELDS = ("ids", "enc_key", "self_commit", "nonce", "signature", "graph_seed", "members",
                  "openings")


def node_identity(node):
    """The identity a node's secure aggregation uses: the site's own when it pins a roster,
    else the one its runtime provisioned for the sites it holds (in-process, simulation:
    :attr:`ClientNode.provisioned`), else the site's own (keys without a roster, or None)."""
    own = getattr(node, "identity", None)
    if own is not None and own.roster is not None:
        return own
    return getattr(node, "provisioned", None) or own


def secagg_step(node, msg: dict[str, Any]) -> dict[str, Any]:
    """A client node's answer to method ``secagg`` (``msg["step"]``: keys, open, roster,
    shares once per fit; consistency and reveal per exchange). The client's secrets stay on
    the node (:attr:`ClientNode.secagg`)."""
    from fedlatent.engine.secagg import SecAggClient

    step = str(msg["step"])
    identity = node_identity(node)
    if step == "keys":  # a new fit: new secrets; only a commitment leaves
        run, rnd = str(msg.get("run", "")), int(msg.get("round", 0))
        _check_identity(node, identity, run)
        commit = msg.get("graph_commit")
        node.secagg = SecAggClient(node.client_id, _config(msg), run=run, round=rnd,
                                   graph_commit=None if commit is None else bytes.fromhex(commit))
        return node.secagg.commitment()
    client = node.secagg
    if client is None:
        raise ValueError(f"client {node.client_id!r}: secure aggregation step {step!r} before "
                         "the key set-up; the server must start with step 'keys'")
    signer = None if identity is None else identity.keys
    if step == "open":
        closed = np.asarray(msg.get("closed"))
        if closed.dtype != np.uint8 or closed.shape != (32,):
            raise ValueError(f"client {node.client_id!r}: the closed list's digest must be 32 "
                             "bytes (uint8)")
        return client.open(closed.tobytes(), int(msg["n"]), signer=signer)
    if step == "roster":
        client.receive_peer_keys({k: v for k, v in msg.items() if k in _ROSTER_FIELDS},
                                 trust=None if identity is None else identity.roster)
        peers, sealed = client.sealed_shares()
        return {"to": json.dumps(peers), "sealed": sealed}
    if step == "shares":
        return _take_shares(node, client, msg)
    if step == "consistency":  # (no survivors listed: every participant but the dropped)
        survivors = msg.get("survivors")
        return client.consistency(int(msg["round"]), str(msg["exchange"]),
                                  None if survivors is None else json.loads(survivors),
                                  json.loads(msg.get("dropped", "[]")))
    if step == "reveal":
        return client.reveal(int(msg["round"]), str(msg["exchange"]),
                             confirmations=msg.get("confirm"))
    raise KeyError(f"client {node.client_id!r}: unknown secure aggregation step {step!r}")


def _take_shares(node, client, msg: dict[str, Any]) -> dict[str, Any]:
    """Step ``shares``: open the sealed shares the server relays."""
    client._need_roster()  # no roster taken (or it was refused): nothing to open
    senders = id_list(msg.get("from"), f"client {node.client_id!r}: the relayed shares' "
                      "'from'", error=ValueError)
    sealed = np.asarray(msg.get("sealed"))
    if sealed.dtype != np.uint8 or sealed.ndim != 2 or len(sealed) != len(senders):
        raise ValueError(f"client {node.client_id!r}: the relayed shares must be a "
                         f"({len(senders)}, bytes) uint8 array, one row per sender; got "
                         f"{sealed.dtype} {sealed.shape}")
    client.receive_sealed(senders, sealed)
    return {"ok": 1}


def _check_identity(node, identity, run: str) -> None:
    """With a pinned roster, the set-up needs a run id, once per site, and the site must be
    rostered."""
    if identity is None:
        return
    if identity.roster is not None:
        if not run:
            raise ValueError(f"client {node.client_id!r}: the secure aggregation set-up names "
                             "no run; a site with a pinned roster signs keys only for a named "
                             "run (an unnamed one could be replayed)")
        if node.client_id not in identity.roster:
            raise ValueError(f"client {node.client_id!r} is not in its own pinned roster; its "
                             "peers could not authenticate it: add it to the roster")
        identity.claim_run(node.client_id, run, "the secure aggregation key set-up")


def mask_reply(node, method: str, msg: dict[str, Any], reply: dict[str, Any]) -> dict[str, Any]:
    """The masked form of a reply computed as without secure aggregation: ``w_c * delta/*``
    and ``n / N``, ``objective / N`` for an E-step, every numeric field ``/ N`` for a query.
    A reply carrying an error is sent as it is (the client counts as dropped)."""
    if ERROR_KEY in reply:
        return reply
    if node.secagg is None:
        raise ValueError(f"client {node.client_id!r}: asked for a masked reply before the key "
                         "set-up")
    fields = reply_fields(reply, method == "estep", float(msg[_KEY + "weight"]),
                          float(msg[_KEY + "unit"]))
    return node.secagg.mask_announced(fields, int(msg[_KEY + "round"]),
                                      str(msg[_KEY + "exchange"]),
                                      msg[_KEY + "participants"], slot=int(msg[_KEY + "slot"]))


def reply_fields(reply: dict[str, Any], estep: bool, w: float, unit: float) -> Flat:
    """The fields a masked reply carries, flat in their sorted order (:class:`~.encoding.Flat`):
    each numeric field of ``reply`` times ``w`` (an E-step's statistic) or ``unit`` (1 / N),
    a scalar as one entry; an E-step's objectives (unbounded) times ``unit`` in two limbs
    ``hi * 2^20 + lo`` (a multi-point round: each point's). Every entry the same float
    product as field by field, written in one vector: the fields joined, then each run of
    fields with one factor multiplied at once (the runs found once per kind of reply)."""
    kinds = _kinds(tuple(k for k, v in reply.items() if not isinstance(v, str)), estep)
    parts, limbs = {}, []
    for k, kind in kinds.items():
        a = np.asarray(reply[k], dtype=np.float64)
        if kind == "o":  # unbounded: two limbs
            o = (a.reshape(1) if a.ndim == 0 else a) * unit
            if o.shape == (1,) and math.isfinite(o[0]) and o[0]:  # a number: its limbs in Python's
                hi = float(math.floor(o[0] / _LIMB))  # floats (the same IEEE operations),
                limbs.append((k, hi, float(o[0]) - hi * _LIMB))  # written after the join
                parts[k + "/hi"] = parts[k + "/lo"] = o
                continue
            hi = np.floor(o / _LIMB)
            parts[k + "/hi"], parts[k + "/lo"] = hi, o - hi * _LIMB
        else:
            parts[k] = a
    layout, runs = _runs(tuple((k, parts[k].shape or (1,)) for k in sorted(parts)), estep,
                         tuple(kinds.items()))
    x = np.concatenate([parts[k].reshape(-1) for k in layout.names])
    for lo, hi, kind in runs:
        x[lo:hi] *= w if kind == "w" else unit
    at = layout.offsets
    for k, hi, lo in limbs:
        x[at[k + "/hi"]], x[at[k + "/lo"]] = hi, lo
    return Flat(layout, x)


@functools.lru_cache(maxsize=64)
def _kinds(keys: tuple[str, ...], estep: bool) -> dict[str, str]:
    """Each of a reply's numeric fields ``keys``: ``"w"`` (a statistic, times the weight),
    ``"o"`` (an objective, in limbs) or ``"u"`` (times 1 / N)."""
    return {k: "w" if estep and statistic_field(k) else "o" if estep and objective_field(k)
            else "u" for k in keys}


@functools.lru_cache(maxsize=64)
def _runs(shapes: tuple, estep: bool, kinds: tuple) -> tuple[Layout, tuple]:
    """The layout of ``shapes`` and its runs ``(start, stop, kind)`` of consecutive entries
    with one factor (``kind`` "w" or "u"; the limbs are scaled already)."""
    kind = dict(kinds)
    layout, runs, at = Layout.of_shapes(shapes), [], 0
    for k, shp in shapes:
        m, f = math.prod(shp), kind.get(k)
        if f is not None and runs and runs[-1][2] == f and runs[-1][1] == at:
            runs[-1][1] = at + m
        elif f is not None:
            runs.append([at, at + m, f])
        at += m
    return layout, tuple(map(tuple, runs))
