import numpy as np
import pytest

from fedlatent.engine import Stats
from fedlatent.models.gmm import gmm_statistics


def test_arithmetic_and_flatten_roundtrip():
    a = Stats({"n": [1.0, 2.0], "m": np.arange(6.0).reshape(2, 3)})
    b = Stats({"n": [0.5, 0.5], "m": np.ones((2, 3))})
    c = a + 2 * b - b / 2
    np.testing.assert_array_equal(c["n"], [1.75, 2.75])
    np.testing.assert_array_equal(c["m"], np.arange(6.0).reshape(2, 3) + 1.5)
    v = c.flatten()
    assert v.shape == (8,)
    back = c.unflatten(v)
    assert back.allclose(c, rtol=0)
    assert c.size == 8 and c.nbytes == 64
    assert c.squared_norm() == pytest.approx(float(v @ v))


def test_mismatched_blocks_are_refused():
    a = Stats({"n": [1.0]})
    with pytest.raises(ValueError, match="different blocks"):
        a + Stats({"m": [1.0]})
    with pytest.raises(ValueError, match="block 'n' has shape"):
        a + Stats({"n": [1.0, 2.0]})
    with pytest.raises(ValueError, match="expected a vector of length 1"):
        a.unflatten(np.zeros(3))


@pytest.mark.parametrize("cov", ["full", "tied", "diag", "spherical"])
def test_gmm_statistics_are_additive(cov):
    """stats(A) + stats(B) == stats(A and B): what federated EM rests on."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 4))
    resp = rng.dirichlet(np.ones(3), size=300)
    center = rng.normal(size=4)
    a = gmm_statistics(X[:120], resp[:120], center, cov)
    b = gmm_statistics(X[120:], resp[120:], center, cov)
    ab = gmm_statistics(X, resp, center, cov)
    for k in ab:
        np.testing.assert_allclose((a + b)[k], ab[k], rtol=1e-12, atol=1e-12)
