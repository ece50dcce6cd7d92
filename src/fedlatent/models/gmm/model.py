"""The Gaussian mixture's engine side: client statistics, the M-step, initialization queries.

Clients send, per component k, ``sum q``, ``sum q x`` and ``sum q x x^T`` (the diagonal for
"diag"/"spherical", one pooled ``sum x x^T`` for "tied") computed around a fixed centre broadcast
at initialization (the federated global mean), which keeps the second moments well conditioned.
"""

from __future__ import annotations

import numpy as np

from ...data.dataset import ClientData
from ...engine.contract.model import ClientStep, FederatedModel, Params, payload_params
from ...engine.contract.params import Integer
from ...engine.contract.registry import register_model
from ...engine.protocol.compiled import worth
from ...engine.protocol.messages import count_problem, psd_problem
from ...engine.protocol.numerics import kmeans, logsumexp
from ...engine.stats import Stats
from .check_step import full_step_holds
from .dp import gmm_sensitivity
from .math import (
    compute_precision_cholesky,
    estimate_log_gaussian_prob,
    floor_covariances,
    floor_noisy_covariances,
    gmm_m_step,
    gmm_statistics,
    hold_degenerate,
    lean_full_step,
    merged_rows,
)
from .params import PARAMETER_CONSTRAINTS

__all__ = ["GMMModel", "gaussian_problem", "payload_params"]


def gaussian_problem(stats, n_units: float, covariance_type: str, slack=None) -> str | None:
    """Why ``stats`` (``nk``, ``sx``, ``sxx`` summed over ``n_units`` samples, as
    :func:`~fedlatent.models.gmm.math.gmm_statistics` computes them) cannot be a client's
    (None when they can): counts in ``[0, n_units]`` summing to ``n_units``, and per component
    the moment matrix ``sum q [1; x][1; x]^T`` positive semi-definite, i.e. the implied
    covariance ``sxx - sx sx^T / nk`` is (for "tied", ``[[diag(nk), sx], [sx^T, sxx]]``; for
    "diag"/"spherical", each coordinate's 2x2 matrix). Vectorized over components."""
    e = (lambda k: None) if slack is None else (lambda k: slack[k])
    reason = count_problem("nk", stats["nk"], n_units, e("nk"))
    if reason:
        return reason
    nk, sx, sxx = (np.asarray(stats[k], dtype=np.float64) for k in ("nk", "sx", "sxx"))
    K, d = sx.shape

    def moments(nk, sx, sxx):
        if covariance_type == "full":
            M = np.empty((K, d + 1, d + 1))
            M[:, 0, 0], M[:, 0, 1:], M[:, 1:, 0], M[:, 1:, 1:] = nk, sx, sx, sxx
            return M
        if covariance_type == "tied":
            M = np.zeros((1, K + d, K + d))
            M[0, :K, :K] = np.diag(nk)
            M[0, :K, K:], M[0, K:, :K], M[0, K:, K:] = sx, sx.T, sxx
            return M
        M = np.empty((K * d, 2, 2))
        M[:, 0, 0] = np.repeat(nk, d)
        M[:, 0, 1] = M[:, 1, 0] = sx.ravel()
        M[:, 1, 1] = sxx.ravel()
        return M

    E = None if slack is None else moments(*(np.abs(slack[k]) for k in ("nk", "sx", "sxx")))
    label = {"full": "component", "tied": "the pooled statistic (all components)",
             "diag": "component-coordinate", "spherical": "component-coordinate"}[
        covariance_type]
    reason = psd_problem("the moment matrix [[sum q, sum q x], [sum q x, sum q x x^T]]",
                         moments(nk, sx, sxx), E, label)
    if reason and covariance_type == "tied":
        reason = reason.replace(" 0 is", " is")
    return reason


def _missing_width(payload, d: int) -> None:
    """Under differential privacy a ``moments`` query of a site with missing values (whose
    reply holds the pairwise observed counts) says ``missing``, the site's own number of
    columns ``d`` (what the honest start sends): it is the counts' DP sensitivity
    (:meth:`GMMModel.dp_query_sensitivity`), so a server that sent ``missing=1e-9``, or none,
    had them released exact under a release the ledger counts as DP (issue 38's audit).
    DisclosureRefused otherwise."""
    got = payload.get("missing")
    try:
        ok = float(np.asarray(got, dtype=np.float64).reshape(())) == d
    except (TypeError, ValueError):
        ok = False
    if not ok:
        from ...engine.privacy.enforce import DisclosureRefused

        raise DisclosureRefused(
            f"query with missing={got!r}, not this site's {d} columns: it sets the noise of "
            f"the pairwise observed counts (one row adds at most d); ask with missing={d}")


@register_model
class GMMModel(FederatedModel):
    """Gaussian mixture math for the engine. Config: n_components, covariance_type, reg_covar."""

    name = "gmm"
    config_constraints = {"n_components": [Integer(1)],  # (the estimator's table, .params)
                          **{k: PARAMETER_CONSTRAINTS[k] for k in ("covariance_type", "reg_covar")}}
    batched_step = True
    batched_out = True
    batched_queries = frozenset({"moments", "hard_stats", "loglik"})

    def __init__(self, n_components: int, covariance_type: str = "full", reg_covar: float = 1e-6):
        super().__init__(
            n_components=int(n_components),
            covariance_type=str(covariance_type),
            reg_covar=float(reg_covar),
        )
        self.K = int(n_components)
        self.cov_type = covariance_type
        self.reg = float(reg_covar)

    def _log_resp(self, params: Params, X: np.ndarray):
        wlp = estimate_log_gaussian_prob(
            X, params["means"], params["precisions_cholesky"], self.cov_type
        ) + np.log(params["weights"])
        norm = logsumexp(wlp, axis=1)
        return wlp - norm[:, None], norm

    def client_stats(self, params, data, state, rng, rows=None) -> ClientStep:
        X = data.X if rows is None else data.X[rows]
        if np.isnan(X).any():  # missing values: the E-step over observed parts (.missing)
            from .missing_model import missing_step, refuse_weights

            refuse_weights(data)
            return missing_step(self, params, X, state)
        log_resp, norm = self._log_resp(params, X)
        resp, fw = np.exp(log_resp), data.weights_of(rows)
        if fw is not None:  # frequency weights: a row of weight w is w rows
            resp, norm = resp * fw[:, None], norm * fw
        stats = gmm_statistics(X, resp, params["center"], self.cov_type, fw)
        # summed in row order (as the batched step sums): the same bits on either path
        return ClientStep(stats, data.mass(rows),
                          float(np.cumsum(norm)[-1]) if len(norm) else 0.0, state)

    def client_stats_batched(self, params, X, y, w, state, out=None):
        from .batched import gmm_batched_stats

        return gmm_batched_stats(params, X, w, self.cov_type, state, out)

    def client_query_batched(self, name, payload, X, y, w, state):
        from .batched import gmm_batched_query

        return gmm_batched_query(self, name, payload, X, w)

    def check_many(self, stats, n_units, slack=None):
        from .batched import gaussian_suspects

        return gaussian_suspects(stats, n_units, self.cov_type, slack)

    def check_rows(self, rows):
        """Full covariances, where numba pays (:func:`~fedlatent.engine.protocol.compiled.
        worth`: many moment matrices in the round): the rows read where they are by a
        compiled screen (:func:`~fedlatent.models.gmm.batched.gaussian_row_suspects`); else
        the default."""
        if self.cov_type == "full" and worth(max(len(rows), rows.work) * self.K):
            from .batched import gaussian_row_suspects

            return gaussian_row_suspects(rows)
        return super().check_rows(rows)

    # ---- differential privacy ---------------------------------------------------------------
    def dp_clip(self, data, dp):
        if np.isnan(data.X).any():  # rows clipped on their observed coordinates
            from .missing_model import clip_observed

            return clip_observed(data, dp)
        return super().dp_clip(data, dp)

    def dp_sensitivity(self, params, dp):
        """:func:`~fedlatent.models.gmm.dp.gmm_sensitivity` of the clipping radius, widened by
        the distance from the clipping centre to the centre the statistics are taken about."""
        c = np.asarray(params["center"], dtype=np.float64)
        R = dp.clip + float(np.linalg.norm(c - dp.center_for(c.size)))
        return gmm_sensitivity(R)

    def dp_query_sensitivity(self, name, payload, dp):
        if name == "moments":  # n is public (client sizes are); sums about the centre
            if payload.get("missing"):  # pairwise observed counts: a row adds <= d ones
                return {"nobs": float(payload["missing"]), "sx": dp.clip, "sxx": dp.clip ** 2}
            return {"sx": dp.clip, "sxx": dp.clip ** 2}
        if name == "hard_stats":  # one-hot responsibilities: a round's bounds
            c = np.asarray(payload["center"], dtype=np.float64)
            R = dp.clip + float(np.linalg.norm(c - dp.center_for(c.size)))
            return {f"stat/{k}": v for k, v in gmm_sensitivity(R).items()}
        return None

    def reply_numbers(self, data: ClientData) -> int:
        """``K (1 + d + d (d + 1) / 2)`` for full covariances (tied: one ``d x d`` block;
        diagonal, spherical: ``K (1 + 2 d)``)."""
        from ...engine.privacy.disclosure import free_numbers

        d = int(data.n_features)
        sym = ("sxx",) if self.cov_type in ("full", "tied") else ()
        return free_numbers(self.stat_shapes({"means": np.zeros((self.K, d))}), sym)

    def evaluated_shapes(self, data: ClientData) -> dict[str, tuple[int, ...]]:
        """``weights`` (K,), ``means`` (K, d), ``precisions_cholesky`` by covariance type,
        ``center`` (d,)."""
        K, d = self.K, int(data.n_features)
        prec = {"full": (K, d, d), "tied": (d, d), "diag": (K, d), "spherical": (K,)}
        return {"weights": (K,), "means": (K, d), "precisions_cholesky": prec[self.cov_type],
                "center": (d,)}

    def stat_shapes(self, params):
        K, d = params["means"].shape
        sxx = {"full": (K, d, d), "tied": (d, d), "diag": (K, d), "spherical": (K, d)}
        return {"nk": (K,), "sx": (K, d), "sxx": sxx[self.cov_type]}

    def check(self, stats, n_units, slack=None):
        return gaussian_problem(stats, n_units, self.cov_type, slack)

    def server_step(self, S, params, n_total):
        # Stochastic statistics (quantized, mini-batch, partial participation) can leave the set
        # where T is defined; project the parameters back (the exact-EM path is untouched).
        tiny = 1e-10 * max(float(np.abs(S["nk"]).sum()), 1e-300)
        if self.privacy is not None:  # noisy counts: a component keeps >= 1% of its share
            tiny = 0.01 * max(float(np.abs(S["nk"]).sum()), 1e-300) / S["nk"].size
        if np.any(S["nk"] <= tiny):
            S = Stats({**S, "nk": np.maximum(S["nk"], tiny)})
        w, m, cov = gmm_m_step(S, params["center"], self.cov_type, self.reg)
        if self.privacy is not None:  # noisy moments: eigenvalues kept well away from 0
            cov = floor_noisy_covariances(cov, self.cov_type, self.reg)
        else:  # a component kept off a point mass (engine/contract/degenerate.py)
            cov = hold_degenerate(cov, S, self.cov_type)[0]
        try:
            prec = compute_precision_cholesky(cov, self.cov_type)
        except ValueError:
            cov = floor_covariances(cov, self.cov_type, max(self.reg, 1e-6))
            prec = compute_precision_cholesky(cov, self.cov_type)
        return {"weights": w, "means": m, "precisions_cholesky": prec, "center": params["center"]}

    def replay_step(self, S, params, n_total):
        """A verifying site's M-step: :func:`~.math.lean_full_step` for full covariances
        without privacy (a few batched calls, no eigenvalues), :meth:`server_step` wherever
        that declines."""
        if self.cov_type == "full" and self.privacy is None:
            out = lean_full_step(S, params["center"], self.reg)
            if out is not None:
                return out
        return self.server_step(S, params, n_total)

    def inference_params(self, S, params, n_total):
        """:meth:`server_step` with the covariances the estimator reports (the M-step's, a
        component held off a point mass as ``GaussianMixture._store`` holds it): what the
        information query is asked at."""
        out = self.server_step(S, params, n_total)
        _, _, cov = gmm_m_step(S, params["center"], self.cov_type, self.reg)
        return {**out, "covariances": hold_degenerate(cov, S, self.cov_type)[0]}

    def check_step(self, S, sent, params, n_total, rtol):
        """Full covariances without privacy: :func:`~.check_step.full_step_holds` (products
        only, no factorization); False otherwise (the site replays the M-step)."""
        if self.cov_type != "full" or self.privacy is not None:
            return False
        return full_step_holds(S, sent, params["center"], self.reg, rtol)

    # ---- initialization exchanges (aggregates only) --------------------------------------
    def client_query(self, name, payload, data, state, rng):
        X, fw = data.X, data.weight
        if np.isnan(X).any() or payload.get("missing"):  # .missing_model: NaN-aware queries
            from .missing_model import missing_query, refuse_weights

            refuse_weights(data)
            if name == "moments" and self.privacy is not None:  # (its noise: by missing)
                _missing_width(payload, X.shape[1])
            reply = missing_query(self, name, payload, X, hard_labels, data.entity)
            if reply is not None:
                return reply, state
        if name == "moments":
            if self.privacy is not None:  # about the clipping centre: bounded by the radius
                X = X - self.privacy.center_for(X.shape[1])
            WX = X if fw is None else X * fw[:, None]
            return {"n": data.mass(), "sx": WX.sum(0), "sxx": WX.T @ X}, state
        if name == "kmeans":
            k = int(payload["k"])
            min_points = int(payload["min_points"])
            if self.disclosure.count_scope == "client":  # a centroid is a mean over its points
                min_points = max(min_points, self.disclosure.min_records_per_block)
            n_loc = min(k, X.shape[0] // max(min_points, 1))
            if n_loc < 1:
                d = X.shape[1]
                return {"centroids": np.zeros((0, d)), "counts": np.zeros(0)}, state
            _, labels, _ = kmeans(X, n_loc, rng, n_init=3, sample_weight=fw)
            counts = np.bincount(labels, weights=fw, minlength=n_loc).astype(float)
            keep = (np.bincount(labels[fw > 0] if fw is not None else labels,
                                minlength=n_loc) >= min_points) & (counts > 0)  # records
            sums = np.zeros((n_loc, X.shape[1]))
            np.add.at(sums, labels, X if fw is None else X * fw[:, None])
            cent = sums[keep] / counts[keep, None]
            return {"centroids": cent, "counts": counts[keep]}, state
        if name == "hard_stats":
            centers = np.asarray(payload["centers"])
            d2 = (
                np.einsum("ij,ij->i", X, X)[:, None] - 2 * X @ centers.T
                + np.einsum("ij,ij->i", centers, centers)[None, :]
            )
            labels = hard_labels(d2, self.disclosure)
            if self.privacy is None:  # a merged row keeps its place about its own centre
                X = merged_rows(X, centers, labels, d2.argmin(-1))
            resp = np.zeros((X.shape[0], centers.shape[0]))
            resp[np.arange(X.shape[0]), labels] = 1.0
            resp = resp if fw is None else resp * fw[:, None]
            st = gmm_statistics(X, resp, np.asarray(payload["center"]), self.cov_type, fw)
            if not payload.get("second", 1):  # counts and sums only
                st = {k: st[k] for k in ("nk", "sx")}
            return {f"stat/{k}": v for k, v in st.items()}, state
        if name == "loglik":
            _, norm = self._log_resp(payload_params(payload), X)
            return {"n": data.mass(), "loglik": float(norm.sum() if fw is None
                                                         else norm @ fw)}, state
        # Louis' observed information (fedlatent.engine.estimation.inference)
        if name == "information":
            from .inference import gmm_information_sums

            sums = gmm_information_sums(X, payload["params/weights"], payload["params/means"],
                                        payload["params/covariances"], self.cov_type,
                                        sample_weight=fw, entity=data.entity)
            return sums.reply(data.mass()), state
        return super().client_query(name, payload, data, state, rng)


def hard_labels(d2: np.ndarray, policy) -> np.ndarray:
    """Nearest-centre labels from squared distances ``d2`` (n, K), where the rows of a centre
    holding ``0 < m < min_records_per_block`` of them move to their nearest centre among those
    holding enough (a hard block of one row is that row), until none is too small; when no
    centre holds enough, every row goes to the largest. In every count scope: under secure
    aggregation too, so that the secure start is the plain one."""
    labels = d2.argmin(1)
    need = policy.min_records_per_block
    d2 = np.array(d2, dtype=np.float64, copy=True)
    while True:
        counts = np.bincount(labels, minlength=d2.shape[1])
        small = (counts > 0) & (counts < need)
        if not small.any():
            return labels
        if small.sum() == (counts > 0).sum():
            return np.full_like(labels, int(counts.argmax()))
        d2[:, small] = np.inf
        labels = d2.argmin(1)


