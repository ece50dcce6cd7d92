"""The latent class regression's engine side: client statistics, the M-step, initialization
and scoring queries.

Clients send, per component k, ``sum r``, ``sum r x~ x~^T``, ``sum r x~ y`` and ``sum r y^2``
(``x~ = [x, 1]`` with an intercept) and the summed log-likelihood; the server solves one
weighted least-squares problem per component. Nothing else crosses.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...engine.messages import bordered, count_problem, equal_problem, psd_problem
from ...engine.model import ClientStep, FederatedModel, Params
from ...engine.registry import register_model
from .math import (
    add_intercept,
    lcr_m_step,
    lcr_responsibilities,
    lcr_stat_shapes,
    lcr_statistics,
)

__all__ = ["LCRModel", "payload_params"]


@register_model
class LCRModel(FederatedModel):
    """Mixture of linear regressions for the engine. Config: n_components, fit_intercept,
    reg_noise.

    Parameters (``params``): ``weights`` (K,), ``beta`` (K, p) with the intercept as the last
    column when ``fit_intercept``, ``noise_variance`` (K,).
    """

    name = "lcr"

    def __init__(self, n_components: int, fit_intercept: bool = True, reg_noise: float = 1e-6):
        super().__init__(
            n_components=int(n_components),
            fit_intercept=bool(fit_intercept),
            reg_noise=float(reg_noise),
        )
        self.K = int(n_components)
        self.fit_intercept = bool(fit_intercept)
        self.reg = float(reg_noise)

    # ---- client side ------------------------------------------------------------------------
    def _design(self, data, rows=None) -> tuple[np.ndarray, np.ndarray]:
        if data.y is None:
            raise ValueError("latent class regression needs a target y on every client")
        X = data.X if rows is None else data.X[rows]
        y = data.y if rows is None else data.y[rows]
        return add_intercept(X, self.fit_intercept), np.asarray(y, dtype=np.float64)

    def client_stats(self, params, data, state, rng, rows=None) -> ClientStep:
        Xt, y = self._design(data, rows)
        resp, loglik = lcr_responsibilities(
            Xt, y, params["weights"], params["beta"], params["noise_variance"]
        )
        # the log-likelihood summed in row order, as the batched step sums it
        return ClientStep(lcr_statistics(Xt, y, resp), Xt.shape[0],
                          float(np.cumsum(loglik)[-1]) if len(loglik) else 0.0, state)

    def client_stats_batched(self, params, X, y, w, state):
        from .batched import lcr_batched_stats

        if y is None:
            raise ValueError("latent class regression needs a target y on every client")
        return lcr_batched_stats(params, X, y, w, self.fit_intercept, state)

    def client_query(self, name, payload, data, state, rng):
        if name == "random_stats":
            # flexmix's default start (random memberships), made soft: every row's
            # memberships are a uniform draw on the simplex (Dirichlet(1, ..., 1)) from the
            # client's own generator, keyed by seed, client and query. Hard random labels
            # would let a component hold one row of a small client, and its sums (n_k = 1,
            # sum x~ y = [x_i y_i, y_i]) would be that record.
            Xt, y = self._design(data)
            resp = rng.dirichlet(np.ones(self.K), size=Xt.shape[0])
            st = lcr_statistics(Xt, y, resp)
            return {"n": int(Xt.shape[0]), **{f"stat/{k}": v for k, v in st.items()}}, state
        if name == "loglik":
            Xt, y = self._design(data)
            p = payload_params(payload)
            _, loglik = lcr_responsibilities(Xt, y, p["weights"], p["beta"], p["noise_variance"])
            return {"n": int(Xt.shape[0]), "loglik": float(loglik.sum())}, state
        return super().client_query(name, payload, data, state, rng)

    # ---- server side ------------------------------------------------------------------------
    def stat_shapes(self, params):
        return lcr_stat_shapes(self.K, params["beta"].shape[1])

    def check(self, stats, n_units, slack=None):
        """Counts ``nk`` in ``[0, n]`` summing to ``n``; with an intercept, the intercept's
        entry of ``sum r x~ x~^T`` equal to ``nk``; and per component the moment matrix
        ``[[sum r x~x~^T, sum r x~ y], [., sum r y^2]]`` positive semi-definite (so
        ``sum r y^2 >= 0`` and the residual sum of squares of every line is >= 0)."""
        e = (lambda k: None) if slack is None else (lambda k: slack[k])
        reason = count_problem("nk", stats["nk"], n_units, e("nk"))
        if reason:
            return reason
        if self.fit_intercept:
            ei = None if slack is None else slack["sxx"][:, -1, -1]
            reason = equal_problem("the intercept entries of 'sxx' and the counts 'nk'",
                                   stats["sxx"][:, -1, -1], stats["nk"], ei, e("nk"))
            if reason:
                return reason
        E = None if slack is None else bordered(*(np.abs(slack[k]) for k in ("sxx", "sxy",
                                                                              "syy")))
        return psd_problem("the moment matrix [[sum r x x^T, sum r x y], [., sum r y^2]]",
                           bordered(stats["sxx"], stats["sxy"], stats["syy"]), E)

    def server_step(self, S, params, n_total):
        # S is a mean over rows (or, with partial participation and step sizes, a stochastic
        # approximation of it): every parameter is a ratio of its blocks, so the scale cancels.
        # A component left without mass keeps its previous coefficients and variance.
        w, beta, var = lcr_m_step(S, self.reg, previous=params)
        return {"weights": w, "beta": beta, "noise_variance": var}


def payload_params(payload: dict[str, Any]) -> Params:
    return {k[7:]: np.asarray(v) for k, v in payload.items() if k.startswith("params/")}
