"""The comparison rule of tests/tolerance.py (issue 19, item 3), and the suite keeping to it."""

import re
from pathlib import Path

import numpy as np
import pytest

from tolerance import RTOL, assert_close, assert_same

TESTS = Path(__file__).parent


def test_assert_close_allows_rounding_and_refuses_more():
    a = np.array([1.0, -3.0, 1e-17, 2.5e3])
    ulp = np.spacing(a)
    assert_close(a + 4 * ulp, a)  # a few rounding steps
    assert_close(a + 1e-13 * 2.5e3 * np.array([0, 0, 1, 0]), a)  # near zero: the array's scale
    with pytest.raises(AssertionError, match="Mismatched elements: 1 / 4"):
        assert_close(a * np.array([1, 1, 1, 1 + 1e-10]), a)
    with pytest.raises(AssertionError, match="Mismatched elements: 1 / 4"):
        assert_close(a + np.array([0, 3e-12, 0, 0]), np.array([1.0, -3.0, 1e-17, 2.5e-3]))
    assert RTOL == 1e-12


def test_assert_close_is_exact_for_integers_and_places_of_nan():
    assert_close(np.array([1.0, np.nan]), np.array([1.0, np.nan]))
    with pytest.raises(AssertionError, match="nan location mismatch"):
        assert_close(np.array([1.0, np.nan]), np.array([1.0, 2.0]))
    with pytest.raises(AssertionError, match="Mismatched elements: 1 / 3"):
        assert_close(np.array([3, 4, 5]), np.array([3, 4, 6]), rtol=0.5)  # counts: exact
    with pytest.raises(AssertionError, match="Mismatched elements: 1 / 2"):
        assert_close(np.array([True, False]), np.array([True, True]))


def test_assert_same_is_every_bit():
    x = np.array([0.1, 0.2])
    assert_same(x, x.copy())
    with pytest.raises(AssertionError, match="Mismatched elements: 1 / 2"):
        assert_same(x + np.array([0.0, np.spacing(0.2)]), x)


#: numpy's exact array comparisons; the suite compares arrays through tests/tolerance.py
#: wherever two code paths are in view
EXACT = re.compile(r"assert_array" r"_equal|array_equal\(")  # split: this file is no hit
PATHS = re.compile(r"batched|remote|bit.for.bit", re.IGNORECASE)


def test_no_test_compares_code_paths_with_numpys_exact_equality():
    """A test file that names two code paths (batched clients, a remote runtime, "bit for bit")
    compares through assert_close (different floating-point work: a stated tolerance) or
    assert_same (a stated reason for exactness), never numpy's exact comparison, which passes on
    one CPU's kernels and fails on another's."""
    bad = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("*.py")
                 if p.name != "tolerance.py" and p != Path(__file__)
                 and EXACT.search(t := p.read_text(encoding="utf-8")) and PATHS.search(t))
    assert bad == [], (f"{bad} compare arrays exactly next to two code paths: use "
                       "tolerance.assert_close, or tolerance.assert_same saying why it is exact")
