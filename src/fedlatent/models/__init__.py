"""Models: one module per model (its statistics, client step, server step, prediction)."""

from .gmm import FederatedGaussianMixture, GMMModel
from .fedgmm import FedGMM, FedGMMModel, PersonalizedFedGMM
from .hlcr import HLCR, HLCRModel

__all__ = ["FederatedGaussianMixture", "GMMModel", "HLCR", "HLCRModel"]
__all__ += ["FedGMM", "FedGMMModel", "PersonalizedFedGMM"]
from .sec import SEC, SECModel  # noqa: E402

__all__ += ["SEC", "SECModel"]
