"""The server names a data set, never a file (issue 21): a Flower node refuses a run config
``data-name`` that is a path (``..``, ``/``, ``\\``), even without a site policy (with one:
``test_server_deviates.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest


def _context(tmp_path, name):
    return SimpleNamespace(node_config={"data-path": str(tmp_path)},
                           run_config={"data-name": name})


@pytest.mark.parametrize("name", ["../other_study/site.parquet", "/etc/passwd", "a/b.parquet",
                                  "..\\other.parquet"])
def test_a_data_name_that_is_a_path_is_refused(tmp_path, name):
    pytest.importorskip("flwr")
    from fedlatent.runtime.flower_site import _node_data_path

    with pytest.raises(ValueError, match=r"refused: the server names a data set, never a path"):
        _node_data_path(_context(tmp_path, name), None)
