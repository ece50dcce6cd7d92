"""A client's answer to ``describe``: its own data checked by the estimator's checks, and
counts and column names only (how the server of a deployment learns the federation's shape)."""

from __future__ import annotations

from typing import Any

from fedlatent.data.dataset import FederatedDataset
from fedlatent.engine.contract.registry import describer_from_config

__all__ = ["describe_client"]


def describe_client(fd: FederatedDataset, msg: dict[str, Any]) -> dict[str, Any]:
    """A client's answer to ``describe``: its own data validated by the estimator's checks.

    ``fd`` holds this one client. Raises the estimator's error (naming the client and the column)
    when the data do not fit the estimator; otherwise returns counts and column names only.
    """
    import json

    if fd.n_clients != 1:
        raise ValueError(f"describe_client expects one client's data, got {fd.n_clients}")
    extras: dict[str, Any] = {}
    dropped = sum(fd.missing_target_counts().values())
    if msg.get("estimator"):
        # (the model's describer where it registers one: no scikit-learn in a node's first
        # message)
        est = describer_from_config(str(msg["estimator"]),
                                    json.loads(str(msg.get("estimator_params", "{}"))))
        if not getattr(est.capabilities, "missing_values", False):
            fd.refuse_missing()
        if dropped and not getattr(est.capabilities, "missing_target", False):
            fd.refuse_missing_target()
        extras = est._describe_local(fd.with_target() if dropped else fd)
    if fd.has_missing:  # the server asks for the missing-data form of its queries
        extras = {**extras, "missing": True}
    if dropped:  # rows the node leaves out of the fit (FederatedModel.fit_data)
        extras = {**extras, "missing_target": dropped}
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
