"""Issue 19, item 6: a stopping rule defined under partial participation (the server
statistic settled over a window of rounds), and a ConvergenceWarning whenever a fit ends at
max_rounds unconverged, in every mode."""

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.stats import Stats


@pytest.fixture(scope="module")
def fd():
    rng = np.random.default_rng(0)
    data = {}
    for c in range(8):
        z = rng.random(200) < 0.3 + 0.05 * c
        data[f"c{c}"] = np.where(z[:, None], rng.normal(size=(200, 2)) + 3,
                                 rng.normal(size=(200, 2)) - 1)
    return fl.FederatedDataset.from_arrays(data)


@pytest.fixture(scope="module")
def plain(fd):
    return fl.FederatedGaussianMixture(2, tol=1e-8, max_rounds=500, random_state=0,
                                       verbose=False).fit(fd)


def test_half_participation_reaches_the_em_fixed_point_and_says_so(fd, plain):
    with warnings.catch_warnings():
        warnings.simplefilter("error", fl.ConvergenceWarning)
        gm = fl.FederatedGaussianMixture(2, tol=1e-6, max_rounds=200, random_state=0,
                                         verbose=False,
                                         federation=fl.Federation(participation=0.5)).fit(fd)
    assert gm.converged_ is True
    assert gm.n_iter_ < 200
    np.testing.assert_allclose(gm.means_, plain.means_, atol=1e-4)
    np.testing.assert_allclose(gm.weights_, plain.weights_, atol=1e-4)
    # the rule that stopped it: stat_change < tol in each of the last 2 rounds
    from fedlatent.engine.rounds.loop import window_size

    last = gm.history_.to_frame()["stat_change"].to_numpy()[-window_size(0.5):]
    assert np.all(last < 1e-6)


def test_a_capped_partial_fit_warns(fd):
    fed = fl.Federation(participation=0.5)
    with pytest.warns(fl.ConvergenceWarning, match=r"did not converge in 3 rounds \(the server "
                      r"statistic still moved \(history_\['stat_change'\]\) by more than "
                      r"tol=1e-08\)"):
        gm = fl.FederatedGaussianMixture(2, tol=1e-8, max_rounds=3, random_state=0,
                                         verbose=False, federation=fed).fit(fd)
    assert gm.converged_ is False and gm.n_iter_ == 3


def test_a_capped_step_size_fit_warns(fd):
    with pytest.warns(fl.ConvergenceWarning, match="did not converge in 4 rounds"):
        fl.FederatedGaussianMixture(2, tol=1e-8, max_rounds=4, random_state=0, verbose=False,
                                    federation=fl.Federation(step_size=0.5)).fit(fd)


def test_a_default_plain_fit_does_not_warn(fd):
    with warnings.catch_warnings():
        warnings.simplefilter("error", fl.ConvergenceWarning)
        gm = fl.FederatedGaussianMixture(2, random_state=0, verbose=False).fit(fd)
    assert gm.converged_ is True


def test_tol_zero_never_stops_early(fd):
    with pytest.warns(fl.ConvergenceWarning, match="did not converge in 6 rounds"):
        gm = fl.FederatedGaussianMixture(2, tol=0.0, max_rounds=6, random_state=0,
                                         verbose=False,
                                         federation=fl.Federation(participation=0.5)).fit(fd)
    assert gm.n_iter_ == 6 and gm.converged_ is False


def test_stat_change_is_the_largest_relative_block_change_per_unit_step():
    from fedlatent.engine.rounds.loop import stat_change

    old = Stats({"a": np.array([1.0, 0.0]), "b": np.array([10.0]), "z": np.zeros(2)})
    new = Stats({"a": np.array([1.0, 0.1]), "b": np.array([10.5]), "z": np.zeros(2)})
    # a: 0.1 / ||(1, 0.1)||; b: 0.5 / 10.5; divided by the step 0.5
    assert stat_change(old, new, 0.5) == pytest.approx(0.1 / np.hypot(1.0, 0.1) / 0.5,
                                                       rel=1e-12)
    assert stat_change(None, new, 1.0) is None
    # a block that is zero by construction is measured against the largest block's scale
    moved = Stats({"a": np.array([1.0, 0.0]), "b": np.array([10.0]), "z": np.array([1e-9, 0])})
    assert stat_change(old, moved, 1.0) == pytest.approx(1e-9 / (1e-8 * 10.0), rel=1e-12)


def test_window_is_at_least_two_rounds_and_covers_one_over_p():
    from fedlatent.engine.rounds.loop import window_size

    assert [window_size(p) for p in (1.0, 0.5, 0.3, 0.15, 0.1)] == [2, 2, 4, 7, 10]
