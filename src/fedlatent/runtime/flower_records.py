"""fedlatent messages as Flower records: the keys of the ``query.fedlatent`` message and the
conversion of a flat message (see :mod:`fedlatent.engine.protocol.messages`) to a ``RecordDict``:
arrays in an ``ArrayRecord``, scalars and strings in a ``ConfigRecord``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = ["MESSAGE_TYPE", "decode", "encode"]

MESSAGE_TYPE = "query.fedlatent"
_METHOD = "fedlatent.method"
_ERROR = "fedlatent.error"
_ERROR_TYPE = "fedlatent.error_type"
_STATE = "fedlatent.state"
#: methods of a round: a node's error there makes it missing for the round, not the run's end
_ROUND_METHODS = ("estep", "evaluate")
_MODEL = "fedlatent.model"

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")


# ---------------------------------------------------------------------------------------------
# Messages <-> Flower records
# ---------------------------------------------------------------------------------------------
def encode(msg: Mapping[str, Any]):
    """A flat fedlatent message as a Flower ``RecordDict`` (arrays / config)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    arrays, config = {}, {}
    for k, v in msg.items():
        if v is None:
            continue
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                raise TypeError(f"message key {k!r}: object arrays cannot travel")
            arrays[k] = Array(np.ascontiguousarray(v))
        elif isinstance(v, np.generic):
            config[k] = v.item()
        elif isinstance(v, bool | int | float | str | bytes):
            config[k] = v
        else:
            raise TypeError(f"message key {k!r}: a {type(v).__name__} cannot travel")
    return RecordDict({"arrays": ArrayRecord(arrays), "config": ConfigRecord(config)})


def decode(rd) -> dict[str, Any]:
    """Inverse of :func:`encode`."""
    out: dict[str, Any] = {}
    if "config" in rd:
        out.update(dict(rd["config"]))
    if "arrays" in rd:
        out.update({k: v.numpy() for k, v in rd["arrays"].items()})
    return out

