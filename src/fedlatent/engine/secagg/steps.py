"""The site's side of secure aggregation in the engine: its answers to method ``secagg`` (the
set-up's steps, the consistency round and the reveal) and the masked form of its replies.

:mod:`fedlatent.engine.secagg.secure` says what crosses and why; a node calls these
(:class:`~fedlatent.engine.node.client.ClientNode`), the secrets staying in its
:class:`~fedlatent.engine.secagg.client.SecAggClient`.
"""

from __future__ import annotations

import json
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
    a scalar as one entry; an E-step's objectives (unbounded) in two limbs ``hi * 2^20 +
    lo`` (a multi-point round: each point's). Written once into one vector, each entry the
    same float product as field by field."""
    parts: dict[str, tuple[np.ndarray, float | None]] = {}
    for k, v in reply.items():
        if isinstance(v, str):
            continue
        a = np.asarray(v, dtype=np.float64)
        a = a.reshape(1) if a.ndim == 0 else a  # as records carry it
        if estep and objective_field(k):
            o = a * unit
            hi = np.floor(o / _LIMB)
            parts[k + "/hi"], parts[k + "/lo"] = (hi, None), (o - hi * _LIMB, None)
        else:
            parts[k] = (a, w if estep and statistic_field(k) else unit)
    names = sorted(parts)
    layout = Layout.of_shapes(tuple((k, parts[k][0].shape) for k in names))
    x, at = np.empty(layout.size, dtype=np.float64), 0
    for k in names:
        a, f = parts[k]
        out = x[at:at + a.size]
        if f is None:
            out[:] = a.reshape(-1)
        else:
            np.multiply(a.reshape(-1), f, out=out)
        at += a.size
    return Flat(layout, x)
