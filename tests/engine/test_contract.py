"""The model contract written down (issue 20, item 3): capabilities as data, abstract hooks,
the mixture base, the engine's projection of counts, model-specific code out of the engine."""

from __future__ import annotations

import dataclasses
import inspect

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine import FederatedEstimator, FederatedModel, Runtime, Stats
from tolerance import assert_same

try:  # (absent before the contract was written down: each test then fails on its own)
    from fedlatent.engine.contract.model import ALL_CAPABILITIES, Capabilities, payload_params
except ImportError:  # pragma: no cover
    ALL_CAPABILITIES = Capabilities = payload_params = None


def test_capabilities_are_frozen_data_with_their_refusals():
    caps = Capabilities()
    assert (caps.secure_aggregation, caps.differential_privacy) == (False, False)
    assert caps.secure_refusal == ("its fit does not yet route every sum through secure "
                                   "aggregation")
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.secure_aggregation = True
    with pytest.raises(ValueError, match="an unsupported capability needs its reason"):
        Capabilities(secure_refusal="")


def test_every_model_declares_its_capabilities():
    from dataclasses import replace  # (missing values, missing targets: issue 25)

    assert fl.FederatedGaussianMixture.capabilities == replace(ALL_CAPABILITIES,
                                                               missing_values=True)
    assert fl.LatentClassRegression.capabilities == replace(ALL_CAPABILITIES,
                                                            missing_target=True)
    assert fl.FedGMM.capabilities == replace(ALL_CAPABILITIES, missing_values=True)
    sec = fl.SEC.capabilities
    assert not sec.secure_aggregation and not sec.differential_privacy
    assert sec.secure_refusal.startswith("SEC's replies are fitted local models")
    assert fl.HLCR().capabilities == replace(ALL_CAPABILITIES, missing_target=True)
    gibbs = fl.HLCR(solver="gibbs").capabilities
    assert not gibbs.secure_aggregation
    assert gibbs.secure_refusal == "solver='gibbs' pools the rows in one place; use " \
                                   "solver='federated'"


def test_refusals_read_the_capabilities(monkeypatch):
    from fedlatent.models.gmm import FederatedGaussianMixture

    monkeypatch.setattr(FederatedGaussianMixture, "capabilities",
                        Capabilities(secure_refusal="no sums here"))
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays({c: rng.normal(size=(30, 2)) for c in range(3)})
    est = FederatedGaussianMixture(2, federation=fl.Federation(secure_aggregation=True))
    with pytest.raises(ValueError, match=r"FederatedGaussianMixture refuses "
                       r"Federation\(secure_aggregation=True\): no sums here; fit it with "
                       r"secure_aggregation=False"):
        est.fit(fd)


def test_the_estimator_base_is_abstract_in_its_required_hooks():
    assert {"_make_model", "_initialize", "_store"} <= FederatedEstimator.__abstractmethods__

    class Half(FederatedEstimator):
        def _make_model(self, fd):
            return None

    with pytest.raises(TypeError, match="abstract"):
        Half()


def test_every_estimator_hook_is_declared_once_with_a_docstring():
    hooks = ["_check_params", "_validate_data", "_make_model", "_initialize", "_run", "_store",
             "_after_load", "_selection", "_check_loaded", "_describe_local", "_fitted_params",
             "_federated_loglik", "_predict_client", "_explicit_init", "_n_parameters",
             "_degenerate_reason", "_save_extra", "_load_extra", "score_dataset"]
    for h in hooks:
        doc = inspect.getdoc(getattr(FederatedEstimator, h))
        assert doc and len(doc) > 20, h
    for attr in ("capabilities", "_save_arrays", "_load_nonfinite", "_score_name",
                 "_dp_init_releases", "_multi_start", "_default_n_init"):
        assert attr in vars(FederatedEstimator), attr
    assert "_secure_aggregation" not in vars(FederatedEstimator)
    assert "_differential_privacy" not in vars(FederatedEstimator)


class _Counts(FederatedModel):
    name = "_test_counts"
    count_stats = ("n",)

    def client_stats(self, params, data, state, rng, rows=None):  # pragma: no cover
        raise NotImplementedError

    def stat_shapes(self, params):
        return {"n": (2,), "s": (2,)}

    def check(self, stats, n_units, slack=None):
        return "negative" if np.any(np.asarray(stats["n"]) < 0) else None

    def m_step(self, S, params, n_total):
        return {"n": np.asarray(S["n"], dtype=float).copy(), "s": np.asarray(S["s"]).copy()}


def test_the_engine_projects_counts_before_the_m_step():
    m = _Counts()
    out = m.server_step(Stats({"n": np.array([-0.25, 1.25]), "s": np.array([-1.0, 2.0])}),
                        {}, 10)
    assert_same(out["n"], [0.0, 1.25])  # a negative count clipped to 0, the rest copied
    assert_same(out["s"], [-1.0, 2.0])  # not a count: untouched
    S = Stats({"n": np.array([0.5, 0.5]), "s": np.array([1.0, 2.0])})
    assert m.project_stats(S) is S  # nothing outside the domain: the same statistics


def test_a_named_model_without_an_m_step_is_refused():
    with pytest.raises(TypeError, match="must define m_step"):
        class Bad(FederatedModel):
            name = "_test_bad"

            def client_stats(self, params, data, state, rng, rows=None):  # pragma: no cover
                pass

            def stat_shapes(self, params):  # pragma: no cover
                return {}


def test_check_many_default_is_check_row_by_row():
    m = _Counts()
    stats = {"n": np.array([[1.0, 2.0], [-1.0, 0.0], [0.0, 0.0]]), "s": np.zeros((3, 2))}
    mask = m.check_many(stats, np.array([3, 3, 0]), None)
    assert_same(mask, [False, True, False])  # booleans


def test_runtime_declares_batched_and_models_declare_batched_step():
    assert Runtime.batched(object(), None) is None
    from fedlatent.models.gmm import GMMModel
    from fedlatent.models.hlcr.model import HLCRModel
    from fedlatent.models.lcr.model import LCRModel

    assert GMMModel.batched_step and LCRModel.batched_step
    assert not FederatedModel.batched_step and not FederatedModel.batched_units
    # HLCR's agents step together over their entities since issue 23 (units, not rows)
    assert HLCRModel.batched_step and HLCRModel.batched_units and not GMMModel.batched_units


def test_payload_params_is_written_once_in_the_engine():
    import fedlatent.models.gmm as gmm
    import fedlatent.models.lcr.model as lcr

    assert gmm.payload_params is payload_params and lcr.payload_params is payload_params
    assert payload_params({"params/a": [1, 2], "seed": 3}).keys() == {"a"}


def test_model_specific_code_is_out_of_the_engine():
    import fedlatent.engine.privacy as privacy
    import fedlatent.engine.protocol.loadcheck as lc
    from fedlatent.models.gmm.checks import expect_covariances
    from fedlatent.models.gmm.dp import gmm_sensitivity

    assert not hasattr(privacy, "gmm_sensitivity")
    assert not hasattr(lc, "expect_covariances") and not hasattr(lc, "_COV_SHAPES")
    assert gmm_sensitivity(2.0) == {"nk": 1.0, "sx": 2.0, "sxx": 4.0}
    assert callable(expect_covariances)


def test_the_gaussian_mixture_predicts_through_the_mixture_base():
    from fedlatent.engine.estimation.base_mixture import FederatedMixture

    cls = fl.FederatedGaussianMixture
    assert issubclass(cls, FederatedMixture)
    for name in ("predict", "predict_proba", "score_samples", "score", "bic", "aic"):
        assert getattr(cls, name) is getattr(FederatedMixture, name), name
    rng = np.random.default_rng(1)
    fd = fl.FederatedDataset.from_arrays({c: rng.normal(size=(40, 2)) + 3 * (c % 2)
                                          for c in range(4)})
    gm = cls(2, max_rounds=5, random_state=0, verbose=False).fit(fd)
    X = fd[fd.client_ids[0]].X
    sk = gm.to_sklearn()
    np.testing.assert_allclose(gm.score_samples(X), sk.score_samples(X), rtol=1e-12)
    np.testing.assert_allclose(gm.predict_proba(X), sk.predict_proba(X), rtol=1e-10,
                               atol=1e-14)
    assert gm.bic(X) == pytest.approx(sk.bic(X), rel=1e-12)
    assert gm.aic(X) == pytest.approx(sk.aic(X), rel=1e-12)


def test_the_random_membership_start_is_the_engines():
    from fedlatent.engine.contract.mixture import MixtureModel
    from fedlatent.models.lcr.model import LCRModel

    assert issubclass(LCRModel, MixtureModel)
    assert 'name == "random_stats"' not in inspect.getsource(LCRModel.client_query)
    assert LCRModel.client_query is not MixtureModel.client_query  # its own queries first
