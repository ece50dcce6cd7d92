"""A killed private fit resumes (issue 21): the resumed fit starts from its checkpoint's initial
parameters, never from a second private initialization (whose fresh noise made the resume fail
with "the clients' data changed" and spent the initialization's budget twice)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.engine.privacy import DifferentialPrivacy


def _fd():
    rng = np.random.default_rng(0)
    return fl.FederatedDataset.from_arrays(
        {f"c{i}": rng.normal(size=(40, 2)) * 3 + i for i in range(3)})


def _gmm():
    return fl.FederatedGaussianMixture(2, random_state=0, max_rounds=4, federation=fl.Federation(
        privacy=DifferentialPrivacy(1.0, 1e-5, clip=5.0)))


class Kill(Exception):
    """The server process dies after a round (before its checkpoint of that round)."""


def _kill_at(k):
    def cb(r, *args):
        if r == k:
            raise Kill
    return cb


def test_a_private_fit_resumes_without_running_its_private_start_again(tmp_path):
    with pytest.raises(Kill):
        _gmm().fit(_fd(), checkpoint=tmp_path / "ck", checkpoint_every=1,
                   callbacks=[_kill_at(2)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "stopped before round" budget warning either
        est = _gmm().fit(_fd(), checkpoint=tmp_path / "ck", resume=True)
    assert est.n_iter_ == 4
    assert est.privacy_spent_[0] == pytest.approx(est.privacy_calibration_.epsilon_after(6))
