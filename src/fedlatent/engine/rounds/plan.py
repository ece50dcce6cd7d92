"""The plan of one round: what the server asks of whom, fixed before anything is sent."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedlatent.engine.contract.model import Params
from fedlatent.engine.fedem.federation import Federation
from fedlatent.engine.fedem.seeds import server_rng
from fedlatent.engine.fedem.update import round_message
from fedlatent.engine.protocol.messages import pack
from fedlatent.engine.stats import Stats

__all__ = ["RoundPlan", "draw_positions", "make_plan"]


@dataclass(frozen=True)
class RoundPlan:
    """One round of the loop, as every collector reads it.

    Attributes
    ----------
    k : int
        The round (1 is the initialization round of a fresh run).
    seed : int
        The run's seed.
    init_round : bool
        Whether this is the initialization round (every client, statistics sent as they are).
    gamma, p, alpha : float
        Step size, participation probability and control-variate step of the round.
    idx : ndarray of int
        Positions (in the runtime's client order) of the clients drawn.
    msg : dict
        The round message every drawn client gets (settings, parameters, ``S_hat``).
    shapes : dict of str to tuple
        The blocks of the statistic and their shapes.
    reply_bytes : int
        Bytes of one reply (uncompressed in the initialization round, else as quantized).
    points : tuple of Stats
        The extra points ``x_1 .. x_m`` of a multi-point round (accelerated EM): each client
        also returns its mean statistic and objective at each ``T(x_j)`` (the message carries
        ``points = m`` and the parameters ``T(x_j)`` under the prefix ``params{j}``); empty
        for an ordinary round.
    """

    k: int
    seed: int
    init_round: bool
    gamma: float
    p: float
    alpha: float
    idx: np.ndarray
    msg: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]
    reply_bytes: int
    points: tuple[Stats, ...] = ()

    @property
    def mode(self) -> str:
        """The E-step of the round: ``full``, ``batch``, ``spider-refresh`` or ``spider``."""
        return str(self.msg.get("mode", "full"))


def draw_positions(n: int, p: float, seed: int, k: int, init_round: bool) -> np.ndarray:
    """Positions of the clients of round ``k``: everyone in the initialization round, else
    Bernoulli(p) each from the server's generator of that round (the draw of
    :func:`~fedlatent.engine.fedem.update.select_active`, the same in every runtime)."""
    if init_round or p >= 1.0:
        return np.arange(n)
    return np.flatnonzero(server_rng(seed, k).random(n) < p)


def make_plan(fed: Federation, k: int, seed: int, state, params, n_clients: int,
              shapes: dict[str, tuple[int, ...]], alpha: float,
              sizes: tuple[int, int],
              points: Sequence[tuple[Stats, Params]] = (),
              client_fields: Mapping[str, Any] | None = None) -> RoundPlan:
    """Round ``k``'s plan from the federation and the server's ``state`` and ``params``;
    ``sizes`` are the bytes of one uncompressed reply and of one quantized reply; ``points``
    the extra points ``(x_j, T(x_j))`` of a multi-point round (see :class:`RoundPlan`; the
    message carries both: ``S_hat{j}`` and ``params{j}``);
    ``client_fields``: the accelerator's fields that carry the clients' own model states
    along its path (:meth:`~fedlatent.engine.rounds.newton.NewtonAccelerator.client_fields`:
    ``history``, ``accepted``, ``columns``, ``combine{j}``), added to the message as they are."""
    init_round = not state.initialized
    gamma = 1.0 if init_round else fed.gamma(k)
    p = float(fed.participation)
    msg = round_message(fed, seed, k, init_round, alpha)
    msg.update(pack("params", params))
    if state.S_hat is not None:
        msg.update(pack("S_hat", state.S_hat.to_dict()))
    msg.update(client_fields or {})
    if points:
        msg["points"] = len(points)
        for j, (x, theta) in enumerate(points, 1):
            msg.update(pack(f"params{j}", theta))
            if x is not None:  # the point itself: a verifying site checks it against its
                # replay and then goes on from the server's numbers (node/replay_points.py)
                msg.update(pack(f"S_hat{j}", x.to_dict()))
    return RoundPlan(k, int(seed), init_round, gamma, p, alpha,
                     draw_positions(n_clients, p, int(seed), k, init_round), msg, shapes,
                     sizes[0] if init_round else sizes[1], tuple(x for x, _ in points))
