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

from .dataset import DataValidationError, FederatedDataset

__all__ = ["RemoteDataset", "describe_client", "describe_message"]


@dataclass
class RemoteDataset:
    """Client ids, sizes and column names of a federation; the rows stay on the clients."""

    sizes: dict[str, int]
    feature_names: list[str]
    target_name: str | None = None
    entity_name: str | None = None
    has_target: bool = False
    has_entity: bool = False
    extras: dict[str, dict[str, Any]] = field(default_factory=dict)

    is_remote = True

    @property
    def client_ids(self) -> list[str]:
        return sorted(self.sizes)

    @property
    def n_clients(self) -> int:
        return len(self.sizes)

    @property
    def n_features(self) -> int:
        return len(self.feature_names)

    @property
    def n_samples(self) -> int:
        return int(sum(self.sizes.values()))

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


def describe_message(estimator) -> dict[str, Any]:
    """The ``describe`` message for ``estimator``: its registry name and JSON parameters."""
    from ..models.registry import estimator_config

    name, params = estimator_config(estimator)
    return {"estimator": name, "estimator_params": json.dumps(params)}


def describe_client(fd: FederatedDataset, msg: Mapping[str, Any]) -> dict[str, Any]:
    """A client's answer to ``describe``: its own data validated by the estimator's checks.

    ``fd`` holds this one client. Raises the estimator's error (naming the client and the column)
    when the data do not fit the estimator; otherwise returns counts and column names only.
    """
    if fd.n_clients != 1:
        raise ValueError(f"describe_client expects one client's data, got {fd.n_clients}")
    extras: dict[str, Any] = {}
    if msg.get("estimator"):
        from ..models.registry import estimator_from_config

        est = estimator_from_config(str(msg["estimator"]),
                                    json.loads(str(msg.get("estimator_params", "{}"))))
        extras = est._describe_local(fd)
    (cid,) = fd.client_ids
    return {
        "client_id": cid,
        "n_samples": int(fd[cid].n_samples),
        "feature_names": json.dumps(list(fd.feature_names)),
        "target_name": fd.target_name or "",
        "entity_name": fd.entity_name or "",
        "has_target": bool(fd.has_target),
        "has_entity": bool(fd.has_entity),
        "extras": json.dumps(extras),
    }
