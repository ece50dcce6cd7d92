"""Federated Gaussian mixture: EM with the E-step on clients and the M-step on the server.

The smallest model of the house, and the template for a new one:

- :mod:`.math`: pure functions (log-densities, statistics, M-step), tested against scikit-learn;
- :mod:`.model`: the engine side (``GMMModel``: client statistics, M-step, initialization
  queries), all a client process imports;
- :mod:`.estimator`: ``FederatedGaussianMixture``, the scikit-learn estimator (hooks of the base
  estimator; it never overrides ``fit``), imported on first use.

With full participation and step 1 the iterates are scikit-learn's ``GaussianMixture`` iterates.
"""

from ..._lazy import lazy_attributes
from .math import (
    COV_TYPES,
    compute_precision_cholesky,
    estimate_log_gaussian_prob,
    floor_covariances,
    floor_noisy_covariances,
    gmm_m_step,
    gmm_statistics,
    logsumexp,
    n_free_parameters,
)
from .model import GMMModel, payload_params

__all__ = [
    "COV_TYPES",
    "FederatedGaussianMixture",
    "GMMModel",
    "compute_precision_cholesky",
    "estimate_log_gaussian_prob",
    "floor_covariances",
    "floor_noisy_covariances",
    "gmm_m_step",
    "gmm_statistics",
    "initialize_gaussians",
    "logsumexp",
    "n_free_parameters",
    "payload_params",
]


# The estimator imports scikit-learn: not what a client process needs.
__getattr__, __dir__ = lazy_attributes(__name__, {
    "FederatedGaussianMixture": "estimator",
    "initialize_gaussians": "estimator",
})
