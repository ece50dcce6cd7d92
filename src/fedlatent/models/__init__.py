"""Models: one module per model (its statistics, client step, server step, prediction)."""

from .gmm import FederatedGaussianMixture, GMMModel

__all__ = ["FederatedGaussianMixture", "GMMModel"]
