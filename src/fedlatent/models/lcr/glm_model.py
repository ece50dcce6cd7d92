"""The latent class regression with generalized linear components, offsets, trials or
concomitant variables: the engine side (``LCRGLMModel``).

Columns of a client's ``X`` play roles the config names by position: the regressors (the
components' design, with an intercept when ``fit_intercept``), the concomitant variables (the
class weights' multinomial logit, always with an intercept), the offset and the binomial
trials. Per component ``k`` a client sends ``nk = sum r``; for the Gaussian family the
closed-form sums of :func:`~fedlatent.models.lcr.math.lcr_statistics` (of ``y - offset``), for
the Poisson and binomial families the gradient and Hessian of :func:`.families.glm_statistics`
at the broadcast coefficients; with concomitant variables, the gradient and Hessian of
:func:`fedlatent.models.concomitant.concomitant_statistics`. The server's step is closed form
(Gaussian) or one Newton step (a generalized EM). Newton statistics hold only at the broadcast
parameters: the model says so (``broadcast_only``) and the engine refuses what would average
them across rounds.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...data.dataset import ClientData
from ...engine.contract.mixture import MixtureModel
from ...engine.contract.model import ClientStep, payload_params
from ...engine.contract.registry import register_model
from ...engine.protocol.messages import bordered, count_problem, psd_problem
from ...engine.protocol.numerics import add_intercept, logsumexp
from ...engine.stats import Stats
from ..concomitant import (
    concomitant_log_prior,
    concomitant_newton_step,
    concomitant_stat_shapes,
    concomitant_statistics,
)
from .families import (
    GLM_FAMILIES,
    glm_log_density,
    glm_newton_step,
    glm_stat_shapes,
    glm_statistics,
    working_response,
)
from .math import lcr_log_prob, lcr_m_step, lcr_stat_shapes, lcr_statistics

__all__ = ["LCRGLMModel", "RowParts"]

#: the component blocks each family sends (besides ``nk``)
_GAUSSIAN_BLOCKS = ("sxx", "sxy", "syy")
_NEWTON_BLOCKS = ("grad", "hess")
_CONCOMITANT_BLOCKS = ("cgrad", "chess")


class RowParts:
    """One client's rows split by role: ``Xt`` (n, p) the components' design, ``y`` (n,),
    ``trials`` (n,) (ones without a trials column), ``offset`` (n,) (zeros without one),
    ``Zt`` (n, q) the concomitant design with its intercept (None without concomitant
    variables), ``freq`` (n,) frequency weights or None."""

    __slots__ = ("Xt", "y", "trials", "offset", "Zt", "freq")

    def __init__(self, Xt, y, trials, offset, Zt, freq):
        self.Xt, self.y, self.trials, self.offset, self.Zt, self.freq = (
            Xt, y, trials, offset, Zt, freq)


@register_model
class LCRGLMModel(MixtureModel):
    """Mixture of generalized linear regressions (Gaussian, Poisson, binomial) with optional
    offsets, trials and concomitant variables, for the engine.

    Config: ``n_components``, ``family``, ``fit_intercept``, ``reg_noise`` (Gaussian),
    ``regressors`` (column positions), ``concomitant`` (column positions; empty: constant
    weights), ``offset`` and ``trials`` (a column position or None).

    Parameters (``params``): ``weights`` (K,), ``beta`` (K, p) with the intercept last when
    ``fit_intercept``, ``noise_variance`` (K,) for the Gaussian family, ``gamma`` (K - 1, q)
    with concomitant variables (the last column the intercept).
    """

    name = "lcr_glm"
    count_stats = ("nk",)

    def __init__(self, n_components: int, family: str = "gaussian", fit_intercept: bool = True,
                 reg_noise: float = 1e-6, regressors=(), concomitant=(),
                 offset: int | None = None, trials: int | None = None):
        super().__init__(n_components=int(n_components), family=str(family),
                         fit_intercept=bool(fit_intercept), reg_noise=float(reg_noise),
                         regressors=[int(j) for j in regressors],
                         concomitant=[int(j) for j in concomitant],
                         offset=None if offset is None else int(offset),
                         trials=None if trials is None else int(trials))
        if family not in ("gaussian", *GLM_FAMILIES):
            raise ValueError(f"unknown family {family!r}; known: gaussian, poisson, binomial")
        self.K = int(n_components)
        self.family = str(family)
        self.fit_intercept = bool(fit_intercept)
        self.reg = float(reg_noise)
        self.regressors = np.asarray(self.config["regressors"], dtype=np.int64)
        self.concomitant = np.asarray(self.config["concomitant"], dtype=np.int64)
        self.offset, self.trials = self.config["offset"], self.config["trials"]
        newton = [w for w, on in (("the components' gradients and Hessians",
                                   self.family in GLM_FAMILIES),
                                  ("the concomitant model's gradient and Hessian",
                                   self.concomitant.size > 0)) if on]
        #: Newton statistics hold only where they were computed (the engine reads this)
        self.broadcast_only = (" and ".join(newton) + " at the broadcast coefficients: one "
                               "Newton step a round") if newton else ""

    @property
    def gaussian(self) -> bool:
        return self.family == "gaussian"

    @property
    def n_coef(self) -> int:
        return int(self.regressors.size) + int(self.fit_intercept)

    @property
    def n_concomitant(self) -> int:
        """Columns of the concomitant design (with its intercept); 0 without."""
        return int(self.concomitant.size) + 1 if self.concomitant.size else 0

    # ---- client side ------------------------------------------------------------------------
    def fit_data(self, data):
        """The rows with a target (a row whose target is NaN is left out)."""
        return data.with_target()

    def parts(self, X: np.ndarray, y: np.ndarray, freq=None) -> RowParts:
        """The rows ``X`` (n, d) split by role (:class:`RowParts`)."""
        X = np.asarray(X, dtype=np.float64)
        n = X.shape[0]
        Xt = add_intercept(X[:, self.regressors], self.fit_intercept)
        off = np.zeros(n) if self.offset is None else X[:, self.offset]
        m = np.ones(n) if self.trials is None else X[:, self.trials]
        Zt = add_intercept(X[:, self.concomitant], True) if self.concomitant.size else None
        return RowParts(Xt, np.asarray(y, dtype=np.float64), m, off, Zt,
                        None if freq is None else np.asarray(freq, dtype=np.float64))

    def _data_parts(self, data: ClientData, rows=None) -> RowParts:
        if data.y is None:
            raise ValueError("latent class regression needs a target y on every client")
        X = data.X if rows is None else data.X[rows]
        y = data.y if rows is None else data.y[rows]
        return self.parts(X, y, data.weights_of(rows))

    def component_log_prob(self, params, rp: RowParts) -> np.ndarray:
        """``log f_k(y_i | x_i)`` (n, K)."""
        beta = np.asarray(params["beta"], dtype=np.float64)
        if self.gaussian:
            return lcr_log_prob(rp.Xt, rp.y - rp.offset, beta,
                                np.asarray(params["noise_variance"], dtype=np.float64))
        eta = rp.Xt @ beta.T + rp.offset[:, None]
        return glm_log_density(self.family, eta, rp.y, rp.trials)

    def log_prior(self, params, rp: RowParts) -> np.ndarray:
        """``log pi_ik`` (n, K): the concomitant logit's, or the constant weights'."""
        if rp.Zt is not None:
            return concomitant_log_prior(rp.Zt, np.asarray(params["gamma"], dtype=np.float64))
        with np.errstate(divide="ignore"):  # an emptied component has weight 0
            return np.broadcast_to(np.log(np.asarray(params["weights"], dtype=np.float64)),
                                   (rp.Xt.shape[0], self.K))

    def e_step(self, params, rp: RowParts):
        """``(resp (n, K), loglik (n,), log_prior (n, K))`` at ``params``, unweighted."""
        lp = self.log_prior(params, rp)
        wlp = self.component_log_prob(params, rp) + lp
        norm = logsumexp(wlp, axis=1)
        return np.exp(wlp - norm[:, None]), norm, lp

    def statistics(self, params, rp: RowParts, resp: np.ndarray, log_prior) -> Stats:
        """The blocks of one step at ``params`` with responsibilities ``resp`` (weighted)."""
        out = {"nk": resp.sum(axis=0)}
        if self.gaussian:
            out.update(lcr_statistics(rp.Xt, rp.y - rp.offset, resp))
        else:
            eta = rp.Xt @ np.asarray(params["beta"], dtype=np.float64).T + rp.offset[:, None]
            out.update(glm_statistics(self.family, rp.Xt, rp.y, rp.trials, eta, resp))
        if rp.Zt is not None:
            out.update(concomitant_statistics(rp.Zt, log_prior, resp, rp.freq))
        return Stats(out, copy=False)

    def client_stats(self, params, data, state, rng, rows=None) -> ClientStep:
        rp = self._data_parts(data, rows)
        resp, loglik, lp = self.e_step(params, rp)
        if rp.freq is not None:  # frequency weights: a row of weight w is w rows
            resp, loglik = resp * rp.freq[:, None], loglik * rp.freq
        return ClientStep(self.statistics(params, rp, resp, lp), data.mass(rows),
                          float(np.cumsum(loglik)[-1]) if len(loglik) else 0.0, state)

    def responsibility_stats(self, data, resp):
        """The start's statistics: the Gaussian sums of IRLS's starting working response
        (:func:`.families.working_response`; ``y - offset`` for the Gaussian family) at
        memberships ``resp``, rows weighted by their frequency weights."""
        rp = self._data_parts(data)
        z = (rp.y - rp.offset if self.gaussian
             else working_response(self.family, rp.y, rp.trials, rp.offset))
        w = resp if rp.freq is None else resp * rp.freq[:, None]
        return Stats({"nk": w.sum(axis=0), **lcr_statistics(rp.Xt, z, w)}, copy=False)

    def client_query(self, name: str, payload: dict[str, Any], data, state, rng):
        if name == "loglik":
            rp = self._data_parts(data)
            _, loglik, _ = self.e_step(payload_params(payload), rp)
            return {"n": data.mass(), "loglik": float(
                loglik.sum() if rp.freq is None else loglik @ rp.freq)}, state
        if name == "information":
            from .glm_inference import glm_information

            rp = self._data_parts(data)
            info, ll = glm_information(self, payload_params(payload), rp)
            return {"n": data.mass(), "loglik": ll, "information": info}, state
        return super().client_query(name, payload, data, state, rng)

    # ---- disclosure -------------------------------------------------------------------------
    def reply_numbers(self, data: ClientData) -> int:
        """``nk``, the components' blocks (a symmetric matrix counted once) and the
        concomitant model's."""
        from ...engine.privacy.disclosure import free_numbers

        return free_numbers(self.stat_shapes(None), ("sxx", "hess", "chess"))

    def record_width(self, data: ClientData) -> int:
        """A record's columns and its target."""
        return int(data.n_features) + 1

    # ---- server side ------------------------------------------------------------------------
    def stat_shapes(self, params):
        K, p = self.K, self.n_coef
        shapes = (dict(lcr_stat_shapes(K, p)) if self.gaussian
                  else {"nk": (K,), **glm_stat_shapes(K, p)})
        if self.n_concomitant:
            shapes.update(concomitant_stat_shapes(K, self.n_concomitant))
        return shapes

    def check(self, stats, n_units, slack=None):
        """Counts ``nk`` in ``[0, n]`` summing to ``n``; the Gaussian moment matrices, the
        components' Hessians and the concomitant Hessian positive semi-definite (a start's
        Gaussian sums are checked alike)."""
        e = (lambda k: None) if slack is None else (lambda k: np.abs(slack[k]))
        reason = count_problem("nk", stats["nk"], n_units, e("nk"))
        if reason:
            return reason
        if "sxx" in stats:
            E = None if slack is None else bordered(*(e(k) for k in _GAUSSIAN_BLOCKS))
            reason = psd_problem("the moment matrix [[sum r x x^T, sum r x y], [., sum r y^2]]",
                                 bordered(stats["sxx"], stats["sxy"], stats["syy"]), E)
            if reason:
                return reason
        if "hess" in stats:
            reason = psd_problem("the components' Hessians 'hess'", stats["hess"], e("hess"))
            if reason:
                return reason
        if "chess" in stats:
            return psd_problem("the concomitant Hessian 'chess'", stats["chess"][None],
                               None if slack is None else e("chess")[None])
        return None

    def m_step(self, S, params, n_total):
        """Closed form (Gaussian) or one Newton step per component, and one for the
        concomitant coefficients; a component without mass keeps its parameters."""
        nk = np.asarray(S["nk"], dtype=np.float64)
        total = float(nk.sum())
        if not total > 0:
            raise ValueError("the statistics have no responsibility mass (sum of n_k <= 0)")
        empty = nk <= 1e-10 * total
        out = {}
        if self.gaussian:
            w, beta, var = lcr_m_step(Stats({k: S[k] for k in ("nk", *_GAUSSIAN_BLOCKS)}),
                                      self.reg, previous=params)
            out.update(weights=w, beta=beta, noise_variance=var)
        else:
            kept = np.where(empty, 0.0, nk)
            out["weights"] = kept / kept.sum()
            out["beta"] = glm_newton_step(params["beta"], S["grad"], S["hess"], empty)
        if self.n_concomitant:
            out["gamma"] = concomitant_newton_step(params["gamma"], S["cgrad"], S["chess"])
        return out
