"""HLCR and FedHLCR: hierarchical latent class regression for agent-entity-event data.

Agents (clients) hold entities, entities hold events ``(x, y)``. All events of one agent-entity
pair share a latent cluster ``z_ij``; cluster ``k`` is a Bayesian linear regression
``y ~ N(w_k^T x, sigma^2)`` with prior ``w_k ~ N(0, delta^2 I)``; labels follow the asymmetric-LDA
prior ``psi ~ Dir(alpha/K)``, ``theta_i ~ Dir(beta psi)``, ``z_ij ~ Cat(theta_i)``.

Two solvers (:mod:`.solvers`):

``solver="gibbs"``
    Algorithm 2 of the paper, the exact collapsed Gibbs sampler on the pooled data (reference and
    research): remove an entity from its cluster, sample its label from eq. (1)-(2) and
    Theorem 1, add it back; one numba kernel sweeps all agents and entities.
``solver="federated"``
    FedHLCR, Algorithm 3, on the fedlatent engine: every agent samples its entities' labels
    against the broadcast cluster statistics and global counts, keeps labels and its own counts
    in its private state, and sends per-cluster sums; the server turns them into
    ``D_k = I/delta^2 + sum X^T X / sigma^2`` and ``c_k = sum X^T y / sigma^2``.
    ``Federation(step_size=gamma, participation=f, control_variates=False)`` gives the paper's
    smoothing (see :class:`HLCRModel` for the differences with Algorithm 3).

The package, like :mod:`fedlatent.models.gmm`:

- :mod:`.math`: pure functions over arrays (statistics, Theorem 1, eq. (2), predictions);
- :mod:`.kernels`: the numba kernels they call, and :mod:`.sampler`: the label samplers;
- :mod:`.model`: the engine side (``HLCRModel``), all a client process imports;
- :mod:`.scaling`: the internal standardization (on statistics) and the sigma/delta Gibbs step;
- :mod:`.solvers` and :mod:`.estimator`: ``HLCR``, the estimator, imported on first use, with
  :mod:`.fitting` (start, diagnostic, fitted attributes in the user's units), :mod:`.predict`
  (posterior predictive mean over the retained draws, one draw, or the point estimate) and
  :mod:`.selection` (``n_clusters="auto"`` by held-out predictive log-likelihood).

References
----------
Yang, Carette, Jimbo, Maruyama. "Federated Latent Class Regression for Hierarchical Data"
(2022): model section 4.1, prior factor eq. (2), Theorem 1 / eqs. (3)-(7) and (27), Algorithms
1-3, prediction Theorem 2 / eq. (10). Wallach, Mimno, McCallum (2009) for the asymmetric prior.
"""

from ..._lazy import lazy_attributes
from ...engine.protocol.numerics import add_intercept
from .math import (
    check_entities,
    cluster_statistics,
    entity_log_marginal,
    entity_sse,
    entity_statistics,
    hlcr_log_joint,
    log_prior_factor,
    posterior_means,
    predict_theorem2,
    project_gram_psd,
)
from .model import HLCRModel
from .sampler import gibbs_init, gibbs_sweep, sample_local_labels

__all__ = [
    "HLCR",
    "HLCRModel",
    "SOLVERS",
    "add_intercept",
    "check_entities",
    "cluster_statistics",
    "entity_log_marginal",
    "entity_sse",
    "entity_statistics",
    "gibbs_init",
    "gibbs_sweep",
    "hlcr_log_joint",
    "log_prior_factor",
    "posterior_means",
    "predict_theorem2",
    "project_gram_psd",
    "sample_local_labels",
]


# The estimator imports scikit-learn: not what a client process needs.
__getattr__, __dir__ = lazy_attributes(__name__, {"HLCR": "estimator", "SOLVERS": "estimator"})
