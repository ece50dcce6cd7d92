"""Latent class analysis, the engine side: client statistics, the M-step, queries.

Clients send, per class ``k``, the sum of the responsibilities ``nk`` and the
responsibility-weighted counts of each category of each variable (:mod:`.math`); nothing else
crosses. A row moves the counts of each variable by at most one in all (its responsibilities are
on the simplex), so under differential privacy the bounds need no clipping of the data.
"""

from __future__ import annotations

import numpy as np

from ...data.dataset import ClientData
from ...engine.contract.mixture import MixtureModel, random_membership_stats
from ...engine.contract.model import ClientStep, payload_params
from ...engine.contract.params import Integer
from ...engine.contract.registry import register_model
from ...engine.node.replay_start import register_start
from ...engine.protocol.messages import count_problem, equal_problem, psd_problem
from ...engine.protocol.numerics import logsumexp
from ...engine.stats import Stats
from ..concomitant import (
    add_intercept,
    concomitant_log_prior,
    concomitant_newton_step,
    concomitant_stat_shapes,
    concomitant_statistics,
)
from .math import TINY, lca_m_step, lca_statistics, offsets, one_hot, responsibilities

__all__ = ["LCAModel", "code_problem"]


def code_problem(X: np.ndarray, n_categories, name=lambda j: f"column {j}") -> str | None:
    """Why ``X`` cannot hold category codes (None when it can): every value an integer in
    ``[0, R_j)`` for its column ``j`` (``name(j)`` names it in the reason), or NaN (a missing
    answer)."""
    X = np.asarray(X, dtype=np.float64)
    R = np.asarray(n_categories, dtype=np.int64)
    if X.ndim != 2 or X.shape[1] != R.size:
        return f"the data have {X.shape[-1]} columns, the model {R.size} variables"
    bad = ((X != np.round(X)) | (X < 0) | (X >= R[None, :])) & ~np.isnan(X)
    if bad.any():
        i, j = np.argwhere(bad)[0]
        return (f"{name(int(j))} holds {X[i, j]:g}, not a category code in 0..{int(R[j]) - 1} "
                "(code each variable's categories as 0, 1, ...)")
    return None


@register_model
class LCAModel(MixtureModel):
    """Latent class analysis for the engine. Config: n_components, n_categories (one per
    variable), and with concomitant variables ``concomitant`` (their column positions; the
    other columns are the variables). Parameters: ``weights`` (K,), ``probs`` (K, sum R_j),
    with concomitant variables ``gamma`` (K - 1, q) (:mod:`fedlatent.models.concomitant`)."""

    name = "lca"
    config_constraints = {"n_components": [Integer(1)]}
    count_stats = ("nk", "counts")

    def __init__(self, n_components: int, n_categories, missing: bool = False,
                 concomitant=()):
        cats = [int(r) for r in np.atleast_1d(n_categories)]
        conc = [int(j) for j in concomitant]
        # ``missing``: some answers are NaN (then a class's counts over a variable sum to at
        # most its nk); in the config only when set, so a complete fit's messages are unchanged
        super().__init__(n_components=int(n_components), n_categories=cats,
                         **({"missing": True} if missing else {}),
                         **({"concomitant": conc} if conc else {}))
        self.K = int(n_components)
        self.n_categories = cats
        self.missing = bool(missing)
        self.concomitant = np.asarray(conc, dtype=np.int64)
        self.variables = None if not conc else np.asarray(
            [j for j in range(len(cats) + len(conc)) if j not in set(conc)], dtype=np.int64)
        #: the concomitant logit's Newton statistics hold only where they were computed
        self.broadcast_only = ("the concomitant model's gradient and Hessian at the broadcast "
                               "coefficients: one Newton step a round") if conc else ""

    @property
    def n_concomitant(self) -> int:
        """Columns of the concomitant design (with its intercept); 0 without."""
        return int(self.concomitant.size) + 1 if self.concomitant.size else 0

    def _codes(self, data, rows=None) -> np.ndarray:
        X = data.X if rows is None else data.X[rows]
        return self.codes(X)

    def codes(self, X: np.ndarray) -> np.ndarray:
        """The variables' columns of rows ``X`` one-hot encoded (n, sum R_j)."""
        if self.variables is not None:
            X = np.asarray(X, dtype=np.float64)[:, self.variables]
        reason = code_problem(X, self.n_categories)
        if reason:
            raise ValueError(f"latent class analysis: {reason}")
        return one_hot(X, self.n_categories)

    def covariates(self, X: np.ndarray) -> np.ndarray | None:
        """The concomitant design ``[z, 1]`` of rows ``X`` (None without concomitant
        variables)."""
        if not self.concomitant.size:
            return None
        return add_intercept(np.asarray(X, dtype=np.float64)[:, self.concomitant], True)

    def e_step(self, params, Z: np.ndarray, Zt: np.ndarray | None):
        """``(resp, loglik, log_prior)`` of one-hot rows ``Z`` (and covariates ``Zt``)."""
        if Zt is None:
            resp, norm = responsibilities(Z, params["weights"], params["probs"])
            return resp, norm, None
        lp = concomitant_log_prior(Zt, np.asarray(params["gamma"], dtype=np.float64))
        wlp = Z @ np.log(np.maximum(params["probs"], TINY)).T + lp
        norm = logsumexp(wlp, axis=1)
        return np.exp(wlp - norm[:, None]), norm, lp

    def client_stats(self, params, data, state, rng, rows=None) -> ClientStep:
        X = data.X if rows is None else data.X[rows]
        Z, Zt = self.codes(X), self.covariates(X)
        resp, norm, lp = self.e_step(params, Z, Zt)
        fw = data.weights_of(rows)
        if fw is not None:  # frequency weights: a row of weight w is w rows
            resp, norm = resp * fw[:, None], norm * fw
        stats = lca_statistics(Z, resp)
        if Zt is not None:
            stats.update(concomitant_statistics(Zt, lp, resp, fw))
        return ClientStep(Stats(stats), data.mass(rows),
                          float(np.cumsum(norm)[-1]) if len(norm) else 0.0, state)

    def responsibility_stats(self, data, resp):
        fw = data.weight  # rows weighted by their frequency weights
        return Stats(lca_statistics(self._codes(data), resp if fw is None
                                    else resp * fw[:, None]))

    def reply_numbers(self, data: ClientData) -> int:
        """Per class: ``nk`` and the counts of each category of each variable (with complete
        answers a variable's counts sum to ``nk``: one of them is not free)."""
        per_class = sum(self.n_categories) - (0 if self.missing else len(self.n_categories))
        c = self.n_concomitant
        return self.K * (1 + per_class) + (
            (self.K - 1) * c + ((self.K - 1) * c) * ((self.K - 1) * c + 1) // 2 if c else 0)

    def disclosure_levels(self, data: ClientData):
        """Records holding each category of each variable (a category of one record gives
        its responsibilities, and with them its other answers, back)."""
        X = np.asarray(data.X, dtype=np.float64)
        if self.variables is not None:
            X = X[:, self.variables]
        rec = np.ones(len(X), dtype=bool) if data.weight is None else data.weight > 0
        out = []
        for j, R in enumerate(self.n_categories):
            col = X[rec, j]
            col = col[~np.isnan(col)].astype(np.int64)
            counts = np.bincount(col[(col >= 0) & (col < R)], minlength=R).astype(np.float64)
            out.append((f"variable {j}", [str(r) for r in range(R)], counts))
        return out

    def evaluated_shapes(self, data: ClientData) -> dict[str, tuple[int, ...]]:
        """``weights`` (K,), ``probs`` (K, sum R_j), ``gamma`` (K - 1, q) with concomitant
        variables."""
        K, total = self.K, int(offsets(self.n_categories)[-1])
        out = {"weights": (K,), "probs": (K, total)}
        if self.n_concomitant:
            out["gamma"] = (K - 1, self.n_concomitant)
        return out

    def stat_shapes(self, params):
        K, total = self.K, int(offsets(self.n_categories)[-1])
        shapes = {"nk": (K,), "counts": (K, total)}
        if self.n_concomitant:
            shapes.update(concomitant_stat_shapes(K, self.n_concomitant))
        return shapes

    def check(self, stats, n_units, slack=None):
        e = (lambda k: None) if slack is None else (lambda k: slack[k])
        reason = count_problem("nk", stats["nk"], n_units, e("nk"))
        if reason:
            return reason
        counts = np.asarray(stats["counts"], dtype=np.float64)
        reason = count_problem("counts", counts, n_units, e("counts"), total=False)
        if reason:
            return reason
        if self.missing:  # missing answers: the counts over a variable at most nk
            sums, nk, e_s, e_nk = self._block_sums(stats, slack)
            reason = equal_problem("a class's counts over a variable's categories (at most its "
                                   "'nk')", np.minimum(sums, nk), sums, e_s, e_nk)
        else:
            reason = equal_problem("a class's counts over a variable's categories and its "
                                   "'nk'", *self._block_sums(stats, slack))
        if reason or "chess" not in stats:
            return reason
        return psd_problem("the concomitant Hessian 'chess'", np.asarray(stats["chess"])[None],
                           None if slack is None else np.abs(slack["chess"])[None])

    def _block_sums(self, stats, slack):
        """Per class and variable: the counts' sum, 'nk', and their slacks (None: exact)."""
        off = offsets(self.n_categories)

        def per_block(a):
            a = np.asarray(a, dtype=np.float64)
            return np.stack([a[:, off[j]:off[j + 1]].sum(axis=1)
                             for j in range(len(off) - 1)], axis=1)

        sums = per_block(stats["counts"])
        nk = np.repeat(np.asarray(stats["nk"], dtype=np.float64)[:, None], sums.shape[1], 1)
        if slack is None:
            return sums, nk, None, None
        e_nk = np.repeat(np.abs(np.asarray(slack["nk"]))[:, None], sums.shape[1], 1)
        return sums, nk, per_block(np.abs(slack["counts"])), e_nk

    def m_step(self, S, params, n_total):
        weights, probs = lca_m_step(S, self.n_categories)
        out = {"weights": weights, "probs": probs}
        if self.n_concomitant:
            if "gamma" in params:  # one Newton step from the broadcast coefficients
                out["gamma"] = concomitant_newton_step(params["gamma"], S["cgrad"], S["chess"])
            else:  # the start: the logit at the start's weights (slopes 0)
                gamma = np.zeros((self.K - 1, self.n_concomitant))
                w = np.maximum(weights, 1e-300)
                gamma[:, -1] = np.log(w[1:] / w[0])
                out["gamma"] = gamma
        return out

    # ---- differential privacy -----------------------------------------------------------
    def dp_clip(self, data, dp):
        """Category codes need no clipping: a row's influence is bounded by construction."""
        return data

    def dp_sensitivity(self, params, dp):
        """One row adds ``r`` (on the simplex) to ``nk`` (L2 norm <= 1) and ``r_k`` to one
        category of each of the ``J`` variables of each class (Frobenius norm
        ``sqrt(J) ||r||_2 <= sqrt(J)``): a record moves its counts by at most one per variable."""
        if self.n_concomitant:
            raise NotImplementedError("latent class analysis with concomitant variables does "
                                      "not bound its Newton statistics yet; it cannot run under "
                                      "differential privacy")
        return {"nk": 1.0, "counts": float(np.sqrt(len(self.n_categories)))}

    # ---- queries ------------------------------------------------------------------------
    def client_query(self, name, payload, data, state, rng):
        if name == "loglik":
            p = payload_params(payload)
            _, norm, _ = self.e_step(p, self._codes(data), self.covariates(data.X))
            fw = data.weight
            return {"n": data.mass(), "loglik": float(norm.sum() if fw is None else norm @ fw)
                    }, state
        if name == "information":
            from .inference import lca_information

            p = payload_params(payload)
            info, ll = lca_information(self, p, data.X, data.weight)
            return {"n": data.mass(), "loglik": ll, "information": info}, state
        return super().client_query(name, payload, data, state, rng)


@register_start("lca")
def lca_start(model: LCAModel, ctx) -> list[dict]:
    """The start (the estimator's, and the one a verifying site replays,
    :mod:`fedlatent.engine.node.replay_start`): the random-membership sums, then one M-step on
    them (with concomitant variables: gamma's start)."""
    total = int(offsets(model.n_categories)[-1])
    S = random_membership_stats(ctx, {"nk": (model.K,), "counts": (model.K, total)})
    return [model.server_step(S, {}, 0.0)]
