import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import fedlatent as fl
from fedlatent.experiments import fedgmm_novelty, fedgmm_synthetic, fedgmm_unseen_clients


@pytest.fixture(autouse=True)
def _one_blas_thread():
    # small matrices: BLAS threads only add contention on a shared 2-core machine
    with threadpool_limits(1):
        yield


def test_synthetic_ordering_matches_the_paper(tmp_path):
    t = fedgmm_synthetic(quick=True, out=tmp_path, random_state=0).set_index("method")
    acc = t["accuracy"]
    mix = acc["FedEM (mixture of learners)"]
    assert acc["FedGMM"] > mix + 5.0
    assert mix > acc["FedAvg"] + 5.0
    assert mix > acc["Local"] + 3.0
    assert (tmp_path / "fedgmm_synthetic.png").stat().st_size > 0
    assert t.loc["FedGMM", "paper"] == 72.02


def test_unseen_clients_lose_at_most_three_points():
    t = fedgmm_unseen_clients(quick=True, random_state=0).set_index("method")
    assert t.loc["FedGMM", "drop"] <= 3.0
    np.testing.assert_allclose(t["drop"], t["seen_accuracy"] - t["unseen_accuracy"])
    assert t.loc["FedGMM", "unseen_accuracy"] > t.loc["FedAvg", "unseen_accuracy"] + 5.0


@pytest.mark.slow
def test_novelty_transformed_digits_are_detected(tmp_path):
    t = fedgmm_novelty(quick=True, out=tmp_path, random_state=0)
    row = t[(t.method == "FedGMM -log p(x)") & t.outlier.str.startswith("transformed")]
    assert row["AUROC"].item() >= 95.0
    assert set(t.outlier) == {"transformed (scale+rotate+flip)", "label-permuted",
                              "held-out class"}
    assert ((t[["AUROC", "AP", "max_F1"]] >= 0) & (t[["AUROC", "AP", "max_F1"]] <= 100)).all().all()


def test_experiments_are_registered_for_the_cli():
    import fedlatent.experiments as ex

    assert {"fedgmm_synthetic", "fedgmm_nongaussian", "fedgmm_unseen_clients",
            "fedgmm_novelty"} <= set(ex.__all__)
    assert fl.baselines.MixtureOfLearners(2).n_input_components == 1
