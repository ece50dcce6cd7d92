"""A deployed site's ClientApp runs the BLAS libraries of its process on one thread from its
first message (``fedlatent.runtime.site_threads``): those it loads from then on (SciPy's,
where a busy machine made a site's small factorizations 10-80x dearer on two) through their
environment, without importing anything (the lean client path imports no SciPy), and those
loaded before where they are. The node config's ``blas-threads`` sets another number (0: the
libraries' own); a site's own environment stands. Run in fresh processes: the limit is for a
whole process."""

from __future__ import annotations

import pytest

from fedlatent.runtime.site_threads import blas_threads
from fresh_process import in_fresh_process

_CHILD = """
import os
for _k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.pop(_k, None)
os.environ.update(ENV)
import numpy
if BEFORE:
    import scipy.linalg
from fedlatent.runtime.site_threads import pin_blas
first = pin_blas(CONFIG)
second = pin_blas({"blas-threads": 3})
import sys
light = [m for m in ("scipy", "threadpoolctl") if m in sys.modules]
import scipy.linalg
from threadpoolctl import threadpool_info
blas = [i for i in threadpool_info() if i["user_api"] == "blas"]
result = [first, second, light,
          sorted({i["num_threads"] for i in blas if "scipy.libs" in i["filepath"]}),
          sorted({i["num_threads"] for i in blas if "numpy.libs" in i["filepath"]})]
"""


def _run(config: dict, before: bool = False, env: dict | None = None):
    code = (_CHILD.replace("CONFIG", repr(config)).replace("BEFORE", repr(before))
            .replace("ENV", repr(env or {})))
    result, _ = in_fresh_process(code, ())
    return result


def test_the_libraries_loaded_after_the_first_message_run_on_one_thread():
    first, second, light, scipy_threads, _ = _run({})
    assert first is True and second is False  # once a process
    assert light == []  # nothing imported for it (NumPy's BLAS left as it was)
    assert scipy_threads == [1], scipy_threads


def test_a_blas_loaded_before_is_limited_where_it_is():
    first, _, light, scipy_threads, numpy_threads = _run({}, before=True)
    assert first is True and "threadpoolctl" in light
    assert scipy_threads == [1] and numpy_threads == [1]


def test_zero_leaves_the_libraries_own_and_so_does_a_sites_own_environment():
    unpinned = _run({"blas-threads": 0})
    assert unpinned[0] is False and unpinned[1] is True  # (nothing set: a later call may)
    own = _run({}, env={"OPENBLAS_NUM_THREADS": "2"})
    assert own[0] is True and own[3] == [2], own


@pytest.mark.parametrize("bad", [-1, "two", 1.5])
def test_a_bad_value_is_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match=rf"^node config blas-threads={bad!r}: expected a "
                                         r"whole number >= 0"):
        blas_threads({"blas-threads": bad})
