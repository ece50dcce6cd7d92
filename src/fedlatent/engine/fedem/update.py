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

from fedlatent.engine.fedem.federation import Federation
from fedlatent.engine.fedem.seeds import server_rng
from fedlatent.engine.stats import Stats

__all__ = ["DOMINANCE", "FedEMState", "client_weights", "dominant_client", "round_message",
           "select_active"]


@dataclass
class FedEMState:
    """The server's statistics: ``S_hat`` (None before the initialization round) and the mean
    control variate ``V`` (None without control variates)."""

    S_hat: Stats | None = None
    V: Stats | None = None

    @property
    def initialized(self) -> bool:
        return self.S_hat is not None

    def advance(self, total: Stats | None, init_round: bool, gamma: float, p: float,
                alpha: float, use_cv: bool) -> FedEMState:
        """The state after a round whose accepted replies sum to ``total = sum_c w_c Q_c``
        (None: nothing accepted). The initialization round: ``S_hat = total`` (the clients'
        statistics; every client answered), ``V = 0``; later rounds: the FedEM step."""
        if init_round:
            S_new = total.copy()
            return FedEMState(S_new, S_new.zeros_like() if use_cv else None)
        assert self.S_hat is not None
        return self._step(self.S_hat.zeros_like() if total is None else total, gamma, p, alpha)

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
