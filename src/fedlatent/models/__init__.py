"""Models: one module per model (its statistics, client step, server step, prediction)."""

from .gmm import FederatedGaussianMixture, GMMModel
from .fedgmm import FedGMM, FedGMMModel, PersonalizedFedGMM

__all__ = ["FederatedGaussianMixture", "GMMModel"]
__all__ += ["FedGMM", "FedGMMModel", "PersonalizedFedGMM"]
