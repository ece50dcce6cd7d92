"""Latent class analysis (poLCA's model) on the federated-EM engine: the template of a new model.

- :mod:`.math`: pure functions (one-hot codes, log-probabilities, statistics, M-step);
- :mod:`.model`: the engine side (``LCAModel``: client statistics, checks, M-step, privacy
  bounds), all a client process imports;
- :mod:`.estimator`: ``LatentClassAnalysis`` (a :class:`~fedlatent.engine.estimation.base_mixture.
  FederatedMixture`: predict, predict_proba, score, bic and aic come from one hook), imported on
  first use;
- :mod:`.example`: the small problems the generic tests run on it.

It was added without editing any existing file: the registry finds the package, the top-level
``fl.LatentClassAnalysis`` reads the registry, the generic tests read its example.
"""

from ..._lazy import lazy_attributes
from .model import LCAModel

__all__ = ["LCAModel", "LatentClassAnalysis"]

__getattr__, __dir__ = lazy_attributes(__name__, {"LatentClassAnalysis": "estimator"})
