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

__all__ = ["fedgmm_dp_sensitivity", "private_refusal"]


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
