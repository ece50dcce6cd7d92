"""Why accelerated EM stays refused under differential privacy (issue 23 item 2, decided): the
first extrapolated statistic is evaluated in round 4, so within the default private plan of 3
rounds SQUAREM would send exactly the plain EM statistics (and from round 4 on it would
extrapolate noise with no objective to guard it)."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.rounds.loop import PRIVATE_MAX_ROUNDS


@pytest.fixture(scope="module")
def fd():
    rng = np.random.default_rng(0)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(100, 3)) + (i % 3) for i in range(6)})


def _fits(fd, rounds):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        return [fl.FederatedGaussianMixture(3, max_rounds=rounds, tol=0, random_state=0,
                                            verbose=False,
                                            federation=fl.Federation(acceleration=acc)).fit(fd)
                for acc in (None, "squarem")]


def test_the_default_private_plan_is_over_before_the_first_extrapolation(fd):
    plain, fast = _fits(fd, PRIVATE_MAX_ROUNDS)
    assert PRIVATE_MAX_ROUNDS == 3
    assert [r.objective for r in fast.history_] == [r.objective for r in plain.history_]
    np.testing.assert_array_equal(fast.means_, plain.means_)
    plain4, fast4 = _fits(fd, PRIVATE_MAX_ROUNDS + 1)  # round 4 evaluates the extrapolation
    assert fast4.history_[-1].objective != plain4.history_[-1].objective


def test_acceleration_is_refused_under_privacy():
    dp = fl.DifferentialPrivacy(1.0, 1e-5, clip=3.0)
    with pytest.raises(ValueError, match=r"privacy=\.\.\. \(the clients withhold the objective"):
        fl.Federation(acceleration="squarem", privacy=dp).validate()
