"""Verified rounds of accelerated EM at a site (issue 38): the statistic SQUAREM or subspace
Newton sends next and the extra points of a round, replayed from the verified aggregates
(:class:`~fedlatent.engine.node.replay_points.PointsReplay`), anything else refused.

:func:`~fedlatent.engine.node.verify.check_exchange` calls :func:`accelerated_state` with
the plain FedEM step of the exchange before (its replayed aggregate), then, once the round's
parameters are those of the accelerated state, :func:`check_points`. Everything the
accelerator reads is in the verified aggregate: a round's secure sum carries ``w_c delta``,
``n / N`` and ``objective / N`` and, for each extra point ``j``, ``w_c point{j}`` and
``objective{j} / N`` (:func:`~fedlatent.engine.secagg.secure.mask_reply`); the objectives
cross as two limbs, recombined here as the server recombines them. The replay's state lives
between messages in the node's state under ``verify/points/`` (a Flower node is rebuilt for
each message).

A round whose sum misses a client's units (a dropped site) is not the EM map: the server
restarts its path there, and so does the replay (``complete=False``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from fedlatent.engine.fedem.acceleration import resolve_acceleration
from fedlatent.engine.fedem.update import FedEMState
from fedlatent.engine.node.replay_points import PointsReplay
from fedlatent.engine.protocol.messages import unpack
from fedlatent.engine.secagg.secure import _LIMB  # (the objective's two limbs)
from fedlatent.engine.stats import Stats

__all__ = ["accelerated", "accelerated_state", "check_points", "n_points", "restart"]

_P = "verify/points/"


def accelerated(fed) -> bool:
    """Whether the setup's federation runs accelerated EM (its rounds may carry points)."""
    return resolve_acceleration(fed.acceleration) is not None


def n_points(msg: dict[str, Any]) -> int:
    """The extra points a round's message asks for."""
    points = msg.get("points")
    if points is None or (type(points) is int and points == 0):  # (a plain round's)
        return 0
    return int(np.asarray(points or 0).reshape(-1)[0])


def _load(node, fed, n_total: float) -> PointsReplay:
    arrays = {k[len(_P):]: np.asarray(v) for k, v in node.state.items() if k.startswith(_P)}
    return PointsReplay.from_arrays(node.model, fed.acceleration, n_total, arrays)


def _store(node, pr: PointsReplay) -> None:
    for k in [k for k in node.state if k.startswith(_P)]:
        del node.state[k]
    node.state.update({_P + k: np.asarray(v) for k, v in pr.to_arrays().items()})


def _objective(total: dict, name: str, n_total: float) -> float:
    """A summed objective of the decoded aggregate, as the server recombines it."""
    o = np.asarray(total[name + "/hi"]) * _LIMB + np.asarray(total[name + "/lo"])
    return float(o.reshape(()) * n_total)


def accelerated_state(node, fed, old: FedEMState, plain: FedEMState, previous: dict,
                      total: dict, k: int, n_total: float) -> tuple[PointsReplay, FedEMState]:
    """``(replay, state)``: the state the round after round ``k`` is sent, from round ``k``'s
    verified aggregate ``total`` (decoded, its fields ``/ N`` or ``* w_c``) and the plain
    FedEM step ``plain`` of it; ``old`` the state round ``k`` was sent."""
    pr = _load(node, fed, n_total)
    if old.S_hat is None:
        return pr, plain
    m = len({key.partition("/")[0] for key in total
             if key.startswith("point") and key.partition("/")[0][5:].isdigit()})
    points = []
    for j in range(1, m + 1):
        P = {key: np.reshape(v, np.shape(plain.S_hat[key]))
             for key, v in unpack(total, f"point{j}").items()}
        points.append((Stats(P), _objective(total, f"objective{j}", n_total)))
    units = float(np.asarray(total["n"]).reshape(-1)[0]) * n_total
    complete = abs(units - n_total) < 0.5  # (one client's units missing: a dropped site)
    state = pr.next_state(old, plain, previous, k=k,
                          objective_sum=_objective(total, "objective", n_total),
                          units=n_total, points=points, complete=complete)
    return pr, state


def check_points(node, pr: PointsReplay, msg: dict[str, Any], params: dict, rnd: int
                 ) -> str | None:
    """Why round ``rnd``'s extra points (``params{j}``, ``S_hat{j}``) and path fields are not
    those the replay gives at the round's parameters ``params`` (None: they are, and the
    replay is kept in the node's state)."""
    m = n_points(msg)
    sent = [unpack(msg, f"params{j}") for j in range(1, m + 1)]
    stats = [unpack(msg, f"S_hat{j}") for j in range(1, m + 1)]
    why = pr.points_refusal(sent, params, rnd, node.client_id,
                            sent_points=stats if all(stats) else None)
    why = why or pr.fields_refusal(msg, rnd, node.client_id)
    if why is None:
        _store(node, pr)
    return why


def restart(node, fed, n_total: float) -> PointsReplay:
    """The replay after a discarded round: the server restarts its path (as after a
    skipped round), so does the site."""
    pr = _load(node, fed, n_total)
    pr.accel.reset()
    return pr
