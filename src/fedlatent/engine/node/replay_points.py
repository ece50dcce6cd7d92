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
from fedlatent.engine.protocol.messages import pack, unpack
from fedlatent.engine.stats import Stats

__all__ = ["PointsReplay"]


def _canon(S: Stats) -> Stats:
    """``S`` with its blocks in sorted order: the flat vectors the accelerator keeps (and
    :meth:`PointsReplay.to_arrays` stores) do not depend on the order a message had."""
    return Stats({k: S[k] for k in sorted(S)}, copy=False)


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
        x0, fx0 = _canon(old.S_hat), _canon(plain.S_hat)  # (the order the accelerator keeps)
        if isinstance(self.accel, Accelerator):
            S = self.accel.next_point(x0, fx0, objective_sum / units)
        else:
            xs = self.accel.extras
            evaluated = []
            if points and len(points) == len(xs):
                evaluated = [(x, _canon(fx), obj / units - self._penalty(j)) for j, (x, (
                    fx, obj)) in enumerate(zip(xs, points, strict=True), 1)]
            S = newton_next(self.accel, FedEMState(x0, old.V), FedEMState(fx0, plain.V),
                            objective_sum / units - self._penalty(0), evaluated, k).S_hat
        if S is fx0:
            return plain
        return FedEMState(Stats({key: S[key] for key in plain.S_hat}, copy=False), plain.V)

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
                       rtol: float = REPLAY_RTOL,
                       sent_points: Sequence[dict] | None = None) -> str | None:
        """Why round ``round_``'s extra points are not those the history of verified
        aggregates gives at the round's parameters ``params`` (None: they are, or a prefix).

        ``sent``: each point's parameters ``params{j}``, in order; ``sent_points``: each
        point's statistic ``S_hat{j}`` (the message carries both). With ``sent_points``, each
        is checked against the replayed ``x_j`` and ``params{j}`` against ``T`` of it; the
        replay then goes on from the server's numbers (within the tolerance of its own), so
        the rounding of two floating-point paths does not compound along the path: subspace
        Newton's secants amplify a difference in the last bits by 20-300x a round."""
        replayed = self.extra_points(params, len(sent))
        if len(sent) > len(replayed) or (sent_points is not None
                                          and len(sent_points) != len(sent)):
            return (f"client {client!r}: round {round_} refused: it carries {len(sent)} extra "
                    f"point(s), the history of verified aggregates gives {len(replayed)}; "
                    f"extra point {len(replayed) + 1} is not derived from it")
        mine = [(x.to_dict(), theta) for x, theta in replayed]
        if sent_points is not None:
            why = self._adopt(sent_points, mine, params, round_, client, rtol)
            if why is not None:
                return why
        for j, (theta, (_, own)) in enumerate(zip(sent, mine), 1):
            why = params_refusal(theta, own, round_, client, rtol)
            if why is not None:
                return why.replace(": parameter ", f": extra point {j}'s parameter ", 1)
        return None

    def _adopt(self, sent_points, mine, params, round_, client, rtol) -> str | None:
        """Check each sent statistic against the replayed one, then keep the sent ones (and
        ``T`` of them in ``mine``) as the server's path."""
        for j, (x, (own, _)) in enumerate(zip(sent_points, mine), 1):
            why = params_refusal(x, own, round_, client, rtol)
            if why is not None:
                return why.replace(": parameter ", f": extra point {j}'s statistic ", 1)
        a = self.accel
        if not isinstance(a, NewtonAccelerator):
            return None
        adopted = [_canon(Stats(x)) for x in sent_points]
        combos = [a._combos.get(id(x)) for x in a.extras]
        a.extras = adopted
        a._combos = {id(x): c for x, c in zip(adopted, combos, strict=True) if c is not None}
        self._thetas = [self.model.server_step(x, params, self.n_total) for x in adopted]
        mine[:] = [(x.to_dict(), t) for x, t in zip(adopted, self._thetas, strict=True)]
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

    # ---- the replay's state between messages (a Flower node is built afresh for each) ------
    def to_arrays(self) -> dict[str, np.ndarray]:
        """The replay's state as flat arrays (``node.state`` keeps only arrays): restore it
        with :meth:`from_arrays`. Only what later points depend on (not the counters of kept
        points, nor the best point, which the server uses only to end the fit)."""
        out: dict[str, np.ndarray] = {}
        for j, t in enumerate(self._thetas):
            out.update(pack(f"theta{j}", t))
        a = self.accel
        if isinstance(a, Accelerator):
            out["sq/numbers"] = np.array([a.step_max, float(a.em_step), float(a._sent_plain),
                                          np.nan if a.pending is None else a.pending[1]])
            for name, S in (("s0", a.base and a.base[0]), ("s1", a.base and a.base[1]),
                            ("s2", a.pending and a.pending[0])):
                if S:
                    out.update(pack(f"sq/{name}", S.to_dict()))
            return out
        out["nt/numbers"] = np.array([a.La, float(a.accepted), float(a.cap),
                                      float(len(a.older)), float(len(a.extras))])
        out["nt/columns"] = np.asarray(a.columns, dtype=np.float64)
        if a.a is not None:
            out["nt/a"] = a.a
        for i, ((D, G), cols) in enumerate(zip(a.older, a.older_cols, strict=True)):
            out.update({f"nt/D{i}": D, f"nt/G{i}": G, f"nt/cols{i}": np.asarray(cols, float)})
        for j, x in enumerate(a.extras):
            out.update(pack(f"nt/x{j}", x.to_dict()))
            out[f"nt/combo{j}"] = np.asarray(a._combos.get(id(x), np.zeros(0)))
        return out

    @classmethod
    def from_arrays(cls, model, acceleration, n_total: float,
                    arrays: dict[str, np.ndarray]) -> PointsReplay:
        """The replay :meth:`to_arrays` stored (``arrays`` may hold other keys too)."""
        out = cls(model, acceleration, n_total)
        a = out.accel
        stats = (lambda name: _canon(Stats(unpack(arrays, name))))
        n_thetas = len({k.split("/")[0] for k in arrays if k.startswith("theta")})
        out._thetas = [unpack(arrays, f"theta{j}") for j in range(n_thetas)]
        if isinstance(a, Accelerator):
            if "sq/numbers" not in arrays:
                return out
            step_max, em_step, sent_plain, bar = np.asarray(arrays["sq/numbers"], float)
            a.step_max, a.em_step, a._sent_plain = float(step_max), bool(em_step), \
                bool(sent_plain)
            if any(k.startswith("sq/s0/") for k in arrays):
                a.base = (stats("sq/s0"), stats("sq/s1"))
            if any(k.startswith("sq/s2/") for k in arrays):
                a.pending = (stats("sq/s2"), float(bar))
            return out
        if "nt/numbers" not in arrays:
            return out
        La, accepted, cap, n_older, n_extras = np.asarray(arrays["nt/numbers"], float)
        a.La, a.accepted, a.cap = float(La), int(accepted), int(cap)
        a.columns = np.asarray(arrays["nt/columns"], dtype=np.float64).astype(np.int64)
        a.columns = a.columns.reshape(-1, 2)
        a.a = np.asarray(arrays["nt/a"], dtype=np.float64) if "nt/a" in arrays else None
        a.older = [(np.asarray(arrays[f"nt/D{i}"], float), np.asarray(arrays[f"nt/G{i}"], float))
                   for i in range(int(n_older))]
        a.older_cols = [np.asarray(arrays[f"nt/cols{i}"]).astype(np.int64).reshape(-1, 2)
                        for i in range(int(n_older))]
        a.extras = [stats(f"nt/x{j}") for j in range(int(n_extras))]
        a._combos = {id(x): np.asarray(arrays[f"nt/combo{j}"], dtype=np.float64)
                     for j, x in enumerate(a.extras)}
        return out
