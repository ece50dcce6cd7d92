"""What a deployed node checks for a Gaussian mixture when the server asks ``describe``, without
scikit-learn: the estimator's settings by its own table and check (:mod:`.params`); the data
checks are the engine's (:func:`~fedlatent.engine.node.describe.describe_client`). A node's
first message imported the estimator, so scikit-learn, SciPy and pandas, for this alone (about
a CPU second in each node, before the server hears from any)."""

from __future__ import annotations

from typing import Any

from ...engine.contract.params import validate_params
from ...engine.contract.registry import register_describer
from .params import PARAMETER_CONSTRAINTS, PARAMETER_NAMES, check_params
from .prediction import GaussianPrediction

__all__ = ["GaussianMixtureDescriber"]


@register_describer("gmm")
class GaussianMixtureDescriber:
    """:class:`~fedlatent.models.gmm.FederatedGaussianMixture` as a node's ``describe`` uses
    it (:func:`~fedlatent.engine.contract.registry.describer_from_config`): built from the
    parameters, refusing an unknown one as the constructor would, with its
    ``capabilities``; ``_describe_local`` validates the settings as its fit does."""

    capabilities = GaussianPrediction.capabilities

    def __init__(self, **params: Any):
        unknown = [k for k in params if k not in PARAMETER_NAMES]
        if unknown:
            raise TypeError("FederatedGaussianMixture.__init__() got an unexpected keyword "
                            f"argument {unknown[0]!r}")
        self.params = {k: params.get(k, _DEFAULTS[k]) for k in PARAMETER_NAMES}

    def _describe_local(self, fd) -> dict:
        validate_params(self.params, PARAMETER_CONSTRAINTS)  # (the federation: built from
        check_params(self.params)  # its config, which checks it)
        return {}


#: the constructor's defaults (a describe message carries every parameter; these fill a
#: message written by hand)
_DEFAULTS: dict[str, Any] = {
    "n_components": 1, "covariance_type": "full", "reg_covar": 1e-6, "max_rounds": None,
    "tol": "auto", "init_params": "kmeans-sums", "n_init": 1, "weights_init": None,
    "means_init": None, "precisions_init": None, "federation": None, "random_state": None,
    "verbose": None, "min_points_per_centroid": 5, "n_components_candidates": None}
