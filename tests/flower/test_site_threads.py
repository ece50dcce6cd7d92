"""A deployed site's ClientApp limits the BLAS and OpenMP pools of its process to one thread,
once, at its first message (``fedlatent.runtime.site_threads``); the node config's
``blas-threads`` sets another number (0: the libraries' own). Run in fresh processes: the limit
is for a whole process."""

from __future__ import annotations

import pytest

from fedlatent.runtime.site_threads import blas_threads
from fresh_process import in_fresh_process

_THREADS = """
import os
os.environ.pop("OPENBLAS_NUM_THREADS", None); os.environ.pop("OMP_NUM_THREADS", None)
import numpy, scipy.linalg
from threadpoolctl import threadpool_info
from fedlatent.runtime.site_threads import pin_blas
before = sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
first = pin_blas(CONFIG)
mid = sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
second = pin_blas({"blas-threads": 3})
after = sorted({i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
result = [before, first, mid, second, after]
"""


def _run(config: dict):
    result, _ = in_fresh_process(_THREADS.replace("CONFIG", repr(config)), ())
    return result


@pytest.mark.parametrize(("config", "want"), [({}, 1), ({"blas-threads": 2}, 2)],
                         ids=["default", "two"])
def test_the_first_message_limits_the_process_once(config, want):
    before, first, mid, second, after = _run(config)
    assert first is True and second is False  # (the second call changes nothing)
    assert mid == after == [want], (before, mid, after)


def test_zero_leaves_the_libraries_own():
    before, first, mid, second, after = _run({"blas-threads": 0})
    assert first is False and mid == before
    assert second is True and after == [3]  # (nothing was set: a later call may set it)


@pytest.mark.parametrize("bad", [-1, "two", 1.5])
def test_a_bad_value_is_refused_naming_the_key(bad):
    with pytest.raises(ValueError, match=rf"^node config blas-threads={bad!r}: expected a "
                                         r"whole number >= 0"):
        blas_threads({"blas-threads": bad})
