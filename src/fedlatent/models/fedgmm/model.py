"""FedGMM's engine side: client statistics, server M-step and initialization queries."""

from __future__ import annotations

import numpy as np

from ...data.dataset import ClientData
from ...engine.contract.model import ClientStep, FederatedModel, register_model
from ...engine.contract.params import Integer, Options, Real
from ...engine.protocol.messages import count_problem, psd_problem
from ...engine.protocol.numerics import add_intercept, lift_eigenvalues
from ...engine.stats import Stats
from ..gmm import (
    GMMModel,
    compute_precision_cholesky,
    floor_noisy_covariances,
    gmm_m_step,
    gmm_statistics,
)
from ..gmm.math import COV_TYPES
from ..gmm.model import gaussian_problem
from ..logistic import irls_statistics, local_refit, newton_solve, weighted_grad_hess
from .dp import fedgmm_dp_sensitivity, personal_weights
from .math import fedgmm_log_components, fedgmm_responsibilities
from .screen import hessian_bound_problem

__all__ = ["FedGMMModel", "initial_coef", "start_from"]

_GMM_QUERIES = ("moments", "kmeans", "hard_stats")


def initial_coef(model: FedGMMModel, seed: int, d: int, scale: float = 1.0) -> np.ndarray:
    """The learners' starting coefficients, drawn from the fit's seed: the learner's own
    ``init_params`` (a torch learner), else ``scale`` times standard normal draws over
    ``sqrt(d + 1)``, shape (n_learners, K - 1, d + 1)."""
    rng = np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(0xF3D6,)))
    learner = model.learner(d)
    if learner is not None:
        return np.stack([learner.init_params(rng) for _ in range(model.M2)])
    return float(scale) * rng.standard_normal((model.M2, model.K - 1, d + 1)) / np.sqrt(d + 1)


def start_from(gaussians: dict, coef: np.ndarray) -> dict:
    """FedGMM's start from its Gaussian part's (:func:`~fedlatent.models.gmm.init.
    initialize_gaussians`) and the learners' coefficients, the learners equally weighted."""
    return {"weights_x": gaussians["weights"], "means": gaussians["means"],
            "precisions_cholesky": gaussians["precisions_cholesky"],
            "center": gaussians["center"], "coef": coef,
            "weights_y": np.full(coef.shape[0], 1.0 / coef.shape[0])}


@register_model
class FedGMMModel(FederatedModel):
    """FedGMM math for the engine.

    Config: ``n_input_components``, ``n_learners``, ``classes`` (list of label values),
    ``covariance_type``, ``reg_covar``, ``l2``, ``learner_update``, ``covariance_aggregation``,
    ``local_steps``, ``prox``, and ``private=True`` under differential privacy (the E-step
    of the released sums then uses the public weights and the learners send gradients:
    :mod:`fedlatent.models.fedgmm.dp`). Client state: ``pi`` of shape (M1, M2).
    """

    name = "fedgmm"
    config_constraints = {"n_input_components": [Integer(1)], "n_learners": [Integer(1)],
                          "covariance_type": [Options(*COV_TYPES)], "reg_covar": [Real(0)],
                          "l2": [Real(0)], "local_steps": [Integer(1)], "prox": [Real(0)],
                          "newton_step_max": [None, Real(0, closed="neither")]}
    batched_step = True
    point_state = True  # acceleration="newton": the clients carry pi_c along (pointstate)
    #: an extrapolated mixing weight keeps at least this fraction of the weight the client
    #: holds (:meth:`project_point_state`; measured, see ``benchmarks/rounds_to_tol.py``)
    pi_keep = 0.9

    def __init__(
        self,
        n_input_components: int,
        n_learners: int,
        classes: list,
        covariance_type: str = "full",
        reg_covar: float = 1e-6,
        l2: float = 1e-3,
        learner_update: str = "newton",
        covariance_aggregation: str = "exact",
        local_steps: int = 1,
        prox: float = 0.0,
        newton_step_max: float | None = 5.0,
        learner: str = "logistic",
        learner_params: dict | None = None,
        n_features: int | None = None,
        private: bool = False,
    ):
        extra = {"private": True} if private else {}  # the non-private config is unchanged
        super().__init__(
            n_input_components=int(n_input_components),
            n_learners=int(n_learners),
            classes=list(classes),
            covariance_type=str(covariance_type),
            reg_covar=float(reg_covar),
            l2=float(l2),
            learner_update=str(learner_update),
            covariance_aggregation=str(covariance_aggregation),
            local_steps=int(local_steps),
            prox=float(prox),
            newton_step_max=None if newton_step_max is None else float(newton_step_max),
            learner=str(learner),
            learner_params=dict(learner_params or {}),
            n_features=None if n_features is None else int(n_features),
            **extra,
        )
        self.private = bool(private)
        self.learner_name = str(learner)
        self.learner_params = dict(learner_params or {})
        self.n_features = n_features
        self._learner_cache = None
        self.step_max = None if newton_step_max is None else float(newton_step_max)
        self.M1, self.M2 = int(n_input_components), int(n_learners)
        self.classes = np.asarray(classes)
        self.K = len(classes)
        self.cov_type = covariance_type
        self.reg = float(reg_covar)
        self.l2 = float(l2)
        self.update = learner_update
        self.cov_agg = covariance_aggregation
        self.local_steps = int(local_steps)
        self.prox = float(prox)

    def encode(self, y: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.classes, y)

    def learner(self, n_features: int):
        """The learner object (None for the built-in logistic regression)."""
        if self.learner_name == "logistic":
            return None
        if self._learner_cache is None:
            from ..torch_learner import TorchMLPLearner

            self._learner_cache = TorchMLPLearner(n_features, self.K, **self.learner_params)
        return self._learner_cache

    def init_client_state(self, data: ClientData) -> dict[str, np.ndarray]:
        return {"pi": np.full((self.M1, self.M2), 1.0 / (self.M1 * self.M2))}

    def project_point_state(self, states: dict[str, np.ndarray],
                            start: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Extrapolated mixing weights ``pi_c`` (rows: clients) kept at least :attr:`pi_keep`
        of the weights ``start`` the client holds, renormalized over the ``(M1, M2)`` pairs:
        a weight extrapolated to 0 or below would stay near 0 (EM moves a weight in
        proportion to it), and large cuts of small weights stalled the fits measured."""
        pi = np.maximum(np.asarray(states["pi"], dtype=np.float64),
                        self.pi_keep * np.asarray(start["pi"], dtype=np.float64))
        return {**states, "pi": pi / pi.sum(axis=(-2, -1), keepdims=True)}

    def objective_penalty(self, params) -> float:
        """The learners' ridge the M-step adds (``l2`` times each learner's mass, which sums
        to 1 over the learners, ``weights_y``): ``0.5 l2 sum_m w_m |coef_m|^2``."""
        coef = np.asarray(params["coef"], dtype=np.float64).reshape(self.M2, -1)
        w = np.asarray(params["weights_y"], dtype=np.float64)
        return 0.5 * self.l2 * float(w @ np.einsum("mp,mp->m", coef, coef))

    def client_stats(self, params, data, state, rng, rows=None) -> ClientStep:
        X = data.X if rows is None else data.X[rows]
        y = self.encode(data.y if rows is None else data.y[rows])
        if np.isnan(X).any():  # missing values: each input component's completion (.missing)
            from .missing import missing_client_stats

            return missing_client_stats(self, params, data, X, y, state, rng, rows)
        n = X.shape[0]
        learner = self.learner(X.shape[1])
        lg, lp = fedgmm_log_components(X, params, self.cov_type, learner)
        lpy = lp[np.arange(n), :, y]  # (n, M2)
        q, loglik = fedgmm_responsibilities(lg, lpy, state["pi"])
        fw = data.weights_of(rows)  # frequency weights: a row of weight w is w rows
        new_pi = q.mean(axis=0) if fw is None else np.einsum("n,nij->ij", fw, q) / fw.sum()
        if self.private:  # the released sums: public weights, so one record moves only its q
            new_pi = personal_weights(lg, lpy, new_pi, fw)  # pi_c stays home: no budget
            q, loglik = fedgmm_responsibilities(lg, lpy, params["pi_joint"])
        if fw is not None:
            q, loglik = q * fw[:, None, None], loglik * fw
        rx, ry = q.sum(axis=2), q.sum(axis=1)
        stats = dict(gmm_statistics(X, rx, params["center"], self.cov_type, fw))
        if self.cov_agg == "paper":
            nk = stats["nk"] + 10 * np.finfo(np.float64).eps
            stats["sxx"] = stats["sxx"] - self._outer(stats["sx"], nk)
        stats["lw"] = ry.sum(axis=0)
        if self.private:
            stats["pq"] = q.sum(axis=0)
        self.learner_stats(stats, X, y, ry, lp, params["coef"], learner, rng)
        return ClientStep(Stats(stats, copy=False), data.mass(rows),  # loglik: in row order
                          float(np.cumsum(loglik)[-1]) if n else 0.0, {"pi": new_pi})

    def learner_stats(self, stats: dict, X, y, ry, lp, coef, learner, rng) -> None:
        """Add the learners' statistics of rows ``X`` (labels ``y``, learner weights ``ry``
        (n, M2), log class probabilities ``lp`` (n, M2, K)) into ``stats``: the IRLS sums
        (``lb``/``lg``, ``lH``) or the weighted local refits ``ltheta``."""
        Xa = add_intercept(X)
        lw = stats["lw"]
        if self.update == "newton":
            P = coef[0].size
            lb, lH = np.empty((self.M2, P)), np.empty((self.M2, P, P))
            newton = weighted_grad_hess if self.private else irls_statistics
            for m in range(self.M2):  # the learners' probabilities are lp's, computed above
                lb[m], lH[m] = newton(Xa, y, ry[:, m], coef[m],
                                      None if learner is not None else lp[:, m])
            stats["lg" if self.private else "lb"], stats["lH"] = lb, lH
        else:
            lt = np.empty((self.M2, coef[0].size))
            for m in range(self.M2):
                if learner is not None:
                    lt[m] = lw[m] * learner.refit(X, y, ry[:, m], coef[m], self.l2, self.prox, rng)
                    continue
                c_m = local_refit(Xa, y, ry[:, m], coef[m], self.l2 * lw[m], self.local_steps,
                                  self.prox * lw[m], self.step_max)
                lt[m] = lw[m] * c_m.ravel()
            stats["ltheta"] = lt

    def client_stats_batched(self, params, X, y, w, state):
        from .batched import fedgmm_batched_stats

        if self.private:  # the private step is the one-by-one one (the engine's choice too)
            return None
        return fedgmm_batched_stats(self, params, X, y, w, state)

    def _outer(self, sx: np.ndarray, nk: np.ndarray) -> np.ndarray:
        """``sx sx^T / nk`` in the layout of ``sxx`` (removes the client's own mean)."""
        if self.cov_type == "full":
            return np.einsum("ki,kj->kij", sx, sx) / nk[:, None, None]
        if self.cov_type == "tied":
            return (sx / nk[:, None]).T @ sx
        return sx**2 / nk[:, None]

    def reply_numbers(self, data: ClientData) -> int:
        """The Gaussian blocks as a Gaussian mixture's, the learners' weights and their
        Newton sums (or refitted parameters)."""
        from ...engine.privacy.disclosure import free_numbers

        d = int(data.n_features)
        learner = self.learner(d)
        P = (self.K - 1) * (d + 1) if learner is None else int(learner.n_params)
        coef = np.zeros((self.M2, max(P, 1)))
        shapes = self.stat_shapes({"means": np.zeros((self.M1, d)), "coef": coef})
        return free_numbers(shapes, ("sxx", "lH"))

    def record_width(self, data: ClientData) -> int:
        """A record's features and its label."""
        return int(data.n_features) + 1

    def evaluated_shapes(self, data: ClientData) -> dict[str, tuple[int, ...]]:
        """The input components' ``weights_x`` (M1,), ``means`` (M1, d),
        ``precisions_cholesky`` by covariance type, ``center`` (d,); the learners' ``coef``
        (M2, K - 1, d + 1) for the logistic learner (M2, n_params for another),
        ``weights_y`` (M2,); the joint table ``pi_joint`` (M1, M2) of private fits."""
        M1, M2, d = self.M1, self.M2, int(data.n_features)
        prec = {"full": (M1, d, d), "tied": (d, d), "diag": (M1, d), "spherical": (M1,)}
        learner = self.learner(d)
        coef = (M2, self.K - 1, d + 1) if learner is None else (M2, int(learner.n_params))
        return {"weights_x": (M1,), "means": (M1, d), "precisions_cholesky": prec[self.cov_type],
                "center": (d,), "coef": coef, "weights_y": (M2,), "pi_joint": (M1, M2)}

    def stat_shapes(self, params):
        M1, d = params["means"].shape
        sxx = {"full": (M1, d, d), "tied": (d, d), "diag": (M1, d), "spherical": (M1, d)}
        P = params["coef"][0].size
        shapes = {"nk": (M1,), "sx": (M1, d), "sxx": sxx[self.cov_type], "lw": (self.M2,)}
        if self.private:
            shapes["pq"] = (M1, self.M2)
        if self.update == "newton":
            shapes.update({"lg" if self.private else "lb": (self.M2, P), "lH": (self.M2, P, P)})
        else:
            shapes["ltheta"] = (self.M2, P)
        return shapes

    def check(self, stats, n_units, slack=None):
        """The Gaussian blocks as a Gaussian mixture's (``paper`` aggregation: around the
        client's own means, so the second moments are put back first); the learners' weights
        ``lw`` counts of the same samples; each learner's Hessian ``lH`` (a sum of
        ``w x x^T``-type terms) positive semi-definite and bounded by ``lw`` and ``sxx``
        (:mod:`.screen`)."""
        G = {k: np.asarray(stats[k], dtype=np.float64) for k in ("nk", "sx", "sxx")}
        if self.cov_agg == "paper":
            G["sxx"] = G["sxx"] + self._outer(G["sx"], G["nk"] + 10 * np.finfo(np.float64).eps)
        reason = gaussian_problem(G, n_units, self.cov_type, slack)
        if reason:
            return reason
        reason = count_problem("lw", stats["lw"], n_units, None if slack is None else slack["lw"])
        if reason or "lH" not in stats:
            return reason
        return psd_problem("the Hessian 'lH'", stats["lH"],
                           None if slack is None else slack["lH"], "learner") or \
            hessian_bound_problem(G["sxx"], stats["lH"], stats["lw"], self.cov_type, slack)

    def server_step(self, S, params, n_total):
        if self.private:
            return self._private_server_step(S, params, n_total)
        G = {k: S[k] for k in ("nk", "sx", "sxx")}
        if self.cov_agg == "paper":
            nk = G["nk"] + 10 * np.finfo(np.float64).eps
            G["sxx"] = G["sxx"] + self._outer(G["sx"], nk)
        wx, means, cov = gmm_m_step(Stats(G, copy=False), params["center"], self.cov_type,
                                    self.reg)
        # a component with (almost) no mass keeps its parameters: its ratios are rounding noise
        dead = S["nk"] * n_total < 1e-8
        prec = np.array(params["precisions_cholesky"], copy=True)
        if self.cov_type == "tied" or not dead.any():
            prec = compute_precision_cholesky(cov, self.cov_type)
        else:
            alive = ~dead
            prec[alive] = compute_precision_cholesky(cov[alive], self.cov_type)
            means[dead] = params["means"][dead]
        coef = params["coef"]
        lw = S["lw"]
        new = np.empty_like(coef)
        for m in range(self.M2):
            if self.update == "newton":
                new[m] = newton_solve(S["lb"][m], S["lH"][m], self.l2 * lw[m], coef[m].shape)
                step = np.max(np.abs(new[m] - coef[m]))
                if self.step_max is not None and step > self.step_max:
                    # damped Newton (trust region on the coefficients)
                    new[m] = coef[m] + (new[m] - coef[m]) * (self.step_max / step)
            elif lw[m] > 0:
                new[m] = (S["ltheta"][m] / lw[m]).reshape(coef[m].shape)
            else:
                new[m] = coef[m]
        return {
            "weights_x": wx,
            "means": means,
            "precisions_cholesky": prec,
            "center": params["center"],
            "coef": new,
            "weights_y": lw / max(lw.sum(), np.finfo(np.float64).tiny),
        }

    def _private_server_step(self, S, params, n_total):
        """The M-step on noisy sums: counts and learner masses floored (a noisy count can be
        negative; a component or learner left with none keeps its parameters), covariances
        projected onto the cone with eigenvalues at least 1e-3 of their mean variance, Hessians
        onto theirs with eigenvalues at least the noise's scale (``dp_ridge``,
        :func:`~fedlatent.models.fedgmm.dp.hessian_ridge`), and the IRLS right-hand side
        formed here from
        the noisy gradient, ``b = H theta - g``. All post-processing."""
        nk = np.asarray(S["nk"], dtype=np.float64)
        tiny = 1e-10 * max(float(np.abs(nk).sum()), 1e-300)
        dead = nk <= max(tiny, 1e-8 / max(n_total, 1))
        G = {"nk": np.maximum(nk, tiny), "sx": S["sx"], "sxx": S["sxx"]}
        wx, means, cov = gmm_m_step(Stats(G, copy=False), params["center"], self.cov_type,
                                    self.reg)
        # noisy moments: eigenvalues kept well away from 0 (as the private GMM does)
        cov = floor_noisy_covariances(cov, self.cov_type, self.reg, alive=~dead)
        prec = np.array(params["precisions_cholesky"], copy=True)
        if self.cov_type == "tied" or not dead.any():
            prec = compute_precision_cholesky(cov, self.cov_type)
        else:
            prec[~dead] = compute_precision_cholesky(cov[~dead], self.cov_type)
            means[dead] = params["means"][dead]
        lw = np.asarray(S["lw"], dtype=np.float64)
        lw_tiny = 1e-10 * max(float(np.abs(lw).sum()), 1e-300)
        coef = params["coef"]
        ridge = float(params.get("dp_ridge", 0.0)) / max(float(n_total), 1.0)  # mean scale
        H = lift_eigenvalues(np.asarray(S["lH"], dtype=np.float64), ridge)[0]
        new = np.array(coef, dtype=np.float64, copy=True)
        for m in range(self.M2):
            if lw[m] <= lw_tiny:
                continue  # no mass: the learner keeps its coefficients
            b = H[m] @ coef[m].ravel() - S["lg"][m]
            new[m] = newton_solve(b, H[m], self.l2 * lw[m], coef[m].shape)
            step = np.max(np.abs(new[m] - coef[m]))
            if self.step_max is not None and step > self.step_max:
                new[m] = coef[m] + (new[m] - coef[m]) * (self.step_max / step)
        lw = np.maximum(lw, lw_tiny)
        pq = np.asarray(S["pq"], dtype=np.float64)
        pq = np.maximum(pq, 1e-10 * max(float(np.abs(pq).sum()), 1e-300))
        return {"weights_x": wx, "means": means, "precisions_cholesky": prec,
                "center": params["center"], "coef": new, "weights_y": lw / lw.sum(),
                "pi_joint": pq / pq.sum(),
                **({"dp_ridge": np.array(params["dp_ridge"], copy=True)}
                   if "dp_ridge" in params else {})}

    # ---- differential privacy (see .dp) -------------------------------------------------------
    def dp_clip(self, data, dp):
        """Feature rows clipped to the ball of ``dp.clip`` around the centre; the labels are
        classes and stay as they are."""
        from ...engine.privacy.clipping import clip_rows

        return data.replace(X=clip_rows(data.X, dp.clip, dp.center_for(data.n_features)))

    def dp_sensitivity(self, params, dp):
        if not self.private:
            raise ValueError("FedGMMModel was built without private=True; build it with FedGMM "
                             "under Federation(privacy=...)")
        return fedgmm_dp_sensitivity(dp, params["center"], self.K)

    def dp_query_sensitivity(self, name, payload, dp):
        if name in ("moments", "hard_stats"):  # the Gaussian part's start (the GMM's queries)
            return GMMModel(self.M1, self.cov_type, self.reg).dp_query_sensitivity(
                name, payload, dp)
        return None

    def client_query(self, name, payload, data, state, rng):
        if name in _GMM_QUERIES:
            gm = GMMModel(self.M1, self.cov_type, self.reg)
            gm.disclosure = self.disclosure
            gm.privacy = self.privacy
            return gm.client_query(name, payload, data, {}, rng)[0], state
        return super().client_query(name, payload, data, state, rng)
