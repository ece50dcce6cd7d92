"""engine.numerics.lift_eigenvalues: the one projection of noisy moment matrices."""

import numpy as np

from fedlatent.engine.protocol.numerics import lift_eigenvalues


def test_only_matrices_with_an_eigenvalue_below_the_floor_move_and_they_reach_it():
    rng = np.random.default_rng(0)
    B = rng.normal(size=(5, 3, 3))
    M = B @ np.transpose(B, (0, 2, 1)) + 0.5 * np.eye(3)  # eigenvalues >= 0.5
    M[2] -= 2.0 * np.eye(3)  # one indefinite matrix
    M[4, 0, 1] += 1e-3  # not symmetric: its symmetric part is what is judged
    out, moved = lift_eigenvalues(M, 0.25)
    assert moved.tolist() == [False, False, True, False, False]
    sym = 0.5 * (M + np.transpose(M, (0, 2, 1)))
    np.testing.assert_array_equal(out[[0, 1, 3, 4]], sym[[0, 1, 3, 4]])
    big = np.linalg.eigvalsh(sym[2])
    np.testing.assert_allclose(np.linalg.eigvalsh(out[2]), np.maximum(big, 0.25), rtol=1e-12)


def test_a_floor_per_matrix():
    M = np.stack([np.diag([1.0, 2.0]), np.diag([1.0, 2.0])])
    out, moved = lift_eigenvalues(M, np.array([0.5, 1.5]))
    assert moved.tolist() == [False, True]
    np.testing.assert_allclose(out[1], np.diag([1.5, 2.0]), atol=1e-12)
