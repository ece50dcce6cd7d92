"""FedGMM under differential privacy: what is clipped, the sensitivity of every block, the
M-step on noisy sums, and what is refused.

Under ``Federation(privacy=DifferentialPrivacy(epsilon, delta, clip=R, center=c0))`` every
client clips its feature rows to the ball of radius ``R`` around ``c0``; the labels are classes
and are not clipped (``target_range`` is refused). One round is one release: the Gaussian sums
and the learners' Newton sums travel in the same message.

Two things change in the round's statistics so that one record's influence is bounded:

- **the public mixture weights in the E-step.** The paper's E-step weighs a record's
  responsibilities with the client's own ``pi_c``, which is the mean of the previous round's
  responsibilities of *all* its records: one record would move every other record's
  responsibilities through it, with no useful bound. The released sums are taken with a
  public joint table ``pi_joint`` (M1, M2) of the broadcast parameters instead (the paper's
  global ``pi`` of footnote 3: the clients also send ``pq = sum q``, and the server normalizes
  it), so each record's responsibilities depend on that record alone. Each client still
  updates its own ``pi_c`` every round (the paper's E-step, kept in its private state and
  never sent) for its personalized predictions;
- **gradients instead of the IRLS right-hand side.** ``b = H theta - g`` has a sensitivity that
  grows with ``||theta||``; the client sends the gradient ``g`` (``lg``) and ``H`` and the server
  forms ``b`` from the noisy sums and the broadcast ``theta`` (post-processing).

Sensitivity (add/remove one record, all blocks jointly). The record has responsibilities
``q`` in the simplex of ``M1 x M2``; its input marginal ``r = q.sum(1)`` and learner marginal
``s = q.sum(0)`` are in the simplices of ``M1`` and ``M2`` (so ``||r||_2, ||s||_2 <= 1``):

- ``nk``, ``sx``, ``sxx``: :func:`~fedlatent.models.gmm.dp.gmm_sensitivity` with
  ``R + ||center - c0||`` (the sums are about the broadcast ``center``, which the private start
  sets to ``c0``);
- ``lw = sum s``: ``||s||_2 <= 1``; ``pq = sum q``: ``||q||_F <= 1``;
- ``lg`` (M2, P), ``lH`` (M2, P, P): learner ``m`` receives ``s_m`` times one record's term of
  :func:`~fedlatent.engine.privacy.clipping.logistic_sensitivity` (bounds ``G``, ``H``); over
  the learners ``(sum_m s_m^2 G^2)^(1/2) <= G``, likewise ``H``. The learners' design is
  ``[x, 1]`` (not centred), so its radius is ``R + ||c0||``.

Few releases (issue 23, item 2): the private fit plans 5 rounds
(``FedGMM._private_max_rounds``) and reaches the converged non-private accuracy within about
a point because

- **the start ties each learner to an input component** (:func:`tied_table`): the public
  joint table starts nearly diagonal and the learners at small coefficients, so the first
  round's responsibilities hand learner ``m`` the rows of input component ``m`` and its first
  Newton step fits it there; the non-private fit finds that pairing only after dozens of
  rounds from a uniform table;
- **each client iterates its own ``pi_c``** to its fixed point at the broadcast parameters
  every round (:func:`personal_weights`, :data:`PI_ITERATIONS` local E-steps of the weights
  alone): ``pi_c`` never leaves the client and the released sums use the public table, so
  this costs no budget;
- **the Hessian gets a ridge at the noise's scale** (:func:`hessian_ridge`, the public
  parameter ``dp_ridge``): a learner's Hessian eigenvalues below the spectral scale of its
  noise are raised to it (LatentClassRegression's adaptive ridge), so a noisy, nearly
  singular Hessian cannot throw a learner's Newton step far off.

References
----------
Wu et al., "Personalized Federated Learning under Mixture of Distributions", ICML 2023 (the
model); Park, Foulds, Chaudhuri and Welling, "DP-EM", AISTATS 2017 (noisy sufficient
statistics).
"""

from __future__ import annotations

import numpy as np

from ...engine.privacy.clipping import logistic_sensitivity
from ..gmm.dp import gmm_sensitivity
from .math import fedgmm_responsibilities

__all__ = ["PI_ITERATIONS", "fedgmm_dp_sensitivity", "hessian_ridge", "personal_weights",
           "private_refusal", "private_start", "tied_table"]

#: the private start's joint table ties each learner to one input component; this share of
#: every component's mass is spread over all the learners (no pairing is ruled out)
TIE_SPREAD = 0.1
#: the learners' random start coefficients are scaled by this under DP (near zero every
#: learner fits its tied component's rows alike; the draw only breaks ties between learners)
PRIVATE_COEF_SCALE = 0.1
#: local E-steps of a client's own weights ``pi_c`` per private round (no release)
PI_ITERATIONS = 20


def private_refusal(est) -> str | None:
    """Why ``est`` (a FedGMM) cannot be fitted under its federation's privacy, or None."""
    fed = getattr(est, "federation", None)
    dp = None if fed is None else fed.privacy
    if dp is None:
        return None
    if "auto" in (est.n_input_components, est.n_learners):
        return ("an 'auto' size is chosen by held-out log-likelihoods released outside the "
                "privacy budget; give n_input_components and n_learners numbers under "
                "differential privacy")
    if est.learner_update != "newton":
        return ("learner_update='average' sends locally refitted parameters, whose sensitivity "
                "to one record is not bounded; use learner_update='newton' (and the logistic "
                "learner) under differential privacy")
    if est.covariance_aggregation != "exact":
        return ("covariance_aggregation='paper' sends scatter about each client's own means, "
                "whose sensitivity is not bounded; use covariance_aggregation='exact' under "
                "differential privacy")
    if dp.target_range is not None:
        return (f"DifferentialPrivacy(target_range={dp.target_range}) has no meaning for "
                "FedGMM, whose target is a class label (labels are not clipped); leave "
                "target_range=None")
    return None


def fedgmm_dp_sensitivity(dp, center: np.ndarray, n_classes: int) -> dict[str, float]:
    """Per-record L2 bounds of the private round's blocks (see the module docstring).

    Parameters
    ----------
    dp : DifferentialPrivacy
    center : ndarray of shape (n_features,)
        The broadcast centre the Gaussian sums are taken about.
    n_classes : int
    """
    center = np.asarray(center, dtype=np.float64)
    c0 = dp.center_for(center.size)
    out = dict(gmm_sensitivity(dp.clip + float(np.linalg.norm(center - c0))))
    lg = logistic_sensitivity(dp.clip + float(np.linalg.norm(c0)), int(n_classes))
    out.update(lw=1.0, pq=1.0, lg=lg["grad"], lH=lg["hess"])
    return out


def tied_table(weights_x: np.ndarray, n_learners: int, spread: float = TIE_SPREAD) -> np.ndarray:
    """The private start's joint table ``pi_joint`` (M1, M2): learner ``m`` tied to input
    component ``m mod M1`` (a component without a learner spreads its mass evenly), ``spread``
    of each component's weight over all the learners. Rows sum to ``weights_x``.

    Parameters
    ----------
    weights_x : ndarray of shape (M1,)
        The private start's input weights.
    n_learners : int
    spread : float in (0, 1]
    """
    w = np.asarray(weights_x, dtype=np.float64)
    M1, M2 = w.shape[0], int(n_learners)
    tie = np.zeros((M1, M2))
    tie[np.arange(M2) % M1, np.arange(M2)] = 1.0
    tie[tie.sum(axis=1) == 0] = 1.0  # more components than learners
    tie /= tie.sum(axis=1, keepdims=True)
    return w[:, None] * ((1.0 - spread) * tie + spread / M2)


def hessian_ridge(dp, center: np.ndarray, n_classes: int, noise_multiplier: float,
                  n_clients: int, threshold: int | None, n_params: int) -> float:
    """The spectral scale of the noise a round's summed learner Hessian ``lH`` carries (sum
    scale): ``sd * sqrt(2 P)``, ``sd`` its entry standard deviation over ``n_clients``
    clients (local noise, or shares of the calibrated noise over the secure-aggregation
    ``threshold``) and ``P`` a learner's coefficients. Public quantities only (the setting
    and the plan). The private M-step raises the Hessian's eigenvalues below it to it."""
    from ...engine.privacy.client_dp import matrix_noise_scale

    return matrix_noise_scale(fedgmm_dp_sensitivity(dp, center, n_classes), "lH",
                              noise_multiplier, dp.noise, n_clients, threshold, n_params)


def personal_weights(log_gauss: np.ndarray, log_py: np.ndarray, pi: np.ndarray,
                     weights: np.ndarray | None, n_iter: int = PI_ITERATIONS) -> np.ndarray:
    """A client's ``pi_c`` after ``n_iter`` more E-steps of the weights alone at fixed
    components (the mean responsibility under the previous ``pi_c``, frequency ``weights``
    when given). Its own state, never sent: no budget spent."""
    for _ in range(int(n_iter)):
        q = fedgmm_responsibilities(log_gauss, log_py, pi)[0]
        pi = (q.mean(axis=0) if weights is None
              else np.einsum("n,nij->ij", weights, q) / weights.sum())
    return pi


def private_start(ctx, weights_x: np.ndarray, center: np.ndarray, coef: np.ndarray,
                  n_classes: int) -> dict[str, np.ndarray]:
    """The private fit's start beyond the Gaussians (no release: post-processing of the
    private Gaussian start and public settings): ``coef`` scaled by
    :data:`PRIVATE_COEF_SCALE`, the tied table ``pi_joint`` (:func:`tied_table`) and
    ``dp_ridge`` (:func:`hessian_ridge`), from the fit's context ``ctx``."""
    coef = PRIVATE_COEF_SCALE * np.asarray(coef, dtype=np.float64)
    ridge = hessian_ridge(ctx.federation.privacy, center, n_classes,
                          ctx.privacy.calibration.noise_multiplier, len(ctx.client_ids),
                          None if ctx.secure is None else ctx.secure.config.threshold,
                          int(coef[0].size))
    return {"coef": coef, "pi_joint": tied_table(weights_x, coef.shape[0]),
            "dp_ridge": np.array(ridge)}
