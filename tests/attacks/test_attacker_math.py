"""The attacker's exact solvers on statistics built here (no fit): joint diagonalization of
per-component moment matrices, and the rows of a one- or two-row total."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import softmax

from attacks.attacker import Guess, joint_diagonalize, recovery_errors, rows_from_moments


def _blocks(X, resp):
    Z = np.column_stack([np.ones(len(X)), X])
    return [np.einsum("i,ij,ik->jk", resp[:, k], Z, Z) for k in range(resp.shape[1])]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_joint_diagonalization_gives_up_to_dim_z_rows_from_one_soft_reply(n):
    rng = np.random.default_rng(n)
    X = rng.normal(size=(n, 4)) * 5 + 10  # dim z = 5: up to 5 rows
    resp = softmax(rng.normal(size=(n, 3)) * 2, axis=1)
    rows = joint_diagonalize(_blocks(X, resp))
    assert rows.shape == (n, 4)
    assert recovery_errors([Guess("jd", rows)], X).max() < 1e-8


def test_joint_diagonalization_cannot_split_rows_that_share_every_block():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(3, 4))
    resp = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])  # rows 0 and 1 always together
    errs = recovery_errors([Guess("jd", joint_diagonalize(_blocks(X, resp)))], X)
    assert errs[2] < 1e-10 and min(errs[0], errs[1]) > 1e-3


def test_rows_of_a_total_of_one_or_two_rows_and_none_beyond():
    rng = np.random.default_rng(1)
    for n in (1, 2):
        X = rng.normal(size=(n, 3))
        (T,) = _blocks(X, np.ones((n, 1)))
        assert recovery_errors([Guess("t", rows_from_moments(T))], X).max() < 1e-9
    X = rng.normal(size=(3, 3))
    assert rows_from_moments(_blocks(X, np.ones((3, 1)))[0]) is None
