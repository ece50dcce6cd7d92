"""What the server knows of a federation whose data it cannot see (a deployment).

A :class:`RemoteDataset` has the shape of a :class:`FederatedDataset` (client ids, sizes, column
names) and no rows. It is built from the clients' answers to a ``describe`` message: each client
validates its own data with the estimator's own checks (the same errors as in-process, naming the
client and the column) and reports only counts, column names and, where the estimator needs it,
its label set.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .dataset import DatasetShape, DataValidationError

__all__ = ["RemoteDataset"]


@dataclass
class RemoteDataset(DatasetShape):
    """Client ids, sizes and column names of a federation; the rows stay on the clients."""

    sizes: dict[str, int]
    feature_names: list[str]
    target_name: str | None = None
    entity_name: str | None = None
    has_target: bool = False
    has_entity: bool = False
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)

    is_remote = True

    def client_sizes(self) -> dict[str, int]:
        """Units of each client, as the clients described them."""
        return dict(self.sizes)

    def __len__(self) -> int:
        return len(self.sizes)

    def __iter__(self):
        return iter(self.client_ids)

    def items(self):
        raise TypeError(
            "a RemoteDataset has no rows: the data are on the clients (this is a deployment); "
            "per-client work must go through the runtime"
        )

    def __getitem__(self, cid):
        self.items()

    @classmethod
    def from_replies(cls, replies: Mapping[str, Mapping[str, Any]]) -> RemoteDataset:
        """Merge the clients' ``describe`` replies; clients must agree on the columns."""
        if not replies:
            raise DataValidationError("no client answered: the federation is empty")
        ids = sorted(replies)
        first = replies[ids[0]]
        feats = json.loads(str(first["feature_names"]))
        for cid in ids:
            r = replies[cid]
            f = json.loads(str(r["feature_names"]))
            if f != feats:
                raise DataValidationError(
                    f"client {cid!r} has feature columns {f}, client {ids[0]!r} has {feats}; "
                    "every client must hold the same features in the same order"
                )
            for key in ("has_target", "has_entity"):
                if bool(r[key]) != bool(first[key]):
                    what = key.split("_")[1]
                    raise DataValidationError(
                        f"client {cid!r} {'has' if r[key] else 'has no'} {what} column, client "
                        f"{ids[0]!r} {'has' if first[key] else 'has no'}; give every client the "
                        "same columns"
                    )
        return cls(
            sizes={cid: int(replies[cid]["n_samples"]) for cid in ids},
            feature_names=list(feats),
            target_name=(str(first["target_name"]) or None) if first.get("target_name") else None,
            entity_name=(str(first["entity_name"]) or None) if first.get("entity_name") else None,
            has_target=bool(first["has_target"]),
            has_entity=bool(first["has_entity"]),
            extras={cid: json.loads(str(replies[cid].get("extras", "{}"))) for cid in ids},
        )
