"""Fixtures of the command-line tests: an estimator registered only for one test."""

import pytest

from fedlatent.engine.contract import registry
from fedlatent.models.gmm import FederatedGaussianMixture


class ToyMixture(FederatedGaussianMixture):
    """A federated Gaussian mixture under another name: a model no CLI code knows of."""

    _estimator_name = "toy"


@pytest.fixture
def toy_estimator(monkeypatch):
    """Register :class:`ToyMixture` as ``toy`` for one test (as a new model module would)."""
    registry.estimator_entries()  # discover the real models first
    entry = registry.EstimatorEntry("toy", ToyMixture, "A toy mixture (tests only)")
    monkeypatch.setitem(registry._ESTIMATORS, "toy", entry)
    return entry
