"""The Gaussian mixture's differential privacy: the L2 sensitivity of its statistics.

Model-specific (the engine's :mod:`fedlatent.engine.privacy.clipping` holds the generic clipping
and the bounds shared by several models); FedGMM's Gaussian part uses the same bound.
"""

from __future__ import annotations

from ...engine.privacy.clipping import _radius

__all__ = ["gmm_sensitivity"]


def gmm_sensitivity(radius: float) -> dict[str, float]:
    """Per-block L2 sensitivity of Gaussian-mixture statistics centred at the clipping centre.

    Blocks (as ``fedlatent.models.gmm``'s ``gmm_statistics`` sends them, centred at ``c``):
    ``nk = sum_i r_i``, ``sx = sum_i r_i (x_i - c)``, ``sxx`` (full: ``sum_i r_ik
    (x_i - c)(x_i - c)^T``; diagonal/spherical: ``sum_i r_ik (x_i - c)^2`` elementwise; tied:
    ``sum_i (x_i - c)(x_i - c)^T``), with ``r_i`` in the simplex and ``||x_i - c|| <= R``.

    Derivation, for the record ``x`` with responsibilities ``r`` (``sum_k r_k = 1`` so
    ``sum_k r_k^2 <= 1``) and ``u = x - c``:

    - ``nk``: ``||r||_2 <= 1``;
    - ``sx``: ``||r u^T||_F = ||r||_2 ||u|| <= R``;
    - ``sxx`` full: ``(sum_k r_k^2 ||u u^T||_F^2)^(1/2) = ||r||_2 ||u||^2 <= R^2``; diagonal:
      ``||u * u||_2 <= ||u||^2``; tied: ``||u u^T||_F = ||u||^2``. All ``<= R^2``.

    The joint bound is ``sqrt(1 + R^2 + R^4)`` (every block carries the same ``||r||_2``, so it
    is attained by a one-hot ``r`` and ``||u|| = R``). The statistics must be centred at the
    clipping centre: around another point ``c'``, replace ``R`` by ``R + ||c - c'||``.

    References
    ----------
    Park, Foulds, Chaudhuri and Welling, "DP-EM: Differentially private expectation
    maximization", AISTATS 2017 (perturbing the EM sufficient statistics).
    """
    R = _radius("radius", radius)
    return {"nk": 1.0, "sx": R, "sxx": R * R}
