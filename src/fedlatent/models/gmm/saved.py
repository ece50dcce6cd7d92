"""A saved :class:`~fedlatent.models.gmm.estimator.FederatedGaussianMixture` read for prediction
and scores alone, without scikit-learn (``fedlatent predict`` and ``fedlatent score``:
:mod:`fedlatent.engine.estimation.saved`)."""

from __future__ import annotations

from ...engine.contract.registry import register_reader
from ...engine.estimation.saved import SavedModel
from .model import GMMModel
from .prediction import GaussianPrediction

__all__ = ["FederatedGaussianMixture"]


@register_reader
class FederatedGaussianMixture(GaussianPrediction, SavedModel):
    """The saved Gaussian mixture as its estimator reads and predicts it (the same hooks,
    :class:`~fedlatent.models.gmm.prediction.GaussianPrediction`): ``predict``,
    ``predict_proba``, ``score_samples``, ``score``, ``bic``, ``aic``, ``predict_dataset`` and
    ``score_dataset``, each client's loglik computed where its rows are."""

    def _make_model(self, fd) -> GMMModel:
        return GMMModel(self._fitted_k(), self.covariance_type, self.reg_covar)
