"""One data file per client: what a site keeps on its own machine in a deployment.

A client file is a Parquet table of the client's rows (feature columns, then the target and the
entity column if any) whose schema metadata names the client and the role of every column, so a
node reads its data back without being told the column names. Values round-trip exactly (float64
features, the target and entity ids keep their dtype), so a fit on the files gives the same
numbers as a fit on the arrays. No pickle is involved.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from .dataset import ClientData, DataValidationError, FederatedDataset

__all__ = ["read_client_file", "write_client_files", "client_file_name"]

_META_KEY = b"fedlatent"


def client_file_name(index: int, client_id: str) -> str:
    """``client-007-<id made filename-safe>.parquet``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", str(client_id))[:60]
    return f"client-{index:03d}-{safe}.parquet"


def write_client_files(fd: FederatedDataset, out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write one Parquet file per client of ``fd`` into ``out_dir``; return ``{client: path}``.

    The files are numbered in ``fd.client_ids`` order (sorted), the order every runtime uses.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    target = fd.target_name or ("y" if fd.has_target else None)
    entity = fd.entity_name or ("entity" if fd.has_entity else None)
    paths: dict[str, Path] = {}
    for i, (cid, cd) in enumerate(fd.items()):
        cols = {name: np.ascontiguousarray(cd.X[:, j]) for j, name in enumerate(fd.feature_names)}
        if cd.y is not None:
            cols[target] = np.asarray(cd.y)
        if cd.entity is not None:
            ent = np.asarray(cd.entity)
            cols[entity] = ent.astype(str) if ent.dtype == object else ent
        meta = {
            "client_id": cid,
            "features": list(fd.feature_names),
            "target": target if cd.y is not None else None,
            "entity": entity if cd.entity is not None else None,
            "format": 1,
        }
        table = pa.table(cols).replace_schema_metadata({_META_KEY: json.dumps(meta).encode()})
        path = out / client_file_name(i, cid)
        pq.write_table(table, path)
        paths[cid] = path
    return paths


def read_client_file(path: str | os.PathLike) -> FederatedDataset:
    """The one-client dataset written by :func:`write_client_files`."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise DataValidationError(
            f"data file {str(path)!r} does not exist; give each node the path of its own file "
            "(fedlatent flower partition writes them)"
        )
    table = pq.read_table(path)
    raw = (table.schema.metadata or {}).get(_META_KEY)
    if raw is None:
        raise DataValidationError(
            f"{str(path)!r} is not a fedlatent client file (no 'fedlatent' schema metadata); "
            "write it with `fedlatent flower partition`"
        )
    meta = json.loads(raw.decode())
    names = table.column_names
    for col in [*meta["features"], meta.get("target"), meta.get("entity")]:
        if col is not None and col not in names:
            raise DataValidationError(f"client file {str(path)!r} misses column {col!r}")
    X = np.ascontiguousarray(
        np.column_stack([table.column(f).to_numpy().astype(np.float64, copy=False)
                         for f in meta["features"]])
    ) if meta["features"] else np.empty((table.num_rows, 0))
    y = table.column(meta["target"]).to_numpy() if meta.get("target") else None
    ent = None
    if meta.get("entity"):
        ent = table.column(meta["entity"]).to_numpy(zero_copy_only=False)
        if ent.dtype == object:
            ent = ent.astype(str)
    return FederatedDataset(
        {str(meta["client_id"]): ClientData(X, y, ent)},
        list(meta["features"]),
        target_name=meta.get("target"),
        entity_name=meta.get("entity"),
    )
