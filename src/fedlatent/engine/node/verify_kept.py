"""What a verifying site keeps between rounds (the parameters it evaluated, FedEM's ``S_hat``
and ``V``, packed in one float64 vector, and the federation's units), read by the round's check
(:mod:`~fedlatent.engine.node.verify`) and by the information pass after a verified fit
(:mod:`~fedlatent.engine.node.verify_info`)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping

import numpy as np

from fedlatent.engine.protocol.compiled import kernels, worth
from fedlatent.engine.stats import Stats

__all__ = ["GROUPS", "Plan", "Views", "fedem_step", "flat_step", "groups", "num", "plan",
           "store", "units"]

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


class Plan:
    """Where each group and each array of one layout lie in the packed vector (made once per
    layout: :func:`plan`). ``spans[group]`` a slice, ``rows[group]`` its ``(name, shape,
    slice)``, ``shapes[group]`` its ``{name: shape}``, ``named[group]`` its ``{name: (slice,
    shape)}``; ``delta`` the aggregate's field names
    of ``S_hat``'s arrays, in its order, ``messaged`` their names in a message
    (``S_hat/...``), ``listed`` the parameters' shapes in their order, ``sent`` their names
    in a message (``params/...``); ``aligned`` whether ``V`` (if kept) has ``S_hat``'s arrays
    in its order and the groups lie back to back in :data:`GROUPS`' order (the flat step
    adds them by place and writes the parameters first), or ``S_hat`` is not kept yet;
    ``fields`` the fields of the last round's message read with it (no ``S_hat/``, these
    parameters: a message with the same is read by name; shared by the nodes of a process)."""

    __slots__ = ("aligned", "delta", "fields", "listed", "messaged", "named", "rows", "sent",
                 "shapes", "size", "spans")

    def __init__(self, rows: tuple):
        self.rows: dict[str, tuple] = {g: () for g in GROUPS}
        self.spans: dict[str, slice] = {}
        for g in GROUPS:
            mine = [r for r in rows if r[0] == g]
            self.rows[g] = tuple((n, sh, slice(at, at + size)) for _, n, sh, at, size in mine)
            at = mine[0][3] if mine else 0
            self.spans[g] = slice(at, at + sum(r[4] for r in mine))
        self.size = sum(r[4] for r in rows)
        self.shapes = {g: {n: sh for n, sh, _ in self.rows[g]} for g in GROUPS}
        self.named = {g: {n: (at, sh) for n, sh, at in self.rows[g]} for g in GROUPS}
        self.delta = {"delta/" + n: None for n, _, _ in self.rows["S_hat"]}.keys()
        self.messaged = tuple("S_hat/" + n for n, _, _ in self.rows["S_hat"])
        self.listed = [sh for _, sh, _ in self.rows["params"]]
        self.sent = {"params/" + n: n for n, _, _ in self.rows["params"]}
        self.fields: frozenset | None = None  # (a message's fields, once read: see verify._sent)
        p, s, v = (self.spans[g] for g in GROUPS)
        packed = p.start == 0 and p.stop == s.start and (
            s.stop == self.size if v.stop == v.start else s.stop == v.start and v.stop == self.size)
        self.aligned = [r[:2] for r in self.rows["V"]] in (
            [], [r[:2] for r in self.rows["S_hat"]]) and (packed or not self.rows["S_hat"])

    def views(self, flat: np.ndarray, group: str) -> dict[str, np.ndarray]:
        """``{name: array}`` of ``group`` in ``flat`` (views)."""
        return {n: flat[at].reshape(sh) for n, sh, at in self.rows[group]}

    def lazy(self, flat: np.ndarray, group: str) -> Views:
        """:meth:`views` as a mapping that makes each view when it is read."""
        return Views(flat, self.named[group])


class Views(Mapping):
    """``{name: array}`` of one group of a packed vector (``rows``: ``{name: (slice,
    shape)}``, :attr:`Plan.named`'s), each a view of ``flat`` made when it is read (a check
    reads one or two)."""

    __slots__ = ("_flat", "_rows")

    def __init__(self, flat: np.ndarray, rows: dict):
        self._flat, self._rows = flat, rows

    def __getitem__(self, name: str) -> np.ndarray:
        at, shape = self._rows[name]
        return self._flat[at].reshape(shape)

    def __iter__(self):
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


def plan(node) -> Plan | None:
    """The :class:`Plan` of the node's kept layout (None: nothing kept yet), made once per
    layout and kept on the node while its layout array is the same."""
    held = node.state.get("verify/kept-layout")
    got = getattr(node, "_verify_plan", None)
    if got is None or got[0] is not held:
        got = (held, None if held is None else _plan(held.tobytes()))
        node._verify_plan = got
    return got[1]


@functools.lru_cache(maxsize=16)
def _plan(raw: bytes) -> Plan:
    return Plan(_layout(raw)[0])


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


def flat_step(kept: np.ndarray, at: Plan, words: np.ndarray, scale: float, gamma: float,
              alpha: float, params: list | None = None, compiled: bool | None = None
              ) -> np.ndarray:
    """The kept vector after the server's FedEM step of a round's aggregate (its ``delta/``
    fields' ``words``, int64, in ``S_hat``'s order, each decoded as the fixed-point encoding
    decodes it: as a float64 divided by ``scale``): ``S_hat + gamma agg (+ gamma V)``, ``V +
    alpha agg``, elementwise as :meth:`~fedlatent.engine.fedem.update.FedEMState.advance` adds
    them block by block (``p = 1``: verification needs every site; the same operations in the
    same order, so the same bits); its parameters ``params`` (arrays of ``at.listed``'s
    shapes, in order, as float64), or left unwritten (None). ``at.aligned``: the groups back
    to back. ``compiled``: in one compiled pass (:mod:`._flat_kernel`, the same bits) or in
    NumPy; None: compiled where numba pays (:func:`~fedlatent.engine.protocol.compiled.worth`:
    set up in the process already, or the process's verifying sites' work at scale)."""
    s, v = at.spans["S_hat"], at.spans["V"]
    if compiled is None:
        compiled = worth(words.size)  # (numba set up, or the process's checks at scale)
    if not compiled:
        tail = _numpy_tail(kept, at, words.astype(np.float64) / scale, gamma, alpha)
        if params is None:
            new = np.empty_like(kept)
            new[s.start:] = tail.reshape(-1)
            return new
        return np.concatenate([*params, tail], axis=None, dtype=np.float64, casting="unsafe")
    if params is None:
        new = np.empty_like(kept)
    else:  # (the parameters, then the old tail the kernel writes over)
        new = np.concatenate([*params, kept[s.start:]], axis=None, dtype=np.float64,
                             casting="unsafe")
    kernels("fedlatent.engine.node._flat_kernel").step_kernel(
        kept, np.ascontiguousarray(words, dtype=np.int64), float(scale), s.start,
        v.start if at.rows["V"] else -1, float(gamma), float(alpha), new)
    return new


def _numpy_tail(kept: np.ndarray, at: Plan, agg: np.ndarray, gamma: float, alpha: float
                ) -> np.ndarray:
    """The step's new ``S_hat`` (and ``V``: a second row) in NumPy, from the decoded ``agg``."""
    s, v = at.spans["S_hat"], at.spans["V"]
    if not at.rows["V"]:
        return kept[s] + (agg if gamma == 1.0 else gamma * agg)
    if gamma == alpha == 1.0:  # (S + agg and V + agg in one call)
        tail = kept[s.start:].reshape(2, -1) + agg
        tail[0] += kept[v]
        return tail
    tail = np.empty((2, s.stop - s.start))
    np.add(kept[s], gamma * agg, out=tail[0])
    tail[0] += gamma * kept[v]
    np.add(kept[v], alpha * agg, out=tail[1])
    return tail


def num(value, kind=int):
    """A scalar a transport may carry as a one-entry array."""
    if type(value) is np.ndarray and value.size == 1:
        return kind(value.item())
    return kind(np.asarray(value).reshape(-1)[0])


def _bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), np.uint8).copy()
