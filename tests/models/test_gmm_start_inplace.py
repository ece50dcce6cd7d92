"""Issue 23 item 3 (the 100,000-client whole fit): the GMM start's client query makes fewer
temporaries (the squared distances to 48 candidate centres computed in place, only the moved
rows translated); the same numbers, bit for bit, as the formulas they replace."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from fedlatent.engine.privacy.disclosure import DisclosurePolicy
from fedlatent.models.gmm.batched import gmm_batched_query
from fedlatent.models.gmm.math import merged_rows
from tolerance import assert_close


def _old_merged_rows(X, centers, labels, nearest):
    moved = labels != nearest
    if not moved.any():
        return X
    return X + np.where(moved[..., None], centers[labels] - centers[nearest], 0.0)


def test_merged_rows_translate_the_moved_rows_only_as_before():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(50, 10, 3))
    centers = rng.normal(size=(6, 3)) * 3.0
    nearest = rng.integers(0, 6, size=(50, 10))
    labels = np.where(rng.random((50, 10)) < 0.2, rng.integers(0, 6, size=(50, 10)), nearest)
    got = merged_rows(X, centers, labels, nearest)
    assert_close(got, _old_merged_rows(X, centers, labels, nearest))
    assert (labels != nearest).sum() > 50
    assert_close(got[labels == nearest], X[labels == nearest])
    assert merged_rows(X, centers, nearest, nearest) is X
    flat = merged_rows(X[0], centers, labels[0], nearest[0])  # one client's rows (n, d)
    assert_close(flat, _old_merged_rows(X[0], centers, labels[0], nearest[0]))


def test_hard_stats_of_many_clients_are_the_old_formulas():
    from fedlatent.models.gmm.batched import hard_labels_batched, hard_sums

    rng = np.random.default_rng(1)
    C, m, d, M = 300, 10, 4, 16
    X = rng.normal(size=(C, m, d)) + rng.integers(0, 3, size=(C, 1, 1)) * 4.0
    w = (rng.random((C, m)) < 0.9).astype(float)
    X *= w[:, :, None]  # padding rows are zeros
    centers = rng.normal(size=(M, d)) * 4.0
    center = X.reshape(-1, d).mean(0)
    model = SimpleNamespace(disclosure=DisclosurePolicy(), privacy=None, cov_type="full")
    got = gmm_batched_query(model, "hard_stats", {"centers": centers, "center": center}, X, w)
    d2 = (np.einsum("cmd,cmd->cm", X, X)[:, :, None] - 2 * (X @ centers.T)
          + np.einsum("ij,ij->i", centers, centers)[None, None, :])
    labels = hard_labels_batched(d2, w > 0, model.disclosure.min_records_per_block)
    Xm = _old_merged_rows(X, centers, labels, np.where(w > 0, d2.argmin(-1), labels))
    want = hard_sums(Xm, labels, w, center, "full", M)
    assert set(got) == {"stat/nk", "stat/sx", "stat/sxx"}
    for k, v in want.items():
        assert_close(got[f"stat/{k}"], v)
    assert (Xm != X).any()  # cells were merged: the translation was exercised
