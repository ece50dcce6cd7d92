"""fedlatent: federated latent-variable models on one federated-EM engine.

>>> import fedlatent as fl
>>> fl.Federation(participation=0.5).participation
0.5
"""

from . import baselines  # noqa: F401  (fl.baselines.*)
from . import data as datasets  # noqa: F401  (fl.datasets.* generators)
from .data import FederatedDataset
from .engine import ConvergenceWarning, Federation, Quantizer, Spider, StepSchedule
from .models import FederatedGaussianMixture
from .models.fedgmm import FedGMM
from .models.hlcr import HLCR

__version__ = "0.1.0"

__all__ = [
    "ConvergenceWarning",
    "FederatedDataset",
    "FederatedGaussianMixture",
    "Federation",
    "HLCR",
    "Quantizer",
    "Spider",
    "StepSchedule",
    "__version__",
]
__all__ += ["FedGMM"]
from .models.sec import SEC  # noqa: E402

__all__ += ["SEC"]
