"""The Gaussian mixture's constructor parameters: their names, the table a fit validates them
by and the check between them, without scikit-learn. Shared by the estimator
(:mod:`.estimator`) and a deployed node's ``describe`` (:mod:`.describe`), so that the two
refuse the same settings with the same words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...engine.contract.params import ROUND_LOOP, Integer, Options, Real
from ...engine.contract.selection import AUTO_SIZE, check_candidates
from .math import COV_TYPES

__all__ = ["INIT_PARAMS", "PARAMETER_CONSTRAINTS", "PARAMETER_NAMES", "check_params"]

#: the starts of :func:`~fedlatent.models.gmm.init.initialize_gaussians`, the default first
INIT_PARAMS = ("kmeans-sums", "kmeans-federated", "random")

#: :class:`~fedlatent.models.gmm.FederatedGaussianMixture`'s parameters, in its signature's
#: order
PARAMETER_NAMES = ("n_components", "covariance_type", "reg_covar", "max_rounds", "tol",
                   "init_params", "n_init", "weights_init", "means_init", "precisions_init",
                   "federation", "random_state", "verbose", "min_points_per_centroid",
                   "n_components_candidates")

PARAMETER_CONSTRAINTS: dict[str, list[Any]] = {
    **ROUND_LOOP,
    "max_rounds": [None, Integer(1)],
    "tol": [Real(0), Options("auto")],
    "n_init": [Integer(1)],
    "n_components": [AUTO_SIZE],
    "covariance_type": [Options(*COV_TYPES)],
    "reg_covar": [Real(0)],
    "init_params": [Options(*INIT_PARAMS)],
    "weights_init": [None, "array-like"],
    "means_init": [None, "array-like"],
    "precisions_init": [None, "array-like"],
    "min_points_per_centroid": [Integer(1)],
    "n_components_candidates": [None, "array-like"],
}


def check_params(params: Mapping[str, Any]) -> None:
    """The check between the parameters (after the table's): ``n_components="auto"`` with
    valid candidates and no explicit initial parameter (each fixes the number); ValueError
    naming the parameter and the fix."""
    if params.get("n_components") != "auto":
        return
    check_candidates(params.get("n_components_candidates"), range(1, 9), "n_components",
                     "n_components_candidates")
    given = [k for k in ("weights_init", "means_init", "precisions_init")
             if params.get(k) is not None]
    if given:
        raise ValueError(f"{given[0]} fixes the number of components, but n_components="
                         "'auto' chooses it; give n_components a number or leave "
                         f"{given[0]} out")
