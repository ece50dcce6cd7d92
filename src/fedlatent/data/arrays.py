"""``{client: X}`` or ``{client: (X, y[, entity])}`` -> the arguments of a FederatedDataset.

The body of :meth:`FederatedDataset.from_arrays`: each client's arrays checked (shape, numbers,
widths, y for all clients or none), errors naming the client. Rows made from arrays have no
source table: predictions on them are indexed by a RangeIndex in client order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .validation import DataValidationError, check_client_ids, check_target_values, to_float_array

__all__ = ["arrays_parts"]


def arrays_parts(data: Mapping[object, object], feature_names: Sequence[str] | None = None,
                 entities: Mapping[object, np.ndarray] | None = None,
                 weights: Mapping[object, np.ndarray] | None = None) -> dict[str, Any]:
    """The keyword arguments of the :class:`FederatedDataset` of ``data`` (see
    :meth:`FederatedDataset.from_arrays`)."""
    from .client import ClientData

    if not isinstance(data, Mapping) or len(data) == 0:
        raise DataValidationError(
            "from_arrays expects a non-empty dict {client: X} or {client: (X, y)}"
        )
    check_client_ids(data)  # 1 and "1" would merge below
    given = list(feature_names) if feature_names is not None else []

    def name_of(j: int) -> str:
        return str(given[j]) if j < len(given) else f"x{j}"

    clients: dict[str, ClientData] = {}
    width = None
    has_y = None
    for cid, value in data.items():
        cid = str(cid)
        y = ent = None
        if isinstance(value, tuple | list) and len(value) in (2, 3):
            X = value[0]
            y = value[1]
            if len(value) == 3:
                ent = value[2]
        else:
            X = value
        X = np.asarray(X)
        if X.ndim == 1:
            X = X.reshape(-1, 1)
        if X.ndim != 2:
            raise DataValidationError(
                f"client {cid!r}: X must be 2-D (n_samples, n_features), got shape {X.shape}"
            )
        # complex, dates and text are refused here, before the cast could hide them
        X = to_float_array(X, name_of, where=f"client {cid!r}: ")
        if width is None:  # widths are compared by validate(), on construction
            width = X.shape[1]
        if has_y is None:
            has_y = y is not None
        elif has_y != (y is not None):
            raise DataValidationError(
                f"client {cid!r}: some clients have y and some do not; give y for all or none"
            )
        if y is not None:
            y = np.asarray(y)
            if y.ndim != 1:
                y = y.reshape(-1)
            check_target_values(y, "y", where=f"client {cid!r}: ", allow_nan=True)
            if y.shape[0] != X.shape[0]:
                raise DataValidationError(
                    f"client {cid!r}: y has {y.shape[0]} values but X has {X.shape[0]} rows"
                )
        if entities is not None and cid in {str(k) for k in entities}:
            ent = np.asarray({str(k): v for k, v in entities.items()}[cid])
        if ent is not None:
            ent = np.asarray(ent)
            if ent.shape[0] != X.shape[0]:
                raise DataValidationError(
                    f"client {cid!r}: entity has {ent.shape[0]} values but X has "
                    f"{X.shape[0]} rows"
                )
        clients[cid] = ClientData(X, y, ent)
    names = list(feature_names) if feature_names is not None else [
        f"x{j}" for j in range(width)
    ]
    if len(names) != width:
        raise DataValidationError(
            f"feature_names has {len(names)} names but the data have {width} columns"
        )
    if weights is not None:
        _attach_weights(clients, weights)
    return {"clients": clients, "feature_names": names, "target_name": "y" if has_y else None,
            "entity_name": "entity" if any(c.entity is not None for c in clients.values())
            else None, "weight_name": None if weights is None else "weight"}


def _attach_weights(clients: dict, weights: Mapping[object, np.ndarray]) -> None:
    """Each client's weights (``{client: weights}``, every client), checked when the dataset
    validates (:mod:`fedlatent.data.weights`)."""
    from .weights import weight_array

    if not isinstance(weights, Mapping):
        raise DataValidationError("weights must be a dict {client: weight of each row}")
    given = {str(k): v for k, v in weights.items()}
    missing = [c for c in clients if c not in given]
    unknown = [c for c in given if c not in clients]
    if missing or unknown:
        raise DataValidationError(
            f"weights must name exactly the clients of the data: missing {missing[:10]}, "
            f"unknown {unknown[:10]}")
    for cid, cd in clients.items():
        cd.weight = weight_array(given[cid], "weight", cid, cd.n_samples)

