"""The GMM's batched step writes its sums straight into the reply buffer (``batched_out``):
the same statistics as the step that returns new arrays, nothing else of the buffer touched,
and a fit the same whether the runtime copies the step's arrays or not."""

from __future__ import annotations

import math

import numpy as np
import pytest

import fedlatent as fl
from fedlatent.models.gmm.batched import gaussian_sums
from fedlatent.models.gmm.model import GMMModel
from tolerance import assert_close


@pytest.mark.parametrize("cov_type", ["full", "diag", "tied"])
def test_sums_written_into_views_of_a_wider_buffer_are_the_returned_sums(cov_type):
    rng = np.random.default_rng(3)
    C, m, d, K = 7, 5, 3, 2
    X = rng.normal(size=(C, m, d))
    w = (rng.random((C, m)) < 0.8).astype(float)
    resp = rng.dirichlet(np.ones(K), size=(C, m)) * w[:, :, None]
    ref = gaussian_sums(X, resp, X.mean(axis=(0, 1)), cov_type, w)
    width = sum(v[0].size for v in ref.values())
    Q = np.full((C + 2, width + 3), np.nan)  # rows and columns around the clients' block
    out, col = {}, 2
    for k, v in ref.items():
        out[k] = Q[1:1 + C, col:col + v[0].size].reshape(v.shape)
        col += v[0].size
    got = gaussian_sums(X, resp, X.mean(axis=(0, 1)), cov_type, w, out)
    for k in ref:
        assert got[k] is out[k]
        assert_close(got[k], ref[k], err_msg=k)  # (BLAS may tile a strided output otherwise)
    assert_close(Q[1:1 + C, 2:2 + width], np.concatenate(
        [v.reshape(C, -1) for v in ref.values()], axis=1))
    untouched = np.ones(Q.shape, dtype=bool)
    untouched[1:1 + C, 2:2 + width] = False
    assert np.isnan(Q[untouched]).all()


def test_a_fit_is_the_same_whether_the_step_writes_into_the_reply_or_is_copied(monkeypatch):
    rng = np.random.default_rng(0)
    sizes = np.sort(rng.integers(5, 30, 300))  # ragged, each bucket's clients consecutive
    centres = rng.normal(scale=4.0, size=(3, 4))
    fd = fl.FederatedDataset.from_arrays({
        f"c{i:03d}": centres[i % 3] + rng.normal(size=(s, 4)) for i, s in enumerate(sizes)})

    # (the saturation rule refuses clients this small; every other rule at its default)
    fed = fl.Federation(disclosure=fl.DisclosurePolicy(max_parameters_per_record=math.inf))

    def fit():
        return fl.FederatedGaussianMixture(3, random_state=0, verbose=False,
                                           federation=fed).fit(fd)

    step, calls = GMMModel.client_stats_batched, []

    def counted(self, *args, out=None):
        calls.append(out is not None)
        return step(self, *args, out=out)

    monkeypatch.setattr(GMMModel, "client_stats_batched", counted)
    assert GMMModel.batched_out
    direct = fit()
    assert any(calls) and not all(calls)  # written in place but a round's first chunk
    monkeypatch.setattr(GMMModel, "batched_out", False)  # the runtime copies the arrays
    del calls[:]
    copied = fit()
    assert calls and not any(calls)
    assert direct.n_iter_ == copied.n_iter_
    for k in ("weights_", "means_", "covariances_"):
        assert_close(getattr(direct, k), getattr(copied, k), err_msg=k)
