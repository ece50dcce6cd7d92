"""SEC: meta clustering of learners by Select-Exchange-Cluster.

Each learner (client) holds a supervised regression data set. SEC groups the learners whose
X -> Y relationship is the same, without moving samples:

1. **Select** -- each learner splits its data half-half, fits every candidate scikit-learn regressor
   on one half, keeps the one with the lowest MSE on the other half (eq. 1), refits it on all its
   data and records its in-sample MSE ``e_i``.
2. **Exchange** -- learner i's fitted model crosses to learner j (as a skops file, never pickle),
   who returns the scalar loss ``e_{i->j}``; the dissimilarity is eq. (2)
   ``v_ij = |e_{i->j} - e_j| + |e_{j->i} - e_i|``.
3. **Cluster** -- ``S = exp(-a V)``, normalized affinity ``D^-1/2 S D^-1/2``, top-K eigenvectors,
   row normalization, k-means with restarts (Ng, Jordan and Weiss, 2002). K is given, or chosen by
   the penalty of Remark 2 (default) or by the gap statistic.

The package, by concern:

- :mod:`.candidates`: the candidate regressors and the Select step's math (:func:`select_model`);
- :mod:`.serialize`: fitted models as safe skops bytes (an exact allow-list of types,
  :data:`TRUSTED_TYPES`, extended by ``SEC(extra_trusted_types=...)``), fast prediction of many
  models;
- :mod:`.clustering`: the Cluster step's math (pure functions, on the server);
- :mod:`.model`: ``SECModel``, the learners' side (the ``select`` and ``exchange`` queries), all a
  client process imports;
- :mod:`.protocol`: the Select and Exchange steps on the server, through the engine's checked
  exchange (waves of one message per learner, every reply validated);
- :mod:`.estimator`: ``SEC``, the scikit-learn estimator on the base estimator's hooks (its
  ``_run`` is the one-shot protocol), with :mod:`.predict` (eq. 4, pooled models, ``assign``);
  imported on first use.

References
----------
Ye, Ghanadan and Ding, "Meta Clustering for Collaborative Learning", Journal of Computational and
Graphical Statistics (2023): Section 3 (Algorithm 1, eqs. 1-4, Remarks 1-3).
Ng, Jordan and Weiss, "On spectral clustering: analysis and an algorithm", NIPS 2002.
Tibshirani, Walther and Hastie, "Estimating the number of clusters in a data set via the gap
statistic", JRSS-B 63 (2001).
"""

from ..._lazy import lazy_attributes
from .candidates import (
    BUILTIN_CANDIDATES,
    CANDIDATE_SETS,
    make_candidates,
    select_model,
    standardize_xy,
)
from .clustering import (
    affinity,
    auto_affinity_scale,
    clustering_accuracy,
    default_max_clusters,
    dissimilarity,
    gap_statistic,
    kmeans,
    normalized_affinity,
    penalty_selection,
    selection_embedding,
    spectral_clustering,
    spectral_embedding,
    weighted_prediction,
    within_cluster_dispersion,
)
from .model import MIN_SAMPLES, SECModel, check_learner
from .serialize import (
    TRUSTED_TYPES,
    UntrustedModelError,
    check_extra_types,
    check_model,
    dumps_model,
    loads_model,
    predict_many,
)

__all__ = [
    "BUILTIN_CANDIDATES",
    "CANDIDATE_SETS",
    "MIN_SAMPLES",
    "SEC",
    "SECModel",
    "TRUSTED_TYPES",
    "UntrustedModelError",
    "affinity",
    "auto_affinity_scale",
    "check_extra_types",
    "check_learner",
    "check_model",
    "clustering_accuracy",
    "default_max_clusters",
    "dissimilarity",
    "dumps_model",
    "gap_statistic",
    "kmeans",
    "loads_model",
    "make_candidates",
    "normalized_affinity",
    "penalty_selection",
    "predict_many",
    "select_model",
    "selection_embedding",
    "spectral_clustering",
    "spectral_embedding",
    "standardize_xy",
    "weighted_prediction",
    "within_cluster_dispersion",
]


# The estimator imports the base estimator (scikit-learn): not what a client process needs.
__getattr__, __dir__ = lazy_attributes(__name__, {"SEC": "estimator"})
