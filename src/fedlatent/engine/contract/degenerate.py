"""Degenerate components: a mixture component collapsing onto a point mass.

The likelihood of a Gaussian (or Gaussian-noise regression) mixture is unbounded: a component
that fits a few rows exactly (identical rows, a discrete or bounded target, a value repeated
many times) sends its variance to zero and the likelihood to infinity, and EM goes there. A
tiny absolute regularization (scikit-learn's ``reg_covar``) keeps the numbers finite but not the
fit meaningful: on mlmRev's Chem97 score (even values 0-10) a latent class regression with three
components collapsed a component onto one value with a noise sd of 0.001.

So every M-step keeps each component's variance at least :data:`DEGENERATE_FRACTION` of the
data's own, measured on the pooled statistics the server already has (no extra exchange): for
a regression mixture the pooled regression's residual variance, for a Gaussian mixture the
smallest eigenvalue of the pooled covariance (each feature's variance for diagonal and spherical
covariances). A component held at that floor is regularized (its likelihood stays bounded)
and the fit says so (:func:`warn_degenerate`) and the size selection skips it.
"""

from __future__ import annotations

import numpy as np

from fedlatent.engine.warn import warn_user

__all__ = ["DEGENERATE_FRACTION", "at_floor", "warn_degenerate"]

#: a component's variance is kept at least this fraction of the data's
DEGENERATE_FRACTION = 1e-3
#: a variance within this relative distance of its floor is "at the floor"
_AT_FLOOR_RTOL = 1e-6


def at_floor(values: np.ndarray, floor: np.ndarray | float) -> np.ndarray:
    """Which of ``values`` sit at their ``floor`` (boolean, same shape)."""
    v = np.asarray(values, dtype=np.float64)
    f = np.broadcast_to(np.asarray(floor, dtype=np.float64), v.shape)
    return (f > 0) & (v <= f * (1.0 + _AT_FLOOR_RTOL))


def warn_degenerate(name: str, components, what: str) -> None:
    """One UserWarning naming the components held at the floor (``what``: their variance in
    words, e.g. "noise variance 0.0105, 1e-3 of the pooled residual variance")."""
    ks = ", ".join(str(int(k)) for k in components)
    warn_user(
        f"{name}: component(s) {ks} collapsed onto a point mass ({what}); their variance is "
        f"held at {DEGENERATE_FRACTION:g} of the data's, so the likelihood stays bounded. A "
        "discrete or bounded target, or many identical rows, do this: fit fewer components "
        "or a model for discrete outcomes")
