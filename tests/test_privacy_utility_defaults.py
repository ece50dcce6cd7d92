"""fl.experiments.privacy_utility(max_rounds=None) (issue 23, item 6: the table rerun with the
library's defaults): the non-private reference is fitted to convergence, each private fit runs
its estimator's default private plan."""

from __future__ import annotations

import importlib
import warnings

import numpy as np
import pytest

import fedlatent as fl

pu = importlib.import_module("fedlatent.experiments.privacy_utility")


@pytest.mark.parametrize("name,private_rounds", [("FederatedGaussianMixture", 2),
                                                  ("LatentClassRegression", 3), ("FedGMM", 5)])
def test_none_gives_a_converged_reference_and_the_default_private_plan(name, private_rounds):
    spec = next(s for s in pu.SPECS if s.estimator == name)
    ref = pu._estimator(spec, 3, None, fl.Federation(), 0)
    assert (ref.tol, ref.max_rounds) == (pu.CONVERGED_TOL, pu.CONVERGED_ROUNDS) == (1e-6, 1000)
    dp = fl.DifferentialPrivacy(1.0, 1e-5, clip=2.0, target_range=(-5.0, 5.0))
    private = pu._estimator(spec, 3, None, fl.Federation(privacy=dp), 0)
    assert private.max_rounds is None
    assert private._max_rounds() == private_rounds  # the estimator's _private_max_rounds
    # an explicit number is every fit's, private or not, with tol 0 (every round runs)
    fixed = pu._estimator(spec, 3, 10, fl.Federation(), 0)
    assert (fixed.tol, fixed.max_rounds) == (0.0, 10)


def test_the_reference_row_is_the_converged_fit():
    pytest.importorskip("dp_accounting")
    table = fl.experiments.privacy_utility(sizes=(2_000,), epsilons=(8.0,), n_seeds=1,
                                           models=("FederatedGaussianMixture",), out=None,
                                           random_state=0, max_rounds=None)
    assert table.attrs["settings"]["max_rounds"] is None
    data = pu.make_privacy_data(2_000, 10, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fl.ConvergenceWarning)  # it converges
        ref = fl.FederatedGaussianMixture(3, tol=1e-6, max_rounds=1000, random_state=0,
                                          verbose=False).fit(data.train["x"])
    assert ref.converged_
    plain = table[~np.isfinite(table["epsilon"])].iloc[0]
    assert plain["value"] == ref.score(data.test["x"].pooled().X)
    private = table[table["epsilon"] == 8.0].iloc[0]
    assert private["failed"] == 0 and 0.99 * 8.0 <= private["epsilon_spent"] <= 8.0
