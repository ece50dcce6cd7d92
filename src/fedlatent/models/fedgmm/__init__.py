"""FedGMM: personalized federated learning under a mixture of joint distributions.

Every client ``c`` models its joint distribution as

    h_c(x, y) = sum_{m1, m2} pi_c(m1, m2) N(x; mu_m1, Sigma_m1) P_theta_m2(y | x)

with Gaussian input components and learners shared by all clients and mixture weights
``pi_c`` that never leave the client. EM (paper eq. (E) and (M), Algorithm 1) runs on the
federated engine:

E-step on the client (log space)
    q_i(m1, m2) proportional to pi_c(m1, m2) N(x_i; mu_m1, Sigma_m1) P_theta_m2(y_i | x_i);
    ``pi_c <- mean_i q_i`` is kept in the client's private state.
Statistics a client sends (sums over its samples)
    per input component m1 (weights ``r_i(m1) = sum_m2 q_i(m1, m2)``): ``sum r``, ``sum r x``,
    ``sum r x x^T`` (``covariance_aggregation="exact"``), or the within-client scatter
    ``sum r (x - mu_c)(x - mu_c)^T`` (``"paper"``: the paper's per-client covariance averaging,
    which drops the between-client scatter; for comparison only);
    per learner m2 (weights ``s_i(m2) = sum_m1 q_i(m1, m2)``): ``sum s`` and either the IRLS
    statistics ``H theta - g`` and ``H`` of the weighted cross-entropy at the broadcast
    ``theta`` (``learner_update="newton"``: the server's Newton step is exactly the centralized
    weighted IRLS step), or ``sum s * theta_c`` for parameters ``theta_c`` refitted locally
    from the broadcast ones (``"average"``: the paper's responsibility-weighted averaging).
Server M-step
    Gaussians in closed form (:func:`fedlatent.models.gmm.gmm_m_step`), learners by
    ``theta = (H + l2 * mass * I)^-1 (H theta_old - g)`` or by the weighted average.

Stochastic approximation, partial participation and the quantizer act on these statistics. The
Newton statistics are sent in IRLS form (normal equations ``b = H theta - g``, ``H``) so an
averaged ``S_hat`` (step < 1, control variates, partial participation) is an average of
normal equations taken at recent parameters: the server's solve is a quasi-Newton step that
needs no parameters of past rounds, and with step 1 and full participation it is the exact
Newton step. Round 1 of the engine is the initialization E-step at the initial parameters,
with ``pi_c`` uniform.

Privacy. Clients return the sums above (which, like any federated mixture, contain the
responsibility mass per input component and per learner) and never ``pi_c`` itself (the joint
``M1 x M2`` table), nor rows of ``X`` or ``y``. The global table ``pi(m1, m2)`` of the paper's
footnote 3 would need the clients' joint tables, so the model's global weights (used when no
client is given) are the product of the two federated marginals ``weights_x_ (x) weights_y_``.

Prediction for a known client needs its ``pi_c``, which stays with the client: after an
in-process fit, :meth:`FedGMM.personalize` reads it *on the client's side* (from the client node
object, not through a message) and returns a :class:`PersonalizedFedGMM` predictor holding the
shared parameters and that client's weights; ``predict(X, client=c)`` is a shortcut for it.
:meth:`FedGMM.save_client_weights` writes one file per client (what each client keeps).

The package, like :mod:`fedlatent.models.gmm`:

- :mod:`.math`: pure functions (component log-densities, E-step, prediction by eq. (3));
- :mod:`.model`: the engine side (``FedGMMModel``: client statistics, server M-step);
- :mod:`.personalized`: ``PersonalizedFedGMM``, the predictor of one client;
- :mod:`.estimator`: ``FedGMM``, the estimator.
- :mod:`.clients`: the client-side half of ``FedGMM`` (each client's ``pi_c``: personalize,
  save and load it, adapt a new client);
- :mod:`.selection`: ``n_input_components="auto"`` / ``n_learners="auto"`` by the held-out
  log-likelihood.

References
----------
Wu, Zhou, Zheng, Xiong, Zhou, Wang, Cheng, Li, Marfoq, Ding, Ren, "Personalized Federated
Learning under Mixture of Distributions", ICML 2023: model section 3.2, EM eq. (E) and (M),
prediction eq. (3), Algorithm 1 (Appendix A).
Marfoq, Neglia, Bellet, Kameni, Vidal, "Federated Multi-Task Learning under a Mixture of
Distributions", NeurIPS 2021 (the mixture of learners, ``M1 = 1``).
"""

from ..._lazy import lazy_attributes
from .math import _log as _log
from .math import fedgmm_log_components, fedgmm_predict_log_proba, fedgmm_responsibilities
from .model import _GMM_QUERIES as _GMM_QUERIES
from .model import FedGMMModel

__all__ = [
    "FedGMM",
    "FedGMMModel",
    "PersonalizedFedGMM",
    "fedgmm_log_components",
    "fedgmm_responsibilities",
    "fedgmm_predict_log_proba",
]


# The estimator and the client predictor import scikit-learn and pandas: not what a client process
# needs.
__getattr__, __dir__ = lazy_attributes(__name__, {
    "FedGMM": "estimator",
    "PersonalizedFedGMM": "personalized",
})
