"""A mixture without its own observed information still has summary() (issue 24: every
estimator with parameters to report): the base mixture's point-estimate table."""

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.models.lca.example import make_lca_data


@pytest.mark.usefixtures("rare_level_rule_off")
@pytest.mark.usefixtures("saturation_rule_off")
def test_a_mixture_without_observed_information_reports_point_estimates():
    fd = make_lca_data(n_clients=4, mean_size=60, n_classes=2, random_state=1)
    est = fl.LatentClassAnalysis(2, n_categories=3, max_rounds=20, random_state=0).fit(fd)
    s = est.summary()
    t = s.table
    assert list(t.columns) == ["coef", "std err", "note"]
    assert t.index.names == ["component", "parameter"]
    n_probs = est.probabilities_.shape[1]
    assert list(t.loc["0"].index) == ["weights", *[f"probs[{j}]" for j in range(n_probs)]]
    np.testing.assert_array_equal(t.xs("weights", level="parameter")["coef"].to_numpy(),
                                  est.weights_)
    np.testing.assert_array_equal(t.loc["1", "coef"].to_numpy()[1:], est.probabilities_[1])
    assert t["std err"].isna().all() and s.info["Components"] == "2"
    assert "LatentClassAnalysis results" in str(s)
