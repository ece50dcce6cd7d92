"""A site policy per partition on Flower's simulation engine (issue 21): every node reads its
own file (as a SuperNode reads ``policy-path``), keeps its ledger in its site directory, and
the ledgers add up to the ``privacy_spent_`` the server reports."""

import warnings

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")
pytest.importorskip("dp_accounting")

import fedlatent as fl  # noqa: E402
from fedlatent.engine.site import Ledger  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.slow,
              pytest.mark.usefixtures("one_ray")]  # Ray started once per worker


def test_a_private_fit_on_the_simulation_with_a_policy_per_site_is_on_every_ledger(tmp_path):
    from fedlatent.runtime.flower import simulate

    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays(
        {f"site-{i}": rng.normal(size=(60, 2)) + 3.0 * (i % 2) for i in range(3)})
    policies = {}
    for i, c in enumerate(fd.client_ids):
        f = tmp_path / f"policy-{i}.toml"
        f.write_text(f'[site]\nname = "{c}"\ndirectory = "ledger-{i}"\n'
                     "[privacy]\nrequired = true\nmax-epsilon = 2.0\nlifetime-epsilon = 3.0\n"
                     "lifetime-delta = 1e-5\n")
        policies[c] = f
    est = fl.FederatedGaussianMixture(2, max_rounds=2, random_state=3, federation=fl.Federation(
        privacy=fl.DifferentialPrivacy(2.0, 1e-5, clip=6.0)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        est = simulate(est, fd, workdir=tmp_path / "work", num_cpus=2, policies=policies)
    assert est.flower_status_["status"] == "ok"
    plan = est.privacy_calibration_.releases
    for i, c in enumerate(fd.client_ids):
        ledger = Ledger(tmp_path / f"ledger-{i}", c)  # the chain verified on reading
        releases = ledger.of("release")
        assert [e["release"] for e in releases] == list(range(1, plan + 1))
        assert {e["site"] for e in ledger.entries} == {c}
        dataset = releases[0]["dataset"]  # the node's data file's content (issue 39)
        assert dataset.startswith("sha256:") and len(dataset) == 7 + 64
        assert ledger.lifetime_epsilon(dataset, 1e-5) == pytest.approx(est.privacy_spent_[0],
                                                                       rel=1e-9)
