"""Subspace Newton's state machine (:class:`NewtonAccelerator`): the statistic and the extra
points of the next round, public functions of the history of aggregates and objectives. The
server's round loop (:mod:`fedlatent.engine.rounds.newton`, whose docstring has the
algorithm) and a verifying site's replay (:mod:`fedlatent.engine.node.replay_points`) run
this same code."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedlatent.engine.fedem.acceleration import SubspaceNewton
from fedlatent.engine.fedem.update import FedEMState
from fedlatent.engine.stats import Stats

__all__ = ["NewtonAccelerator", "newton_next", "newton_points", "secant_parts",
           "secant_subspace"]

#: a secant pair ``(D, G)``: columns ``x_j - x_0`` and ``F(x_j) - F(x_0)`` of one round
Pair = tuple[np.ndarray, np.ndarray]


def secant_subspace(pairs: Sequence[Pair], drop: float, own_only: bool = False
                    ) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The subspace of the secants and the EM map's Jacobian along it.

    Parameters
    ----------
    pairs : sequence of (ndarray of shape (p, m_i), ndarray of shape (p, m_i))
        Secant pairs ``(D, G)``, the newest round first: ``G`` holds the differences of ``F``
        along the columns of ``D``.
    drop : float
        A column whose part outside the span of the columns before it is below ``drop`` of
        its length is left out.
    own_only : bool, default False
        ``pairs`` is the round's own pair only: a column is left out only when it is exactly
        dependent (QR, relative 1e-10).

    Returns
    -------
    U : ndarray of shape (p, r) or None
        Orthonormal columns spanning the kept secants (None: none).
    JU : ndarray of shape (p, r) or None
        The Jacobian's action ``J U`` (``J D = G`` on the kept columns).
    """
    U, JU, _, _ = secant_parts(pairs, drop, own_only)
    return U, JU


def secant_parts(pairs: Sequence[Pair], drop: float, own_only: bool = False):
    """:func:`secant_subspace`'s ``U`` and ``JU``, and the kept columns' mask over the
    stacked secants and the triangular ``R`` of ``D_kept = U R`` (so ``J U c = G_kept beta``
    with ``beta = R^{-1} c``: the combination of the secants a Newton step makes)."""
    if not pairs:
        return None, None, None, None
    D, G = np.hstack([d for d, _ in pairs]), np.hstack([g for _, g in pairs])
    if own_only:
        Q, R = np.linalg.qr(D)
        keep = np.abs(np.diag(R)) > 1e-10 * np.abs(R).max()
    else:
        keep = _independent(D, drop)
    if not np.any(keep):
        return None, None, None, None
    Q, R = np.linalg.qr(D[:, keep])
    return Q, np.linalg.solve(R.T, G[:, keep].T).T, keep, R


def _independent(D: np.ndarray, drop: float) -> np.ndarray:
    """Mask of the columns of ``D`` kept by Gram-Schmidt in order: each whose residual after
    the kept ones before it exceeds ``drop`` of its norm."""
    keep = np.zeros(D.shape[1], dtype=bool)
    basis: list[np.ndarray] = []
    for j in range(D.shape[1]):
        v = D[:, j].copy()
        n0 = float(np.linalg.norm(v))
        for q in basis:
            v -= (q @ v) * q
        nv = float(np.linalg.norm(v))
        if n0 > 0.0 and nv > drop * n0:
            basis.append(v / nv)
            keep[j] = True
    return keep


class NewtonAccelerator:
    """The subspace-Newton state of one run (see the module docstring).

    Parameters
    ----------
    settings : SubspaceNewton
    valid : callable
        ``valid(S) -> bool``: whether ``S`` is in the model's domain.
    tol : float
        The stopping rule's tolerance on the mean objective.

    Attributes
    ----------
    extras : list of Stats
        The next round's extra points, in order: the Newton proposal, the over-relaxed point
        (either may be missing); the loop drops those whose M-step fails.
    converged : bool
        Whether the last round met the stopping rule.
    best : (float, Stats) or None
        The best objective evaluated and ``F`` at that point (what the fit ends on).
    kept : dict
        How often each kind of point was accepted ("newton", "over", "plain").
    out_of_domain : int
        Halvings of extra points that left the domain (server arithmetic, no round).
    accepted : int
        Which point of the last round was accepted: ``j >= 1`` its extra point ``x_j``, 0 the
        primary (and after a reset).
    columns : ndarray of int, shape (n, 2)
        The secant columns ``(round, point)`` the accelerator holds, in the order of its
        stacked secants (each ``F(x_{r,j}) - F(x_{r,0})``).
    client_state : bool
        Whether the model's clients keep a state their E-step advances (FedGMM's ``pi_c``,
        ``FederatedModel.point_state``): the messages then tell the clients how to carry it
        along (:meth:`client_fields`).
    penalty : callable or None
        ``penalty(params) -> float``, the model's ``objective_penalty``: points are compared
        (and the stopping rule applied) by the mean objective minus it, what EM ascends.
    """

    def __init__(self, settings: SubspaceNewton, valid: Callable[[Stats], bool],
                 tol: float, client_state: bool = False,
                 penalty: Callable[[dict], float] | None = None):
        self.settings, self.valid, self.tol = settings, valid, float(tol)
        self.client_state = bool(client_state)
        self.penalty = penalty
        self.kept = {"newton": 0, "over": 0, "plain": 0}
        self.out_of_domain = 0
        self.cap = settings.extra_points  # at most a round (lowered when sites refuse them)
        self.reset()

    def reset(self) -> None:
        """Forget the path (the last aggregate was not ``F``): the next round is evaluated
        alone and starts a new path."""
        self.a: np.ndarray | None = None
        self.La = float("nan")
        self.older: list[Pair] = []
        self.extras: list[Stats] = []
        self._kinds: dict[int, str] = {}  # id of an extra point -> "newton" or "over"
        self.best: tuple[float, Stats] | None = None
        self.converged = False
        self.accepted = 0
        self.older_cols: list[np.ndarray] = []  # (round, point) of the older pairs' columns
        self.columns = np.zeros((0, 2), dtype=np.int64)
        self._combos: dict[int, np.ndarray] = {}  # id of an extra point -> its coefficients

    def points(self, model, params: dict, n_total: float) -> list:
        """:func:`newton_points`."""
        return newton_points(self, model, params, n_total)

    def may_stop(self, complete: bool) -> bool | None:
        """The plain point's change from the accepted point, on a round with every reply."""
        return complete and self.converged

    def final(self, new_state: FedEMState, plain: FedEMState) -> FedEMState | None:
        """End on ``F`` of the best point evaluated (its objective is at least every
        other's). With :attr:`client_state`, on the last round's plain point instead: each
        client holds the state its E-step there gave (an extra point's, or an earlier
        round's, would need one more exchange for the clients to adopt it, and FedGMM's
        ``personalize()`` would pair the server's parameters with other weights); its
        objective is at least the accepted point's of the round before (an EM step)."""
        if self.client_state:
            return None if new_state is plain else plain
        if self.best is None or self.best[1] is new_state.S_hat:
            return None
        return FedEMState(self.best[1], plain.V)

    def client_fields(self, xs: Sequence[Stats], k: int) -> dict:
        """The fields of round ``k``'s message that carry the clients' own states along the
        accelerated path (none for a model without :attr:`client_state`): ``history``, the
        rounds whose point states each client keeps (``k`` and those of :attr:`columns`);
        ``accepted`` (the point of round ``k - 1`` kept: the clients adopt the state its
        E-step produced); for each extra point ``x_j`` of ``xs``, ``combine{j}`` = ``[gamma,
        beta_1..beta_n]`` over ``columns`` (n, 2): each client steps point ``j`` from
        ``s'_a + gamma (s'_a - s_a) + sum_i beta_i (s'_{r_i, j_i} - s'_{r_i, 0})`` (``s_a``,
        ``s'_a`` the accepted point's input and output states, ``s'_{r, j}`` the output of
        point ``j`` of round ``r``), the same combination the server made of the statistics.
        Server arithmetic on public sums: nothing new leaves a site."""
        if not self.client_state:
            return {}
        rounds = sorted({int(k)} | {int(r) for r in self.columns[:, 0]})
        out: dict = {"history": np.array(rounds, dtype=np.int64)}
        if self.accepted:
            out["accepted"] = int(self.accepted)
        if xs and len(self.columns):
            out["columns"] = self.columns.copy()
        for j, x in enumerate(xs, 1):
            out[f"combine{j}"] = self._combos[id(x)]
        return out

    def next_point(self, x0: Stats, f0: Stats, L0: float,
                   points: Sequence[tuple[Stats, Stats, float]] = (), k: int = 0) -> Stats:
        """The statistic the next round is sent (one of the ``F`` values evaluated), after
        round ``k`` evaluated ``x0`` (its statistic) with ``F(x0) = f0`` and mean objective
        ``L0``, and the extra points ``(x_j, F(x_j), L_j)``; sets :attr:`extras`,
        :attr:`converged` and :attr:`best`."""
        if not np.isfinite(L0):  # no objective: the plain step, and a new path
            self.reset()
            return f0
        finite = [j for j, (_, _, L) in enumerate(points, 1) if np.isfinite(L)]
        cands = [(x, f, float(L)) for x, f, L in points if np.isfinite(L)] + [(x0, f0, L0)]
        first = self.a is None
        self.converged = not first and abs(L0 - self.La) < self.tol
        for _, f, L in cands:
            if self.best is None or L > self.best[0]:
                self.best = (L, f)
        i = int(np.argmax([L for _, _, L in cands]))
        self._count(cands, i)
        self.accepted = 0 if i == len(cands) - 1 else finite[i]
        a, fa, self.La = cands[i]
        self.a = a.flatten()
        pairs, cols = self._pairs(cands, k, finite)
        U, JU, keep, R = secant_parts(pairs, self.settings.drop,
                                      own_only=len(cands) >= 2 and not self.older)
        if len(cands) >= 2 and self.settings.memory:
            self.older = pairs[:self.settings.memory]
            self.older_cols = cols[:self.settings.memory]
        self.columns = np.vstack(cols).astype(np.int64) if cols else np.zeros((0, 2), np.int64)
        self.extras = [] if first else self._candidates(fa, U, JU, keep, R)
        return fa

    def _count(self, cands, i: int) -> None:
        kind = "plain" if i == len(cands) - 1 else self._kinds.get(id(cands[i][0]), "over")
        self.kept[kind] += 1

    def _pairs(self, cands, k: int, finite: list[int]) -> tuple[list[Pair], list[np.ndarray]]:
        """The round's secant pair (extras minus the primary, the last candidate) before the
        older ones, and each pair's columns as ``(round, point)`` rows."""
        if len(cands) < 2:
            return list(self.older), list(self.older_cols)
        x0, f0 = cands[-1][0].flatten(), cands[-1][1].flatten()
        D = np.stack([x.flatten() - x0 for x, _, _ in cands[:-1]], 1)
        G = np.stack([f.flatten() - f0 for _, f, _ in cands[:-1]], 1)
        own = np.array([[int(k), j] for j in finite], dtype=np.int64)
        return [(D, G)] + list(self.older), [own] + list(self.older_cols)

    def _candidates(self, fa: Stats, U, JU, keep, R) -> list[Stats]:
        """The Newton proposal (with a subspace) and ``a + over * h(a)``, each in the domain
        (halved towards ``F(a)`` while not, dropped if still not); each point's combination
        of ``F(a) - a`` and of the secant columns kept for :meth:`client_fields`."""
        f = fa.flatten()
        h = f - self.a
        n, out = len(self.columns), []
        if U is not None:
            c = np.linalg.lstsq(JU - U, -h, rcond=None)[0]
            beta = np.zeros(n)
            if self.client_state:  # (only the clients' states need it)
                beta[keep] = np.linalg.solve(R, c)  # J U c = G_kept R^{-1} c
            out.append(("newton", f + JU @ c, np.concatenate([[0.0], beta])))
        w = self.settings.over  # a + w h(a) = F(a) + (w - 1) (F(a) - a)
        out.append(("over", self.a + w * h, np.concatenate([[w - 1.0], np.zeros(n)])))
        kept = [(kind, *self._in_domain(fa, f, y), coef) for kind, y, coef in out]
        self._kinds = {id(x): kind for kind, x, _, _ in kept if x is not None}
        self._combos = {id(x): lam * coef for _, x, lam, coef in kept if x is not None}
        return [x for _, x, _, _ in kept if x is not None]

    def _in_domain(self, fa: Stats, f: np.ndarray, y: np.ndarray
                   ) -> tuple[Stats | None, float]:
        """The point ``y`` (or halved towards ``f``) in the domain and the factor ``lambda``
        it was halved by (``y = f + lambda (y_0 - f)``); None when it never is."""
        lam = 1.0
        for _ in range(self.settings.backtracks + 1):
            if not np.all(np.isfinite(y)):
                return None, lam
            cand = fa.unflatten(y)
            if self.valid(cand):
                return cand, lam
            self.out_of_domain += 1
            y, lam = f + 0.5 * (y - f), 0.5 * lam
        return None, lam

def newton_points(accel: NewtonAccelerator, model, params, n_total: float) -> list:
    """The next round's extra points ``[(x_j, T(x_j))]`` (``T`` the model's M-step at the
    current ``params``); a point whose M-step fails or is not finite is dropped (and from
    ``accel.extras``)."""
    out = []
    for x in accel.extras:
        try:
            theta = model.server_step(x, params, n_total)
        except (FloatingPointError, OverflowError, ZeroDivisionError, ValueError,
                np.linalg.LinAlgError):
            continue
        if all(bool(np.all(np.isfinite(v))) for v in theta.values()):
            out.append((x, theta))
    out = out[:accel.cap]
    accel.extras = [x for x, _ in out]
    return out


def newton_next(accel: NewtonAccelerator, old: FedEMState, plain: FedEMState,
                objective: float, evaluated: Sequence[tuple[Stats, Stats, float]],
                k: int) -> FedEMState:
    """The state after round ``k`` with every reply (``plain`` its FedEM step, ``objective``
    its mean objective less the model's penalty, ``evaluated`` each extra point ``(x_j,
    F(x_j), L_j)``): ``plain`` with its statistic replaced by the accelerator's choice."""
    S = accel.next_point(old.S_hat, plain.S_hat, objective, evaluated, k)
    return plain if S is plain.S_hat else FedEMState(S, plain.V)
