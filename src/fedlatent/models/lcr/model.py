"""The latent class regression's engine side: client statistics, the M-step, initialization
and scoring queries.

Clients send, per component k, ``sum r``, ``sum r x~ x~^T``, ``sum r x~ y`` and ``sum r y^2``
(``x~ = [x, 1]`` with an intercept) and the summed log-likelihood; the server solves one
weighted least-squares problem per component. Nothing else crosses.
"""

from __future__ import annotations

import numpy as np

from ...data.dataset import ClientData
from ...engine.contract.degenerate import DEGENERATE_FRACTION
from ...engine.contract.mixture import MixtureModel
from ...engine.contract.model import ClientStep, Params, payload_params
from ...engine.contract.params import Integer, Real
from ...engine.contract.registry import register_model
from ...engine.protocol.messages import bordered, count_problem, equal_problem, psd_problem
from ...engine.stats import Stats
from .dp import (
    adaptive_ridge,
    from_shifted,
    lcr_dp_sensitivity,
    project_moments,
    to_shifted,
)
from .math import (
    add_intercept,
    lcr_m_step,
    lcr_responsibilities,
    lcr_stat_shapes,
    lcr_statistics,
    pooled_residual_variance,
)

__all__ = ["LCRModel", "payload_params"]


@register_model
class LCRModel(MixtureModel):
    """Mixture of linear regressions for the engine. Config: n_components, fit_intercept,
    reg_noise, and under differential privacy ``dp``.

    Parameters (``params``): ``weights`` (K,), ``beta`` (K, p) with the intercept as the last
    column when ``fit_intercept``, ``noise_variance`` (K,).

    ``dp`` (None: not private) is ``{"n_features": d, "shift": None | {"center": [...],
    "target_center": m}}``
    (:func:`fedlatent.models.lcr.dp.shift_for`): the statistics are then sums in the shifted
    coordinates ``(x - c, y - m)`` (the parameters stay in the data's), and the M-step first
    projects the noisy moment matrices onto the positive-definite cone (see
    :mod:`fedlatent.models.lcr.dp`).
    """

    name = "lcr"
    config_constraints = {"n_components": [Integer(1)], "reg_noise": [Real(0)]}
    batched_step = True

    def __init__(self, n_components: int, fit_intercept: bool = True, reg_noise: float = 1e-6,
                 dp: dict | None = None):
        config = dict(n_components=int(n_components), fit_intercept=bool(fit_intercept),
                      reg_noise=float(reg_noise))
        self.shift = None
        self.n_features = None
        if dp is not None:  # only then in the config: the non-private config is unchanged
            shift = dp.get("shift")
            self.n_features = int(dp["n_features"])
            config["dp"] = {"n_features": self.n_features, "shift": None if shift is None else {
                "center": [float(v) for v in shift["center"]],
                "target_center": float(shift["target_center"])}}
            if shift is not None:
                self.shift = (np.asarray(shift["center"], dtype=np.float64),
                              float(shift["target_center"]))
        super().__init__(**config)
        self.K = int(n_components)
        self.fit_intercept = bool(fit_intercept)
        self.reg = float(reg_noise)
        self.noisy = dp is not None

    # ---- client side ------------------------------------------------------------------------
    def _design(self, data, rows=None) -> tuple[np.ndarray, np.ndarray]:
        if data.y is None:
            raise ValueError("latent class regression needs a target y on every client")
        X = data.X if rows is None else data.X[rows]
        y = data.y if rows is None else data.y[rows]
        return add_intercept(X, self.fit_intercept), np.asarray(y, dtype=np.float64)

    def _statistics(self, Xt: np.ndarray, y: np.ndarray, resp: np.ndarray) -> Stats:
        """:func:`lcr_statistics`, in the shifted coordinates under differential privacy."""
        if self.shift is not None:
            c, m = self.shift
            Xt = np.array(Xt, copy=True)
            Xt[:, :-1] -= c
            y = y - m
        return lcr_statistics(Xt, y, resp)

    def fit_data(self, data):
        """The rows with a target (a row whose target is NaN is left out; issue 25)."""
        return data.with_target()

    def client_stats(self, params, data, state, rng, rows=None) -> ClientStep:
        Xt, y = self._design(data, rows)
        resp, loglik = lcr_responsibilities(
            Xt, y, params["weights"], params["beta"], params["noise_variance"]
        )
        fw = data.weights_of(rows)
        if fw is not None:  # frequency weights: a row of weight w is w rows
            resp, loglik = resp * fw[:, None], loglik * fw
        # the log-likelihood summed in row order, as the batched step sums it
        return ClientStep(self._statistics(Xt, y, resp), data.mass(rows),
                          float(np.cumsum(loglik)[-1]) if len(loglik) else 0.0, state)

    # ---- differential privacy (see .dp) -------------------------------------------------------
    def dp_sensitivity(self, params, dp):
        return lcr_dp_sensitivity(dp, self._dp_features(), self.fit_intercept)

    def dp_query_sensitivity(self, name, payload, dp):
        if name in ("random_stats", "pooled_stats"):  # n is public (client sizes are)
            return {f"stat/{k}": v for k, v in
                    lcr_dp_sensitivity(dp, self._dp_features(), self.fit_intercept).items()}
        return None  # "loglik" (an objective) is not released under differential privacy

    def _dp_features(self) -> int:
        if not self.noisy:
            raise ValueError("LCRModel was built without its differential-privacy config "
                             "(dp=...); build it with LatentClassRegression under "
                             "Federation(privacy=...)")
        return self.n_features

    def client_stats_batched(self, params, X, y, w, state):
        from .batched import lcr_batched_stats

        if y is None:
            raise ValueError("latent class regression needs a target y on every client")
        if self.noisy:  # shifted statistics: the one-by-one step (the engine's choice too)
            return None
        return lcr_batched_stats(params, X, y, w, self.fit_intercept, state)

    def responsibility_stats(self, data, resp):
        """The statistics at responsibilities ``resp`` (the random-membership start's; rows
        weighted by their frequency weights)."""
        Xt, y = self._design(data)
        return self._statistics(Xt, y, _weigh(resp, data.weight))

    def client_query(self, name, payload, data, state, rng):
        # "random_stats" (flexmix's default start, made soft: hard random labels would let a
        # component hold one row of a small client, and its sums would be that record) is the
        # engine's random-membership start (fedlatent.engine.contract.mixture), from
        # responsibility_stats
        if name == "pooled_stats":  # the one-component statistics (the private start)
            Xt, y = self._design(data)
            st = self._statistics(Xt, y, _weigh(np.ones((Xt.shape[0], 1)), data.weight))
            return {"n": data.mass(), **{f"stat/{k}": v for k, v in st.items()}}, state
        if name == "loglik":
            Xt, y = self._design(data)
            p = payload_params(payload)
            _, loglik = lcr_responsibilities(Xt, y, p["weights"], p["beta"], p["noise_variance"])
            fw = data.weight
            return {"n": data.mass(), "loglik": float(loglik.sum() if fw is None
                                                      else loglik @ fw)}, state
        # Louis' observed information (fedlatent.engine.estimation.inference)
        if name == "information":
            from .inference import lcr_information_sums

            Xt, y = self._design(data)
            p = payload_params(payload)
            sums = lcr_information_sums(Xt, y, p["weights"], p["beta"], p["noise_variance"],
                                        sample_weight=data.weight, entity=data.entity)
            return sums.reply(data.mass()), state
        return super().client_query(name, payload, data, state, rng)

    # ---- server side ------------------------------------------------------------------------
    def reply_numbers(self, data: ClientData) -> int:
        """Per component: ``nk``, ``sum r x~ x~^T`` (symmetric), ``sum r x~ y``, ``sum r y^2``
        with ``x~`` the features and the intercept."""
        from ...engine.privacy.disclosure import free_numbers

        p = int(data.n_features) + int(self.fit_intercept)
        return free_numbers(lcr_stat_shapes(self.K, p), ("sxx",))

    def record_width(self, data: ClientData) -> int:
        """A record's features and its target."""
        return int(data.n_features) + 1

    def evaluated_shapes(self, data: ClientData) -> dict[str, tuple[int, ...]]:
        """``weights`` (K,), ``beta`` (K, p) (features and intercept), ``noise_variance``
        (K,)."""
        K, p = self.K, int(data.n_features) + int(self.fit_intercept)
        return {"weights": (K,), "beta": (K, p), "noise_variance": (K,)}

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
        if not self.noisy:  # a component's noise variance kept off a point mass (degenerate)
            w, beta, var = lcr_m_step(S, self.reg, previous=params,
                                      floor=DEGENERATE_FRACTION * pooled_residual_variance(S))
            return {"weights": w, "beta": beta, "noise_variance": var}
        ridge = float(params.get("dp_ridge", 0.0)) / max(float(n_total), 1.0)  # mean scale
        out = self.noisy_m_step(S, params, ridge)
        if "dp_ridge" in params:
            out["dp_ridge"] = np.array(params["dp_ridge"], copy=True)
        return out

    def noisy_m_step(self, S, previous: Params | None, ridge: float = 0.0) -> Params:
        """The M-step on noisy (differentially private) statistics: moment matrices projected
        onto the positive-definite cone, negative counts treated as empty components (they keep
        ``previous``), the shift undone. A component whose moment matrix had to be projected
        keeps its previous noise variance: its residual sum of squares (a difference of large
        noisy sums) is then noise, and a variance driven to zero would end the component. The
        solve uses :func:`~fedlatent.models.lcr.dp.adaptive_ridge` at the noise's scale
        ``ridge`` (in the scale of ``S``; the residuals are taken with the unlifted sums). With
        no positive mass at all the parameters stay."""
        S, projected = project_moments(Stats(S))
        if not float(np.asarray(S["nk"]).sum()) > 0 and previous is not None:
            return {k: np.array(previous[k], copy=True) for k in
                    ("weights", "beta", "noise_variance")}
        prev = previous
        if self.shift is not None and previous is not None:
            prev = {**previous, "beta": to_shifted(previous["beta"], *self.shift)}
        w, beta, var = lcr_m_step(S, self.reg, previous=prev)
        if ridge > 0:  # AdaSSP: the lines from lifted sums, their residuals from the sums
            lifted = adaptive_ridge(np.asarray(S["sxx"], dtype=np.float64), ridge)
            nk = np.asarray(S["nk"], dtype=np.float64)
            live = w > 0
            for k in np.flatnonzero(live):
                b = np.linalg.solve(lifted[k], S["sxy"][k])
                ssr = float(S["syy"][k] - 2.0 * b @ S["sxy"][k] + b @ S["sxx"][k] @ b)
                beta[k], var[k] = b, max(ssr, 0.0) / nk[k] + self.reg
        if self.shift is not None:
            beta = from_shifted(beta, *self.shift)
        if previous is not None and projected.any():
            var = np.where(projected, previous["noise_variance"], var)
        return {"weights": w, "beta": beta, "noise_variance": var}


def _weigh(resp: np.ndarray, weight: np.ndarray | None) -> np.ndarray:
    """Rows of ``resp`` times their frequency weights (``resp`` itself without weights)."""
    return resp if weight is None else resp * weight[:, None]
