"""How tests compare results of two code paths (issue 19, item 3).

The rule:

- Two code paths that do different floating-point work (batched vs per-client clients,
  chunked vs unchunked, a Flower or remote runtime vs in-process, a different evaluation
  order...) agree to a stated tolerance, never bit for bit: their bits depend on the CPU's
  BLAS kernels and SIMD widths, and on memory alignment, not on the code. :func:`assert_close`
  with ``rtol=1e-12`` (about 4500 rounding steps of 2.2e-16: plenty for a few rounds of EM,
  a bug moves results by far more).
- A result against a centralized reference (scikit-learn, statsmodels, a closed form) keeps the
  ``1e-8`` bar of the test that states it.
- Integer, boolean and string results (labels, counts, refusals, index sets) are exact:
  :func:`assert_close` compares non-float arrays exactly.
- Bit-for-bit equality stays only where it is a real promise on one machine: the same
  operations on the same values in the same order (a run resumed from its checkpoint against
  the uninterrupted run; arrays written and read back). :func:`assert_same` says so, with a
  comment at the call saying why it holds.
"""

from __future__ import annotations

import numpy as np

#: relative tolerance between two code paths doing different floating-point work
RTOL = 1e-12


def assert_close(actual, desired, rtol: float = RTOL, err_msg: str = "") -> None:
    """``actual`` equals ``desired`` to ``rtol`` relative to the scale of ``desired``.

    Each entry must satisfy ``|a - d| <= rtol * (|d| + max|desired|)`` (the max over the finite
    entries): relative to the array's scale, as an entry that cancels to near zero carries the
    rounding of the array's largest terms. NaN must be NaN in both,
    infinities equal; shapes must match (or one be a scalar, as in numpy's assertions). Arrays
    that are not floating point (integers, booleans, strings) are compared exactly.

    Parameters
    ----------
    actual, desired : array_like
        The two results; ``desired`` sets the scale.
    rtol : float, default 1e-12
        The relative tolerance.
    err_msg : str, default ""
        Added to the failure message (e.g. the name of the attribute compared).
    """
    a, d = np.asarray(actual), np.asarray(desired)
    if not (np.issubdtype(a.dtype, np.inexact) or np.issubdtype(d.dtype, np.inexact)):
        np.testing.assert_equal(a, d, err_msg=err_msg)
        return
    finite = np.isfinite(d)
    scale = float(np.max(np.abs(d[finite]), initial=0.0))
    np.testing.assert_allclose(a, d, rtol=rtol, atol=rtol * scale, equal_nan=True,
                               err_msg=err_msg)


def assert_same(actual, desired, err_msg: str = "") -> None:
    """``actual`` equals ``desired`` exactly (every bit of a float; NaN equal to NaN).

    For integer or boolean results, and for floats only where exact equality is a real promise:
    the same operations on the same values in the same order on one machine (say why at the
    call). Two code paths that do different floating-point work use :func:`assert_close`.
    """
    a, d = np.asarray(actual), np.asarray(desired)
    np.testing.assert_equal(a, d, err_msg=err_msg)
