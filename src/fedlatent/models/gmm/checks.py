"""Load checks of a Gaussian mixture's covariances and precision factors, by covariance type
(for ``_check_loaded`` of the Gaussian mixture and FedGMM; the generic checks are
:mod:`fedlatent.engine.protocol.loadcheck`'s)."""

from __future__ import annotations

import numpy as np

from ...engine.protocol.loadcheck import expect_pd, expect_positive, expect_shape

__all__ = ["expect_covariances", "expect_precisions_cholesky"]

#: the shape of a Gaussian mixture's covariances (and precision Cholesky factors) by type
_COV_SHAPES = {"full": lambda K, d: (K, d, d), "tied": lambda K, d: (d, d),
               "diag": lambda K, d: (K, d), "spherical": lambda K, d: (K,)}



def expect_covariances(est, name: str, covariance_type: str, K: int, d: int) -> None:
    """Covariances of a Gaussian mixture of ``covariance_type``: shape, then positive definite
    (``full``, ``tied``) or positive (``diag``, ``spherical``)."""
    if covariance_type not in _COV_SHAPES:
        raise ValueError(f"setting 'covariance_type' is {covariance_type!r}, not one of "
                         f"{sorted(_COV_SHAPES)}")
    expect_shape(est, name, _COV_SHAPES[covariance_type](K, d))
    if covariance_type in ("full", "tied"):
        expect_pd(est, name)
    else:
        expect_positive(est, name)


def expect_precisions_cholesky(est, name: str, covariance_type: str, K: int, d: int) -> None:
    """Cholesky factors of a mixture's precisions: shape, upper triangular (``full``,
    ``tied``) with a positive diagonal, so the precisions they give are positive definite."""
    if covariance_type not in _COV_SHAPES:
        raise ValueError(f"setting 'covariance_type' is {covariance_type!r}, not one of "
                         f"{sorted(_COV_SHAPES)}")
    a = expect_shape(est, name, _COV_SHAPES[covariance_type](K, d))
    square = covariance_type in ("full", "tied")
    if square and np.any(np.tril(a, -1) != 0):
        raise ValueError(f"field {name!r} is not upper triangular (a Cholesky factor is)")
    diag = np.diagonal(a, axis1=-2, axis2=-1) if square else a
    if np.any(diag <= 0):
        raise ValueError(f"field {name!r} has a non-positive diagonal: the precisions it gives "
                         "are not positive definite")
