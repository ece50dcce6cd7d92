"""Differential privacy on Flower's simulation engine: the setting reaches the clients in every
message (they rebuild their node from context.state), so a fit with a noise seed equals the
in-process one, and its replies carry the noise."""

import warnings

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")
pytest.importorskip("dp_accounting")

import fedlatent as fl  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.slow,
              pytest.mark.usefixtures("one_ray")]  # Ray started once per worker


def make(dp):
    return fl.FederatedGaussianMixture(2, max_rounds=2, random_state=3,
                                       federation=fl.Federation(privacy=dp))


def test_a_private_fit_on_the_flower_simulation_equals_inprocess_with_the_same_noise(tmp_path):
    from fedlatent.runtime.flower import simulate

    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays(
        {f"site-{i}": rng.normal(size=(60, 2)) + 3.0 * (i % 2) for i in range(3)})
    dp = fl.DifferentialPrivacy(2.0, 1e-5, clip=6.0, noise_seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        ref = make(dp).fit(fd)
        est = simulate(make(dp), fd, workdir=tmp_path, num_cpus=2)
        plain = make(fl.DifferentialPrivacy(2.0, 1e-5, clip=6.0, noise_seed=8)).fit(fd)
    assert est.flower_status_["status"] == "ok"
    np.testing.assert_allclose(est.means_, ref.means_, rtol=1e-10)
    np.testing.assert_allclose(est.weights_, ref.weights_, rtol=1e-10)
    assert not np.allclose(plain.means_, ref.means_)  # another noise: another fit
    assert est.privacy_spent_ == ref.privacy_spent_
    assert est.privacy_spent_[0] <= 2.0
