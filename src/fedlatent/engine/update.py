"""The FedEM server update and the plan of each round, written once for every model.

Dieuleveut, Fort, Moulines and Robin (2021), slide "FedEM with partial participation", with
client weights ``w_c`` (``n_c / n`` or ``1 / n_clients``)::

    active clients A ~ Bernoulli(p) each
    for c in A:  S_c = local mean statistic at T(S_hat)   (full pass, mini-batch or SPIDER)
                 Delta_c = S_c - S_hat - V_c ;  send Q_c = Quant(Delta_c) ;  V_c += alpha Q_c
    server:      S_hat += gamma * ( (1/p) sum_{c in A} w_c Q_c + V )
                 V     += alpha * sum_{c in A} w_c Q_c

With p = 1, gamma = 1 and no quantizer this is exactly EM on the pooled data: ``S_hat`` becomes
``sum_c w_c S_c`` whatever ``V``. Without control variates ``V_c = V = 0`` ("naive FedEM").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .federation import Federation
from .model import FederatedModel, server_rng
from .stats import Stats

__all__ = ["DOMINANCE", "FedEMState", "ReplyScreen", "client_weights", "dominant_client",
           "round_message", "select_active"]

#: rounding allowed, per unit of magnitude, when a statistic is rebuilt as Q_c + S_hat + V_c
_REBUILD_EPS = 64 * np.finfo(np.float64).eps
#: sums beyond this magnitude cannot be aggregated (a weighted mean of them overflows)
_MAX_SUM = 1e306


@dataclass
class FedEMState:
    """The server's statistics: ``S_hat`` (None before the initialization round) and the mean
    control variate ``V`` (None without control variates)."""

    S_hat: Stats | None = None
    V: Stats | None = None

    @property
    def initialized(self) -> bool:
        return self.S_hat is not None

    def after_init(self, got: dict[str, Stats], weights: dict[str, float],
                   use_cv: bool) -> FedEMState:
        """The state after the initialization round: ``S_hat = sum_c w_c S_c`` (every client
        answered), ``V = 0``."""
        S_new = None
        for c in weights:
            S_new = got[c] * weights[c] if S_new is None else S_new.add_(got[c], weights[c])
        return FedEMState(S_new, S_new.zeros_like() if use_cv else None)

    def after_init_flat(self, Q: np.ndarray, w: np.ndarray, template: Stats,
                        use_cv: bool) -> FedEMState:
        """:meth:`after_init` with the statistics as rows of ``Q`` (A, F), weights ``w``."""
        S_new = template.unflatten(_weighted_sum(Q, w))
        return FedEMState(S_new, S_new.zeros_like() if use_cv else None)

    def after_round_flat(self, Q: np.ndarray, w: np.ndarray, gamma: float, p: float,
                         alpha: float) -> FedEMState:
        """:meth:`after_round` with the differences as rows of ``Q`` (A, F), weights ``w``."""
        assert self.S_hat is not None
        agg = self.S_hat.unflatten(_weighted_sum(Q, w)) if len(w) else self.S_hat.zeros_like()
        return self._step(agg, gamma, p, alpha)

    def after_round(self, got: dict[str, Stats], weights: dict[str, float], gamma: float,
                    p: float, alpha: float) -> FedEMState:
        """The state after a FedEM round with the (quantized) differences ``got``."""
        assert self.S_hat is not None
        agg = self.S_hat.zeros_like()
        for c in got:
            agg.add_(got[c], weights[c])
        return self._step(agg, gamma, p, alpha)

    def _step(self, agg: Stats, gamma: float, p: float, alpha: float) -> FedEMState:
        """``S_hat += gamma (agg / p + V)``, ``V += alpha agg``."""
        S_new = self.S_hat.copy().add_(agg, gamma / p)
        V_new = self.V
        if self.V is not None:
            S_new.add_(self.V, gamma)
            V_new = self.V.copy().add_(agg, alpha)
        return FedEMState(S_new, V_new)


def _weighted_sum(Q: np.ndarray, w: np.ndarray) -> np.ndarray:
    """``sum_c w_c Q_c`` added in client order, as the per-client path adds (a reduction
    over the leading axis of a C-ordered array accumulates row after row): the same bits."""
    return np.add.reduce(Q * w[:, None], axis=0)


#: a client whose weighted statistic exceeds every other client's by this factor is named
#: when the M-step fails on the aggregate (the aggregate is then essentially its statistic)
DOMINANCE = 1e6


def dominant_client(ids: list[str], Q: np.ndarray, w: np.ndarray) -> str | None:
    """Why the aggregate ``sum_c w_c Q_c`` is one client's: ``"client 'x' dominates them
    (...)"``, or None when no client's weighted statistic exceeds every other's by
    :data:`DOMINANCE`.

    Parameters
    ----------
    ids : list of str
        The clients of the rows of ``Q``.
    Q : ndarray of shape (A, F)
        Their statistics (per unit, flattened).
    w : ndarray of shape (A,)
        Their weights.
    """
    if len(ids) < 2 or not np.size(Q):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        m = np.abs(np.asarray(Q, dtype=np.float64)).max(axis=1) * np.abs(w)
    top = int(np.argmax(m))
    rest = float(np.max(np.delete(m, top)))
    if not m[top] > DOMINANCE * rest:
        return None
    big = float(np.abs(Q[top]).max())
    return (f"client {ids[top]!r} dominates them (its statistic reaches {big:.3g} per unit, "
            f"more than {DOMINANCE:.0e} times any other client's weighted statistic): check its "
            "data, or leave it out")


def client_weights(federation: Federation, n_units: dict[str, int]) -> dict[str, float]:
    """``w_c``: by units (``n_c / n``, the statistical default) or uniform (``1 / n_clients``)."""
    cids = list(n_units)
    if federation.client_weighting == "samples":
        n_total = float(sum(n_units.values()))
        return {c: n_units[c] / n_total for c in cids}
    return {c: 1.0 / len(cids) for c in cids}


def select_active(cids: list[str], p: float, seed: int, k: int, init_round: bool) -> list[str]:
    """The clients of round ``k``: everyone in the initialization round, else Bernoulli(p)
    each from the server's generator of that round (the same draw in every runtime)."""
    if init_round or p >= 1.0:
        return list(cids)
    draw = server_rng(seed, k).random(len(cids))
    return [c for c, u in zip(cids, draw) if u < p]


def round_message(federation: Federation, seed: int, k: int, init_round: bool,
                  alpha: float) -> dict[str, Any]:
    """The settings every client gets in round ``k``: which E-step (full pass, mini-batch,
    SPIDER refresh or correction), control variates, quantization."""
    quant = federation.quantizer
    use_cv = bool(federation.control_variates)
    vr = federation.variance_reduction
    msg: dict[str, Any] = {
        "seed": int(seed),
        "round": k,
        "control_variates": use_cv and not init_round,
        "alpha": alpha,
        "quant_levels": 0 if (init_round or quant is None) else quant.levels,
    }
    if init_round:
        msg["mode"] = "spider-refresh" if vr is not None else "full"
        msg["keep_init"] = use_cv
    elif vr is not None:
        msg["mode"] = "spider-refresh" if (k - 2) % vr.inner_rounds == 0 else "spider"
        msg["batch_size"] = vr.batch_size
    elif federation.batch_size is not None:
        msg["mode"] = "batch"
        msg["batch_size"] = int(federation.batch_size)
    else:
        msg["mode"] = "full"
    return msg


def stat_bytes(federation: Federation, shapes: dict[str, tuple[int, ...]]) -> tuple[int, int]:
    """Bytes of one uncompressed statistic and of one quantized one (with 16 for the scalars)."""
    raw = int(sum(8 * int(np.prod(s)) for s in shapes.values())) + 16
    quant = federation.quantizer
    return raw, (quant.nbytes(shapes) + 16) if quant is not None else raw


class ReplyScreen:
    """What each round's well-formed replies must mean, before anything is aggregated.

    Every reply: the units claimed (``n``) equal the units the client set up (full passes)
    or lie in ``[1, n_units]`` (mini-batches, SPIDER corrections), and no sum is beyond what
    can be aggregated. Where the server can rebuild the client's own statistic ``S_c`` (the
    initialization round, which sends ``S_c`` itself; later rounds without a quantizer, from
    ``Q_c + S_hat (+ V_c)``, with ``V_c`` mirrored from the client's replies), the model's
    invariants (:meth:`~fedlatent.engine.model.FederatedModel.check`) on ``S_c`` scaled to
    sums; the rebuilt entries carry a rounding ``slack``. Not rebuilt, so only the generic
    checks: quantized differences, SPIDER corrections (a difference of mini-batch terms, not
    a statistic of data), and with control variates a client whose ``V_c`` the server lost
    track of (a reply that never arrived). The mirror is checkpointed (a resumed run checks as
    much as the uninterrupted one).
    The mirror costs the server one statistic per client, as much as one round's replies.
    """

    def __init__(self, model, n_units: dict[str, int], federation: Federation):
        self.model, self.n_units = model, n_units
        self.exact = federation.quantizer is None
        self.use_cv = bool(federation.control_variates)
        #: the model states invariants (else rebuilding S_c per client would be wasted work)
        self.has_check = type(model).check is not FederatedModel.check
        #: V_c as each client holds it (None: unknown); only without a quantizer
        self.mirror: dict[str, Stats | None] = {}
        #: clients whose last reply was refused: told to go back to their mirrored V_c
        self.resync: set[str] = set()

    def units_problem(self, c: str, n: Any, mode: str) -> str | None:
        try:
            n = float(n)
        except (TypeError, ValueError):
            return f"claims {n!r} units"
        m = int(self.n_units[c])
        if n != round(n):
            return f"claims {n:g} units, not a whole number"
        if mode in ("full", "spider-refresh"):
            if n != m:
                return f"claims {n:g} units, {m} at setup"
        elif not 1 <= n <= m:
            return f"claims {n:g} units in a mini-batch, it has {m}"
        return None

    #: under differential privacy: each client's noise standard deviation per block (sum scale)
    dp_stds: dict[str, float] | None = None
    #: a client's noise is judged honest within this many standard deviations
    DP_SIGMAS = 7.0

    def set_privacy(self, dp, noise_multiplier: float, params, threshold: int | None) -> None:
        """The noise a client adds this round (the invariants then hold up to it)."""
        from .privacy.client_dp import release_stds

        parties = 1 if dp.noise == "local" else int(threshold)
        self.dp_stds = release_stds(self.model.dp_sensitivity(params, dp), noise_multiplier,
                                    n_parties=parties)

    def dp_slack(self, Q: Stats, shares: int = 1) -> Stats | None:
        """Per-entry slack (sum scale) for the noise of ``shares`` clients' replies."""
        if self.dp_stds is None:
            return None
        f = self.DP_SIGMAS * float(np.sqrt(shares))
        return Stats({k: np.full(np.shape(v), f * self.dp_stds.get(k, 0.0)) for k, v in
                      Q.items()}, copy=False)

    def problem(self, c: str, Q: Stats, reply: dict[str, Any], mode: str,
                S_hat: Stats | None) -> str | None:
        """Why client ``c``'s reply ``Q`` (its checked blocks) must not be aggregated."""
        reason = self.units_problem(c, reply.get("n"), mode)
        if reason:
            return reason
        n = float(reply["n"])
        for k, v in Q.items():
            big = float(np.max(np.abs(v))) if v.size else 0.0
            if big * max(n, 1.0) > _MAX_SUM:
                return f"statistic {k!r} reaches {big:.3g} per unit, beyond any sum of data"
        if not self.has_check:
            return None
        S_c, slack = self.rebuild(c, Q, mode, S_hat)
        if S_c is None:
            return None
        slack = None if slack is None else slack * n
        noise = self.dp_slack(Q)
        if noise is not None:
            slack = noise if slack is None else slack + noise
        with np.errstate(over="ignore", invalid="ignore"):
            return self.model.check(S_c * n, n, slack)

    def rebuild(self, c: str, Q: Stats, mode: str, S_hat: Stats | None):
        """``(S_c, slack)``: the client's own mean statistic and its rounding bound, or
        ``(None, None)`` where it cannot be rebuilt."""
        if S_hat is None:
            return Q, None
        if not self.exact or mode == "spider":
            return None, None
        terms = [Q, S_hat]
        if self.use_cv:
            V = self.mirror.get(c)
            if V is None:
                return None, None
            terms.append(V)
        S_c = Q + S_hat
        if self.use_cv:
            S_c = S_c + V
        slack = Stats({k: _REBUILD_EPS * sum(np.abs(t[k]) for t in terms) for k in Q},
                      copy=False)
        return S_c, slack

    def after_round(self, init_round: bool, asked: list[str], parsed: dict[str, Stats],
                    errors: dict[str, str], S_hat_new: Stats, alpha: float,
                    rejected: dict[str, str]) -> None:
        """Follow every client's ``V_c``: ``S_c0 - S_hat_0`` after the initialization round,
        then ``V_c + alpha Q_c`` for every reply aggregated; unknown after a reply that did not
        arrive; unchanged when it raised (a client that raises keeps its state).

        A refused reply (malformed, or breaking the invariants) enters neither ``S_hat`` nor
        ``V`` nor the mirror: the client did ``V_c += alpha Q_c`` with what it meant to send,
        which the server cannot know (a lie, or a reply corrupted on the way). So the mirror
        keeps the last accepted ``V_c`` and the client is put in :attr:`resync`: its next round
        message carries that ``V_c`` (``V_reset/``), which it adopts before its step. Then
        ``V = sum_c w_c V_c`` still holds, an honest client whose one reply was corrupted is
        rebuilt exactly (and accepted) from its next reply on, and a client that keeps lying is
        checked against the true ``V_c`` every round (and refused every round)."""
        if not (self.use_cv and self.exact):
            return
        if init_round:
            self.mirror = {c: Q - S_hat_new for c, Q in parsed.items()}
            self.resync = set()
            return
        for c in asked:
            if c in errors:
                continue
            V = self.mirror.get(c)
            if c in rejected:
                if V is not None:
                    self.resync.add(c)
                continue
            self.resync.discard(c)
            if c in parsed and V is not None:
                self.mirror[c] = V.copy().add_(parsed[c], alpha)
            else:
                self.mirror[c] = None

    def checkpointed(self):
        """``(mirror, resync)`` for a checkpoint, None when no mirror is kept."""
        if not (self.use_cv and self.exact):
            return None
        return self.mirror, self.resync

    def resync_message(self, c: str) -> dict[str, np.ndarray]:
        """The ``V_reset/`` blocks client ``c`` must adopt before its next step (empty unless
        its last reply was refused)."""
        V = self.mirror.get(c)
        if c not in self.resync or V is None:
            return {}
        return {f"V_reset/{k}": np.array(v, copy=True) for k, v in V.items()}
