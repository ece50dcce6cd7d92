"""Latent class regression (a mixture of linear regressions) by federated EM.

Laid out like the Gaussian mixture, the template:

- :mod:`.math`: pure functions (log-densities, statistics, weighted least-squares M-step),
  imported from there (``from fedlatent.models.lcr.math import lcr_m_step``);
- :mod:`.model`: the engine side (``LCRModel``: client statistics, M-step, initialization and
  scoring queries), all a client process imports;
- :mod:`.estimator`: ``LatentClassRegression``, the scikit-learn estimator (hooks of the base
  estimator; it never overrides ``fit``), imported on first use.

With full participation and step 1 the iterates are those of centralized EM on the pooled rows.
"""

from ..._lazy import lazy_attributes
from .model import LCRModel

__all__ = ["LCRModel", "LatentClassRegression", "initialize_random_memberships"]


# The estimator imports scikit-learn: not what a client process needs.
__getattr__, __dir__ = lazy_attributes(__name__, {
    "LatentClassRegression": "estimator",
    "initialize_random_memberships": "estimator",
})
