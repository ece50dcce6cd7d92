"""The attacker: from a :class:`~attacks.transcript.Transcript`, the smallest client's rows.

Everything here uses only what the server recorded and what is public (the models' math, the
clients' unit counts, the messages the server sent). The equations, by kind:

exact solve from moments
    A model's statistics read as moment matrices ``M_b = sum_i r_ib z_i z_i^T`` with
    ``z_i = [1, row_i]`` (the adapter says how: a Gaussian component's ``(nk, sx, sxx)``
    about the broadcast centre, a regression block ``[[X^T X, X^T y], [., y^T y]]``). Every block
    of every reply of one client shares the same ``z_i``: whitening with their sum ``S``
    (rank = the client's rows when they are at most ``dim z``) makes them commute, and the
    eigenvectors of a random combination give the rows (joint diagonalization). One reply
    with two or more components is enough; blocks of several rounds together are differencing
    across rounds (HLCR's hard-labelled cluster blocks).
differencing of aggregates
    Under secure aggregation the server learns ``sum_{c in P} a_c T_c`` for each exchange's
    cohort ``P``; a statistic ``T_c`` that does not depend on the parameters (a client's total
    moments or category counts) is then a linear unknown per client, and overlapping cohorts
    (partial participation) solve for it by least squares.
nonlinear least squares
    Candidate rows replayed through the recorded messages on a fresh client node (the
    responsibilities are the model's functions of the rows and the broadcast parameters);
    residuals against every recorded reply; started from the client's released mean, a few
    restarts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedlatent.engine.privacy.attacks import rows_from_two_records
from fedlatent.engine.protocol.messages import unpack

__all__ = ["Attack", "Guess", "attack", "client_statistics", "full_recovery_error",
           "joint_diagonalize", "nonlinear_least_squares", "recovery_errors"]


@dataclass(frozen=True)
class Guess:
    """Rows the attacker claims (in the adapter's row layout) and how it got them."""

    method: str
    rows: np.ndarray


@dataclass
class Attack:
    """The attack's outcome on one transcript."""

    target: str | None
    guesses: list[Guess] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---- the smallest client's statistics, as the server can rebuild them -------------------------
def _estep_sums(down, up, cv_state: dict) -> dict[str, np.ndarray]:
    """A client's sums of one round from its reply ``Q_c = S_c / n - S_hat - V_c``: the server
    mirrors ``V_c`` (it starts from the initialization round's statistic, as
    :meth:`ClientNode._cv_init` does, and moves by ``alpha Q_c``)."""
    q, s_hat = unpack(up, "delta"), unpack(down, "S_hat")
    reset = unpack(down, "V_reset")
    use_cv = bool(down.get("control_variates", False)) and bool(s_hat)
    if use_cv and reset:
        cv_state["V"] = reset
    V = cv_state.get("V") if use_cv else None
    mean = {k: q[k] + s_hat.get(k, 0.0) + (V[k] if V is not None else 0.0) for k in q}
    if use_cv:
        alpha = float(down.get("alpha", 1.0))
        cv_state["V"] = {k: (V[k] if V is not None else 0.0) + alpha * q[k] for k in q}
    if not s_hat:
        cv_state["init"] = mean
    n = float(up.get("n", 1.0)) or 1.0
    return {k: v * n for k, v in mean.items()}


def client_statistics(tr, client: str) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(kind, fields, message)`` of every clear reply of ``client``: ``kind`` ``"estep"``
    (``fields``: the round's sums, un-differenced) or ``"query:<name>"`` (the reply as sent)."""
    out, cv_state = [], {}
    for e in tr.of(client):
        if e.method == "estep":
            out.append(("estep", _estep_sums(e.down, e.up, cv_state), e.down))
        elif e.method == "cv_init" and "init" in cv_state:
            s_hat = unpack(e.down, "S_hat")
            cv_state["V"] = {k: v - s_hat.get(k, 0.0) for k, v in cv_state["init"].items()}
        elif e.method == "query":
            out.append((f"query:{e.down.get('query')}", dict(e.up), e.down))
    return out


# ---- exact solve: joint diagonalization of moment blocks ---------------------------------------
def joint_diagonalize(blocks: list[np.ndarray], seed: int = 0, tol: float = 1e-9):
    """Rows ``z_i[1:]`` from blocks ``M_b = sum_i r_ib z_i z_i^T`` with ``z_i[0] = 1``
    (None when the blocks cannot hold them: no block, or zero mass). Exact when the rows are
    at most ``dim z`` and their block weights ``(r_ib / sum_b r_ib)_b`` differ."""
    B = [0.5 * (b + b.T) for b in blocks if np.all(np.isfinite(b)) and b[0, 0] > 0]
    if not B:
        return None
    S = np.sum(B, axis=0)
    w, U = np.linalg.eigh(S)
    keep = w > tol * w.max()
    U, w = U[:, keep], w[keep]
    W = U / np.sqrt(w)
    C = [W.T @ b @ W for b in B]
    rng = np.random.default_rng(seed)
    best, best_gap = None, -1.0
    for _ in range(4):  # the combination whose eigenvalues are best apart
        ev, O = np.linalg.eigh(np.tensordot(rng.normal(size=len(C)), C, axes=1))
        gap = np.diff(ev).min() if ev.size > 1 else 1.0
        if gap > best_gap:
            best, best_gap = O, gap
    A = (U * np.sqrt(w)) @ best  # columns: z_i sqrt(sum_b r_ib)
    with np.errstate(divide="ignore", invalid="ignore"):
        Z = (A / A[0]).T
    return Z[:, 1:] if np.all(np.isfinite(Z)) else None


def rows_from_moments(T: np.ndarray):
    """Rows from one total moment matrix ``sum_i z_i z_i^T`` (``z = [1, row]``): exact for one
    row (its mean) and for two (:func:`~fedlatent.engine.privacy.attacks.rows_from_two_records`);
    None for more (a total alone does not determine them)."""
    n = float(T[0, 0])
    if abs(n - 1.0) < 1e-6:
        return (T[1:, 0] / n)[None, :]
    if abs(n - 2.0) < 1e-6:
        return rows_from_two_records(n, T[1:, 0], T[1:, 1:])
    return None


# ---- differencing of secure aggregates over cohorts ----------------------------------------------
def _secure_fields(s, n_units: dict[str, float]):
    """``(kind, a, fields)`` with ``fields = sum_{c in cohort} a[c] T_c`` for the sums ``T_c``
    a client computes, or None (a round with control variates: the sum holds the unknown
    ``sum_c w_c V_c``)."""
    if s.method == "estep":
        delta, s_hat = unpack(s.sums, "delta"), unpack(s.message, "S_hat")
        if s_hat and bool(s.message.get("control_variates", False)):
            return None
        wsum = sum(s.weights.values())
        fields = {k: v + wsum * s_hat.get(k, 0.0) for k, v in delta.items()}
        return "estep", {c: s.weights[c] / max(n_units.get(c, 1.0), 1.0) for c in s.cohort}, \
            fields
    return f"query:{s.message.get('query')}", {c: 1.0 for c in s.cohort}, dict(s.sums)


def cohort_differencing(tr, adapter, target: str):
    """The target's parameter-free total (``adapter.total``) by least squares over every
    secure sum, or ``(None, why)`` when the cohorts do not separate it."""
    clients = sorted(tr.n_units)
    rows, values = [], []
    for s in tr.secure:
        got = _secure_fields(s, tr.n_units)
        if got is None:
            continue
        kind, a, fields = got
        T = adapter.total(kind, fields, s.message)
        if T is None:
            continue
        rows.append([a.get(c, 0.0) for c in clients])
        values.append(np.ravel(T))
    if not rows or target not in clients:
        return None, "no secure sum the attacker can read"
    A, Y = np.array(rows), np.array(values)
    t = clients.index(target)
    proj = np.linalg.pinv(A) @ A
    if np.abs(proj[t] - np.eye(len(clients))[t]).max() > 1e-8:
        return None, (f"{len(rows)} secure sums over cohorts that never separate {target!r} "
                      f"(rank {np.linalg.matrix_rank(A)} of {len(clients)} clients)")
    sol = np.linalg.lstsq(A, Y, rcond=None)[0]
    return sol[t].reshape(np.shape(T)), f"separated by {len(rows)} secure sums"


# ---- nonlinear least squares: replay candidate rows ----------------------------------------------
def _numeric(reply: dict[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for k, v in reply.items():
        a = np.asarray(v)
        if a.dtype.kind in "fiu" and k != "n_units":
            out[k] = a.astype(np.float64)
    return out


def replay_residuals(adapter, tr, client: str, rows: np.ndarray,
                     methods: tuple[str, ...] | None = None) -> np.ndarray:
    """Every recorded clear reply of ``client`` (of ``methods``; None: all) minus what a client
    holding ``rows`` would have sent to the same messages (relative to the recorded value's
    size). Every message is replayed, in order, so the client's state evolves as it did."""
    from fedlatent.engine.node.client import ClientNode
    from fedlatent.engine.site import SitePolicy

    # the attacker's own simulation of a client holding ``rows``: no floor of its own
    node = ClientNode(client, adapter.client_data(rows), policy=SitePolicy.for_simulation())
    res = []
    for e in tr.of(client):
        if e.method == "describe":
            continue
        try:
            mine = _numeric(node.handle(e.method, e.down))
        except Exception:  # noqa: BLE001 - a candidate the client could not hold
            return np.full(1, 1e6)
        if methods is not None and e.method not in methods:
            continue
        for k, v in _numeric(e.up).items():
            m = mine.get(k)
            if m is None or np.shape(m) != v.shape:
                res.append(np.full(max(v.size, 1), 1e3))
            else:
                res.append(np.ravel((m - v) / (1.0 + np.abs(v))))
    return np.concatenate(res) if res else np.zeros(1)


class _OutOfTime(Exception):
    pass


def _tracked(adapter, tr, client, shape, best: dict, deadline: float):
    """The rounds' replay residuals of rows ``v`` (flat), the best point kept in ``best``;
    :class:`_OutOfTime` past ``deadline``."""
    import time

    def fun(v):
        if time.monotonic() > deadline:
            raise _OutOfTime
        res = replay_residuals(adapter, tr, client, v.reshape(shape), ("estep",))
        cost = 0.5 * float(res @ res)
        if cost < best["cost"]:
            best.update(cost=cost, x=v.copy())
        return res

    return fun


def nonlinear_least_squares(adapter, tr, client: str, start: np.ndarray, spread: np.ndarray,
                            restarts: int = 2, seed: int = 0,
                            budget: float = 3.0) -> list[Guess]:
    """Rows of ``client`` minimizing :func:`replay_residuals` over the rounds' replies (their
    responsibilities are smooth functions of the rows; the hard-label and k-means queries are
    not), started at its released mean ``start`` (n, p) spread by ``spread`` (p,),
    ``restarts`` times, within ``budget`` seconds in all (the best point so far is kept)."""
    import time

    from scipy.optimize import least_squares

    rng = np.random.default_rng(seed)
    deadline = time.monotonic() + budget
    out = []
    for r in range(restarts):
        x0 = start + (0.0 if r == 0 and len(start) == 1 else 1.0) * rng.normal(
            size=start.shape) * spread
        best = {"cost": np.inf, "x": x0.ravel()}
        fun = _tracked(adapter, tr, client, start.shape, best, deadline)
        try:
            least_squares(fun, x0.ravel(), method="trf", max_nfev=30, xtol=1e-15, ftol=1e-15,
                          gtol=1e-15)
        except _OutOfTime:
            pass
        out.append(Guess(f"nonlinear least squares (restart {r}, cost {best['cost']:.2g})",
                         best["x"].reshape(start.shape)))
        if best["cost"] < 1e-20 or time.monotonic() > deadline:
            break
    return out


# ---- the attack ----------------------------------------------------------------------------------
def _moment_guesses(adapter, clear) -> list[Guess]:
    out, every = [], []
    for i, (kind, fields, msg) in enumerate(clear):
        blocks = adapter.blocks(kind, fields, msg)
        every.extend(blocks)
        rows = joint_diagonalize(blocks) if blocks else None
        if rows is not None:
            out.append(Guess(f"exact solve from reply {i} ({kind}, {len(blocks)} blocks)", rows))
    if len(every) > 1:
        rows = joint_diagonalize(every)
        if rows is not None:
            out.append(Guess(f"exact solve from all {len(every)} blocks (across rounds)", rows))
    return out


def _released_mean(adapter, clear):
    for kind, fields, msg in clear:
        T = adapter.total(kind, fields, msg)
        if T is not None and np.ndim(T) == 2 and T[0, 0] > 0:
            n = float(T[0, 0])
            mean = T[1:, 0] / n
            var = np.maximum(np.diag(T[1:, 1:]) / n - mean**2, 0.0)
            return int(round(n)), mean, np.sqrt(var) + 1e-3 * (1.0 + np.abs(mean))
    return None


def attack(tr, adapter, *, target: str | None = None, nls: bool = True) -> Attack:
    """Every attack above on client ``target`` (None: the one with the fewest units); the
    guesses of each."""
    target = target if target is not None else tr.smallest_client()
    out = Attack(target)
    if target is None:
        out.notes.append("nothing recorded: no client took part")
        return out
    clear = client_statistics(tr, target)
    out.notes.append(f"{len(clear)} clear replies of {target!r}, {len(tr.secure)} secure sums")
    out.guesses += _moment_guesses(adapter, clear)
    out.guesses += adapter.exact(tr, target, clear)
    T, why = cohort_differencing(tr, adapter, target) if tr.secure else (None, "")
    if why:
        out.notes.append(why)
    if T is not None:
        rows = adapter.rows_from_total(T)
        if rows is not None:
            out.guesses.append(Guess("differencing of secure sums over cohorts", rows))
    if nls and adapter.replayable and any(k == "estep" for k, _, _ in clear) \
            and not _verified(adapter, tr, target, out.guesses):
        got = _released_mean(adapter, clear)
        if got is not None and got[0] <= 4:
            n, mean, spread = got
            out.guesses += nonlinear_least_squares(adapter, tr, target,
                                                   np.tile(mean, (n, 1)), spread)
    return out


def _verified(adapter, tr, client, guesses) -> bool:
    """Whether a guess replays every round's reply (the attacker can check its own answer; the
    rounds' sums do not depend on the rows' order, which the attacker cannot know)."""
    return any(np.abs(replay_residuals(adapter, tr, client, g.rows, ("estep",))).max() < 1e-7
               for g in guesses if g.rows.shape[1] == adapter.row_width)


def recovery_errors(guesses: list[Guess], truth: np.ndarray) -> np.ndarray:
    """For each true row, its distance (max abs) to the nearest row any guess holds (inf when
    there is no guess of the rows' width)."""
    truth = np.asarray(truth, dtype=np.float64)
    best = np.full(len(truth), np.inf)
    for g in guesses:
        if g.rows.ndim != 2 or g.rows.shape[1] != truth.shape[1]:
            continue
        d = np.abs(truth[:, None, :] - g.rows[None, :, :]).max(axis=2)
        best = np.minimum(best, d.min(axis=1))
    return best


def full_recovery_error(guesses: list[Guess], truth: np.ndarray) -> float:
    """The best single guess's worst row: max over true rows of the distance (max abs) to its
    nearest row in that guess, minimized over guesses (inf: no guess)."""
    errs = [recovery_errors([g], truth).max() for g in guesses]
    return float(min(errs)) if errs else float("inf")
