"""What a verifying site keeps between rounds (the parameters it evaluated, FedEM's ``S_hat``
and ``V``, packed in one float64 vector, and the federation's units), read by the round's check
(:mod:`~fedlatent.engine.node.verify`) and by the information pass after a verified fit
(:mod:`~fedlatent.engine.node.verify_info`)."""

from __future__ import annotations

import functools
import json

import numpy as np

from fedlatent.engine.stats import Stats

__all__ = ["GROUPS", "fedem_step", "groups", "num", "store", "units"]

#: what a verifying site keeps of the round before, packed in one float64 vector
#: (``verify/kept``) laid out by ``verify/kept-layout`` (JSON: group, name, shape)
GROUPS = ("params", "S_hat", "V")


def groups(node) -> dict[str, dict[str, np.ndarray]]:
    """``{group: {name: array}}`` of what the node kept (views into its packed vector)."""
    out: dict[str, dict[str, np.ndarray]] = {g: {} for g in GROUPS}
    held = node.state.get("verify/kept-layout")
    if held is None:
        return out
    flat = node.state["verify/kept"]
    for group, name, shape, at, size in _layout(held.tobytes())[0]:
        out[group][name] = flat[at:at + size].reshape(shape)
    return out


@functools.lru_cache(maxsize=16)
def _layout(raw: bytes) -> tuple[tuple, tuple]:
    """``((group, name, shape, offset, size), ...)`` of the layout bytes ``raw`` and their
    ``(group, name, shape)`` (parsed once per layout)."""
    rows, at = [], 0
    for group, name, shape in json.loads(raw.decode()):
        size = int(np.prod(shape, dtype=np.int64))
        rows.append((group, name, tuple(shape), at, size))
        at += size
    return tuple(rows), tuple(r[:3] for r in rows)


def store(node, mine: dict[str, dict]) -> None:
    """Keep ``mine`` (``{group: {name: array}}``) as one vector and its layout (rewritten
    only when the names or shapes change)."""
    key, parts = [], []
    for g in GROUPS:
        for k, v in mine[g].items():
            v = np.asarray(v, dtype=np.float64)
            key.append((g, k, v.shape))
            parts.append(v.ravel())
    held = node.state.get("verify/kept-layout")
    if held is None or _layout(held.tobytes())[1] != tuple(key):
        node.state["verify/kept-layout"] = _bytes(json.dumps([[g, k, list(sh)]
                                                              for g, k, sh in key]))
    node.state["verify/kept"] = np.concatenate(parts) if parts else np.zeros(0)


def units(node) -> tuple[float, float]:
    """The federation's units N and its number of clients, as the first exchange said."""
    held = node.state["verify/units"]
    return float(held[0]), float(held[1])


def fedem_step(node, fed, kept: dict[str, dict], total: dict):
    """``(state, new, k)``: the FedEM state round ``k`` (the last verified round) was sent
    (from what the node ``kept``: :func:`groups`), and the server's FedEM step of round
    ``k``'s decoded aggregate ``total`` (its ``delta/`` fields), as the server takes it with
    the federation ``fed``'s step size, control variates and alpha."""
    from fedlatent.engine.fedem.update import FedEMState  # (a verified round's: a node

    S_prev, V_prev = kept["S_hat"], kept["V"]  # answering plain rounds never loads it)
    state = FedEMState(Stats(S_prev, copy=False) if S_prev else None,  # (the update copies
                       Stats(V_prev, copy=False) if V_prev else None)  # what it changes)
    Q = Stats({k[len("delta/"):]: v.reshape(S_prev[k[len("delta/"):]].shape)
               if S_prev else v for k, v in total.items() if k.startswith("delta/")},
              copy=False)
    init_round = not S_prev
    k_prev = num(node.state["verify/round"])
    new = (FedEMState(None, None) if init_round else state).advance(
        Q, init_round, 1.0 if init_round else fed.gamma(k_prev), 1.0,
        fed.alpha_for({k: np.shape(v) for k, v in Q.items()}), bool(fed.control_variates))
    return state, new, k_prev


def num(value, kind=int):
    """A scalar a transport may carry as a one-entry array."""
    return kind(np.asarray(value).reshape(-1)[0])


def _bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), np.uint8).copy()
