"""SecAgg+ at scale (issue 23, item 5): the masking graph's parameters chosen without scipy, and
the round's and set-up's fast paths equal to the slow ones they replace."""

import math
import subprocess
import sys
from fractions import Fraction
from unittest import mock

import numpy as np
import pytest

import fedlatent.engine.secagg.graph as graph


def _exact_log_tails(k, p):
    """log P[Bin(k, p) >= t] and log P[Bin(k, p) < t], t = 1..k, from exact rationals."""
    q = Fraction(p)
    pmf = [math.comb(k, j) * q**j * (1 - q) ** (k - j) for j in range(k + 1)]

    def log(x):
        return math.log(x.numerator) - math.log(x.denominator)

    return ([log(sum(pmf[t:])) for t in range(1, k + 1)],
            [log(sum(pmf[:t])) for t in range(1, k + 1)])


@pytest.mark.parametrize("k,p", [(1, 0.3), (12, 0.05), (30, 0.665), (60, 0.25), (86, 0.5)])
def test_binomial_log_tails_equal_the_exact_sums(k, p):
    upper, lower = graph.binom_log_tails(k, p)
    up, lo = _exact_log_tails(k, p)
    np.testing.assert_allclose(upper[1:k + 1], up, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lower[1:k + 1], lo, rtol=1e-12, atol=1e-12)
    assert upper[k + 1] == -np.inf and lower[0] == -np.inf and abs(upper[0]) < 1e-12


def test_binomial_log_tails_refuse_what_is_no_binomial():
    with pytest.raises(ValueError, match=r"a binomial needs k >= 0 and 0 <= p <= 1, got k=3, "
                       r"p=1.5"):
        graph.binom_log_tails(3, 1.5)


def _scipy_secrecy(k, gamma, budget):  # the choice as it was made with scipy.stats
    from scipy.stats import binom

    if gamma <= 0:
        return 1
    t = np.arange(1, k + 2)
    ok = np.flatnonzero(binom.logsf(t - 1, k, gamma) <= -budget)
    return int(t[ok[0]]) if ok.size else k + 2


def _scipy_largest(k, rho, budget):
    from scipy.stats import binom

    t = np.arange(1, k + 1)
    ok = np.flatnonzero(binom.logcdf(t - 1, k, rho) <= -budget)
    return int(t[ok[-1]]) if ok.size else 0


def test_the_graph_parameters_equal_the_scipy_choice_over_a_grid_of_clients():
    grid = [(n, p, e) for n in (4, 10, 30, 50, 100, 300, 1000, 2000, 10_000)
            for p in (0.3, 0.7, 1.0) for e in (21, 128)] + [(100_000, 0.7, 21)]
    mine = [graph.plus_parameters(n, p, exchanges=e) for n, p, e in grid]
    with (mock.patch.object(graph, "_secrecy_threshold", _scipy_secrecy),
          mock.patch.object(graph, "_largest_threshold", _scipy_largest)):
        ref = [graph.plus_parameters(n, p, exchanges=e) for n, p, e in grid]
    assert mine == ref
    assert graph.plus_parameters(1000, 0.7, exchanges=21) == (86, 28)  # the benchmark's graph
    assert graph.plus_parameters(10_000, 0.7, exchanges=21) == (96, 31)


def test_choosing_the_graph_imports_no_scipy():
    code = ("import sys; import fedlatent.engine.secagg.graph as g; "
            "print(g.plus_parameters(1000, 0.7, exchanges=21), 'scipy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["(86,", "28)", "False"]
