"""Secure aggregation on Flower's simulation engine: the same parameters as in-process (the
unmasked sums are exact in the ring), with masked replies only."""

import json
import warnings

import numpy as np
import pytest

pytest.importorskip("flwr")
pytest.importorskip("ray")
pytest.importorskip("cryptography")

import fedlatent as fl  # noqa: E402

pytestmark = [pytest.mark.flower, pytest.mark.slow,
              pytest.mark.usefixtures("one_ray")]  # Ray started once per worker


def make():
    fed = fl.Federation(quantizer=fl.Quantizer(8), secure_aggregation=True)
    return fl.FederatedGaussianMixture(2, max_rounds=3, tol=0.0, random_state=11,
                                       federation=fed)


def test_secure_aggregation_on_the_flower_simulation_equals_inprocess(tmp_path):
    from fedlatent.runtime.flower import simulate

    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays(
        {f"site-{i}": rng.normal(size=(40 + 10 * i, 2)) + 1.5 * (i % 2) for i in range(3)})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fl.ConvergenceWarning)
        ref = make().fit(fd)
        est = simulate(make(), fd, workdir=tmp_path, record=True, num_cpus=2)
    assert est.flower_status_["status"] == "ok"
    for name in ("weights_", "means_", "covariances_"):
        np.testing.assert_allclose(getattr(est, name), getattr(ref, name), rtol=1e-12)
    index = json.loads((tmp_path / "out" / "messages.json").read_text())
    ups = [m for m in index if m["method"] == "estep" and m["direction"] == "up"]
    assert len(ups) == 3 * 3  # 3 rounds, every site
    with np.load(tmp_path / "out" / "messages.npz", allow_pickle=False) as z:
        for m in ups:  # a round's reply: masked ring elements only, nothing in the clear
            assert set(m["message"]) == {"delta/nk", "delta/sx", "delta/sxx", "n",
                                         "objective/hi", "objective/lo"}
            assert all(z[f"{m['i']}/{k}"].dtype == np.uint64 for k in m["message"])
        methods = {m["method"] for m in index}
        assert "secagg" in methods
        assert all(m["message"].get("query") != "kmeans" for m in index)  # sums only
    # the simulated sites were given keys and a roster of them all (issue 37): each signed its
    # keys for the set-up, and every round ran the consistency round before the reveal
    from fedlatent.engine.site.keys import Roster

    assert Roster.load(tmp_path / "keys" / "roster.json").sites == tuple(fd.client_ids)
    steps = [m["message"].get("step") for m in index if m["method"] == "secagg"
             and m["direction"] == "down"]
    assert [steps.count(s) for s in ("keys", "open", "roster", "shares")] == [3] * 4
    assert steps.count("consistency") == steps.count("reveal") >= 3 * 4  # every exchange
    signed = [m for m in index if m["method"] == "secagg" and m["direction"] == "up"
              and "signature" in m["message"]]
    assert len(signed) == 3
