"""A site's replay of accelerated EM (issue 38): the statistic and the extra points a round of
SQUAREM or subspace Newton evaluates, recomputed from the history of verified aggregates, and
any other point refused.

The accelerators are public functions of that history: SQUAREM's next statistic of the last
three EM maps and the round's objective (:mod:`fedlatent.engine.fedem.squarem`), subspace
Newton's accepted point, secants and proposals of the rounds' maps and objectives
(:mod:`fedlatent.engine.fedem.subspace`). :class:`PointsReplay` holds the site's own copy of
the server's accelerator, built from the setup's settings and run on the same code (moved
out of ``engine/rounds`` for this), fed each round's verified aggregate: the plain FedEM step
(:func:`~fedlatent.engine.node.replay.replay`), the round's summed objective and, for each
extra point, its summed statistic and objective. The aggregate of a round with a missing or
refused reply is not the EM map, so both sides restart their path (``complete=False``).

:meth:`PointsReplay.points_refusal` compares the extra points' parameters a message carries
(``params{j}``) with ``T(x_j)`` of the replayed points ``x_j``: more points than the replay
gives, or a point whose parameters differ by more than
:data:`~fedlatent.engine.node.replay.REPLAY_RTOL` of their largest entry, is refused, naming
the round, the point and the largest difference. Fewer points are accepted (the server sends
at most ``cap`` once sites refuse extra points: a prefix of the replayed ones, which the
replay then keeps, as the server does).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedlatent.engine.contract.model import FederatedModel
from fedlatent.engine.fedem.acceleration import SubspaceNewton, resolve_acceleration
from fedlatent.engine.fedem.squarem import Accelerator, domain_test
from fedlatent.engine.fedem.subspace import NewtonAccelerator, newton_next, newton_points
from fedlatent.engine.fedem.update import FedEMState
from fedlatent.engine.node.replay import REPLAY_RTOL, params_refusal
from fedlatent.engine.stats import Stats

__all__ = ["PointsReplay"]


class PointsReplay:
    """A site's copy of the server's accelerator (see the module docstring).

    Parameters
    ----------
    model : FederatedModel
        The setup's model.
    acceleration : str, dict, Squarem or SubspaceNewton
        The fit's ``Federation(acceleration=...)`` (its recorded config:
        :func:`~fedlatent.engine.fedem.acceleration.acceleration_config`).
    n_total : float
        The units of every client at setup.

    Attributes
    ----------
    accel : Accelerator or NewtonAccelerator
    """

    def __init__(self, model, acceleration, n_total: float):
        settings = resolve_acceleration(acceleration)
        if settings is None:
            raise ValueError("PointsReplay replays accelerated EM: acceleration is None")
        self.model, self.n_total = model, float(n_total)
        self._params: dict = {}
        self._thetas: list[dict] = []  # T(x_j) of the extra points the last round evaluated
        valid = domain_test(model, self.n_total, lambda: self._params)
        if isinstance(settings, SubspaceNewton):
            own = getattr(type(model), "objective_penalty", None)
            penalty = (None if own in (None, FederatedModel.objective_penalty)
                       else model.objective_penalty)
            self.accel = NewtonAccelerator(settings, valid, 0.0, bool(getattr(
                model, "point_state", False)), penalty)
        else:
            self.accel = Accelerator(settings, valid)

    def next_state(self, old: FedEMState, plain: FedEMState, previous: dict, *,
                   k: int, objective_sum: float, units: float,
                   points: Sequence[tuple[Stats, float]] = (), complete: bool = True
                   ) -> FedEMState:
        """The state round ``k + 1`` is sent after round ``k``.

        Parameters
        ----------
        old : FedEMState
            The state round ``k`` was sent (``old.S_hat`` its primary point).
        plain : FedEMState
            The FedEM step of round ``k``'s verified aggregate (:func:`~fedlatent.engine.
            node.replay.replay`'s state).
        previous : dict
            The parameters round ``k`` evaluated (the M-step's ``previous``; the domain test
            runs at them, as the server's does).
        k : int
            The round.
        objective_sum, units : float
            Round ``k``'s summed objective and units (verified with the aggregate).
        points : sequence of (Stats, float)
            Each extra point's verified ``(sum_c w_c S_c(T(x_j)), summed objective)``, in
            order (empty: a one-point round, or the extras were not returned).
        complete : bool
            Whether every client's reply was aggregated (else the path restarts).
        """
        if old.S_hat is None:  # the initialization round: no path yet
            return plain
        if not complete or not units or plain.S_hat is None:
            self.accel.reset()
            return plain
        self._params = previous
        if isinstance(self.accel, Accelerator):
            S = self.accel.next_point(old.S_hat, plain.S_hat, objective_sum / units)
            return plain if S is plain.S_hat else FedEMState(S, plain.V)
        xs = self.accel.extras
        evaluated = []
        if points and len(points) == len(xs):
            evaluated = [(x, fx, obj / units - self._penalty(j))
                         for j, (x, (fx, obj)) in enumerate(zip(xs, points, strict=True), 1)]
        return newton_next(self.accel, old, plain, objective_sum / units - self._penalty(0),
                           evaluated, k)

    def _penalty(self, j: int) -> float:
        """The model's objective penalty at the parameters of point ``j`` (0: the primary)."""
        if self.accel.penalty is None:
            return 0.0
        return float(self.accel.penalty(self._params if j == 0 else self._thetas[j - 1]))

    def extra_points(self, params: dict, n_sent: int) -> list[tuple[Stats, dict]]:
        """The next round's extra points ``[(x_j, T(x_j))]`` at the round's parameters
        ``params``: those the replay gives (SQUAREM: none), then only the first ``n_sent`` are
        kept, as the server's cap keeps them."""
        self._params = params
        if isinstance(self.accel, Accelerator):
            return []
        self.accel.cap = SubspaceNewton.extra_points
        out = newton_points(self.accel, self.model, params, self.n_total)
        self.accel.extras = [x for x, _ in out[:max(int(n_sent), 0)]]
        self._thetas = [t for _, t in out[:max(int(n_sent), 0)]]
        return out

    def points_refusal(self, sent: Sequence[dict], params: dict, round_: int, client: str,
                       rtol: float = REPLAY_RTOL) -> str | None:
        """Why round ``round_``'s extra points (``sent``: each point's parameters
        ``params{j}``, in order) are not those the history of verified aggregates gives at
        the round's parameters ``params`` (None: they are, or a prefix of them); the replay
        keeps the points sent, as the server does."""
        replayed = self.extra_points(params, len(sent))
        if len(sent) > len(replayed):
            return (f"client {client!r}: round {round_} refused: it carries {len(sent)} extra "
                    f"point(s), the history of verified aggregates gives {len(replayed)}; "
                    f"extra point {len(replayed) + 1} is not derived from it")
        for j, (theta, (_, mine)) in enumerate(zip(sent, replayed), 1):
            why = params_refusal(theta, mine, round_, client, rtol)
            if why is not None:
                return why.replace(": parameter ", f": extra point {j}'s parameter ", 1)
        return None

    def fields_refusal(self, msg: dict, round_: int, client: str,
                       rtol: float = REPLAY_RTOL) -> str | None:
        """Why round ``round_``'s fields that carry the clients' own states along the path
        (``history``, ``accepted``, ``columns``, ``combine{j}``: a model with
        ``point_state``, FedGMM) are not the replayed accelerator's (None: they are). Call
        after :meth:`points_refusal` of the same round."""
        if not isinstance(self.accel, NewtonAccelerator):
            return None
        mine = self.accel.client_fields(self.accel.extras, round_)
        theirs = {k: msg[k] for k in msg if k in ("history", "accepted", "columns")
                  or str(k).startswith("combine")}
        why = params_refusal(theirs, {k: np.asarray(v, dtype=np.float64)
                                      for k, v in mine.items()}, round_, client, rtol)
        return None if why is None else why.replace(": parameter", ": path field", 1)
