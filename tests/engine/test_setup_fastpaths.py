"""The whole fit at 100,000 clients (issue 40): the one-pass forms of per-client work give what
the per-client forms gave. logsumexp of a mixture's few columns has the bits of NumPy's row
reduction; a chunk's units and ids are read as slices only when they are the same clients."""

from __future__ import annotations

import numpy as np
import pytest

from fedlatent.engine.estimation.fitcontext import FitContext
from fedlatent.engine.protocol.exchange import _ids_at
from fedlatent.engine.protocol.numerics import logsumexp


def _reduced(a):
    """logsumexp as NumPy's reductions along the rows compute it (the general path)."""
    m = np.max(a, axis=1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(divide="ignore"):
        return np.squeeze(np.log(np.sum(np.exp(a - m), axis=1, keepdims=True)) + m, axis=1)


@pytest.mark.parametrize("K", [1, 2, 4, 7, 8, 11])
@pytest.mark.parametrize("N", [1, 3, 1000])
def test_logsumexp_of_few_columns_has_the_bits_of_the_row_reduction(K, N):
    rng = np.random.default_rng(K * 1000 + N)
    a = rng.normal(size=(N, K)) * 30
    a[rng.random(a.shape) < 0.1] = -np.inf
    a[rng.random(a.shape) < 0.02] = np.inf
    a[rng.random(a.shape) < 0.02] = np.nan
    a[rng.random(N) < 0.1] = -np.inf  # rows of no mass: -inf
    with np.errstate(invalid="ignore"):
        got, want = logsumexp(a), _reduced(a)
    assert got.shape == (N,)
    np.testing.assert_array_equal(got, want)  # (NaN where NaN)
    if N == 1000:
        assert np.isneginf(got).any() and np.isfinite(got).any()


def test_units_of_reads_runs_as_slices_and_any_other_list_by_lookup():
    units = {f"c{i}": i + 1 for i in range(10)}
    ctx = FitContext(runtime=None, model=None, federation=None, seed=0, n_units=units)
    ids = list(units)
    for chunk in (ids[0:4], ids[4:8], ids[8:10], ids[0:3], ids[2:5], ids[::-1], [ids[7]]):
        np.testing.assert_array_equal(ctx.units_of(chunk), [units[c] for c in chunk])
    ctx.n_units = {c: 2 * u for c, u in units.items()}  # a new setup: read anew
    np.testing.assert_array_equal(ctx.units_of(ids[:5]), [2 * units[c] for c in ids[:5]])


def test_ids_at_positions_slice_or_gather():
    ids = [f"c{i}" for i in range(8)]
    assert _ids_at(ids, np.arange(2, 6)) == ids[2:6]
    assert _ids_at(ids, np.array([1, 3, 4])) == ["c1", "c3", "c4"]
    assert _ids_at(ids, np.array([5, 4])) == ["c5", "c4"]
    assert _ids_at(ids, np.zeros(0, dtype=np.int64)) == []
