"""A client's own model state along an accelerated path (``acceleration="newton"``).

A model whose client step advances a state of the client's own (FedGMM's mixing weights
``pi_c``; ``FederatedModel.point_state``) has a fit state ``z = (x, s_1 .. s_C)``: the server's
statistic and every client's state. Subspace Newton
(:class:`~fedlatent.engine.rounds.newton.NewtonAccelerator`) evaluates, each round, points
that are affine combinations of the evaluations it holds; it sends their coefficients
(public server arithmetic on sums: nothing new leaves a site) and each client forms the same
combination of the states it kept. The round message's fields:

- ``history``: the rounds whose point states a client keeps (the round itself and those of
  ``columns``); a message without it keeps nothing (every other model);
- ``accepted = j``: the point of the round before the server kept; the client steps from the
  state that point's E-step produced (``s'_a``); ``s_a`` is the state that point was stepped
  from;
- ``columns`` (n, 2) rows ``(round, point)`` and, for each extra point ``j``,
  ``combine{j} = [gamma, beta_1 .. beta_n]``: point ``j`` is stepped from
  ``s'_a + gamma (s'_a - s_a) + sum_i beta_i (s'_{r_i, j_i} - s'_{r_i, 0})``, put back in its
  domain by the model's ``project_point_state`` (on the client: nothing sent).

Kept per client: ``pstate{r}.{j}/...`` (the output of point ``j`` of round ``r``, 0 the
round's own statistic) for the rounds of ``history``, ``pinput{r}.{j}/...`` (what it was
stepped from) for the last round. A message naming a point the client holds no state for is
refused (a deviating server).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from fedlatent.engine.protocol.messages import unpack

__all__ = ["MAX_HISTORY", "UnheldState", "combination", "extra_points", "history_rounds",
           "in_key", "out_key",
           "point_round", "stale"]

#: arrays of one kept state (rows: clients on the batched path, one row one by one)
State = dict[str, np.ndarray]


#: rounds whose point states a client keeps at most: a message whose ``history`` names more
#: (or a round not yet run) is refused, so what a site keeps stays bounded whatever a server
#: sends (subspace Newton names ``memory + 1`` rounds; ``memory`` 2 by default)
MAX_HISTORY = 16


def history_rounds(msg: Mapping[str, Any]) -> set[int] | None:
    """The rounds a message's ``history`` names (None: no ``history``); ValueError when it
    names more than :data:`MAX_HISTORY` rounds or a round other than this one or before."""
    if "history" not in msg:
        return None
    rnd = int(msg["round"])
    hist = {int(r) for r in np.ravel(np.asarray(msg["history"], dtype=np.int64))}
    if len(hist) > MAX_HISTORY or any(r < 0 or r > rnd for r in hist):
        raise ValueError(f"round {rnd}'s 'history' names {len(hist)} round(s) "
                         f"{sorted(hist)[:10]}: a client keeps point states of at most "
                         f"{MAX_HISTORY} rounds, each this one or before (a deviating server)")
    return hist


class UnheldState(LookupError):
    """A message names a kept state the client does not hold; the text says which."""


def out_key(r: int, j: int) -> str:
    """The state prefix of point ``j``'s E-step output in round ``r``."""
    return f"pstate{int(r)}.{int(j)}"


def in_key(r: int, j: int) -> str:
    """The state prefix of the state point ``j`` of round ``r`` was stepped from."""
    return f"pinput{int(r)}.{int(j)}"


def point_round(prefix: str) -> tuple[str, int] | None:
    """``("pstate" | "pinput", round)`` of a kept state's prefix; None for any other."""
    for kind in ("pstate", "pinput"):
        if prefix.startswith(kind):
            head = prefix[len(kind):].partition(".")[0]
            if head.isdigit():
                return kind, int(head)
    return None


def stale(prefix: str, rnd: int, history: set[int]) -> bool:
    """Whether a kept state is dropped in round ``rnd``: inputs of an earlier round, outputs
    of rounds the message's ``history`` no longer names."""
    got = point_round(prefix)
    if got is None:
        return False
    kind, r = got
    return r != rnd if kind == "pinput" else r not in history and r != rnd


def combination(msg: Mapping[str, Any], j: int, get: Callable[[str], State | None],
                a_out: State, a_in: State | None) -> State:
    """Extra point ``j``'s state before projection (see the module docstring): ``a_out`` the
    accepted point's output (the state the round starts from), ``a_in`` its input (None: not
    held), ``get(prefix)`` a kept state or None. Raises UnheldState naming a point the client
    holds no state for, ValueError when the coefficients do not match the columns."""
    rnd = int(msg["round"])
    coef = np.asarray(msg.get(f"combine{j}", np.zeros(1)), dtype=np.float64).ravel()
    cols = np.asarray(msg.get("columns", np.zeros((0, 2))), dtype=np.int64).reshape(-1, 2)
    if coef.size != 1 + len(cols):
        raise ValueError(f"extra point {j}'s 'combine{j}' has {coef.size} coefficients for "
                         f"{len(cols)} columns (1 + one per column expected)")
    out = {k: np.array(v, dtype=np.float64, copy=True) for k, v in a_out.items()}
    if coef[0] != 0.0:
        if a_in is None:
            raise UnheldState(f"the state the point accepted in round {rnd - 1} was stepped "
                              "from")
        for k in out:
            out[k] += coef[0] * (a_out[k] - a_in[k])
    for b, (r, jj) in zip(coef[1:], cols, strict=True):
        if b == 0.0:
            continue
        s1, s0 = get(out_key(r, jj)), get(out_key(r, 0))
        if s1 is None or s0 is None:
            raise UnheldState(f"point {jj} of round {r}" if s1 is None
                              else f"the statistic's own point of round {r}")
        for k in out:
            out[k] += b * (s1[k] - s0[k])
    return out


def extra_points(node, msg: dict[str, Any], mode: str) -> int:
    """How many extra points ``x_j`` the round asks (``msg["points"]``, parameters
    ``params{j}/``); ValueError naming the client where they cannot be the EM map at
    those points: under differential privacy (each point is a release the budget did not
    plan), with mini-batches or SPIDER (not the EM map), in the initialization round."""
    m = int(msg.get("points", 0) or 0)
    if m <= 0:
        return 0
    who = f"client {node.client_id!r}: a round with {m} extra point(s)"
    if node.privacy is not None:
        raise ValueError(f"{who} is not available under differential privacy: each point "
                         "is a release the privacy budget did not plan; use "
                         "Federation(acceleration=None) or a single point a round")
    if mode != "full":
        raise ValueError(f"{who} needs full passes (E-step mode 'full', got {mode!r}): a "
                         "mini-batch or SPIDER statistic is not the EM map at a point; "
                         "drop batch_size/variance_reduction or the extra points")
    if not unpack(msg, "S_hat"):
        raise ValueError(f"{who} is not available in the initialization round (no S_hat "
                         "yet, the statistics are sent as they are): send points from the "
                         "next round on")
    missing = [j for j in range(1, m + 1) if not unpack(msg, f"params{j}")]
    if missing:
        raise ValueError(f"{who} carries no parameters for point(s) {missing} "
                         f"(message keys 'params{missing[0]}/...')")
    return m
