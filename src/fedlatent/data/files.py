"""One data file per client: what a site keeps on its own machine in a deployment.

A client file is a Parquet table of the client's rows (feature columns, then the target and the
entity column if any) whose schema metadata names the client and the role of every column, so a
node reads its data back without being told the column names. Values round-trip exactly (float64
features, the target and entity ids keep their dtype), so a fit on the files gives the same
numbers as a fit on the arrays. No pickle is involved.

Client ids are data, never paths: a client file is named by its index (the id, made safe, only
decorates the name), and files kept per client beside a model (FedGMM's ``clients/``) are listed
in a ``manifest.json`` that maps each id to its file (:func:`client_file_names`,
:func:`write_client_manifest`, :func:`client_files`); readers look ids up there and never build a
path from an id.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from .dataset import ClientData, DataValidationError, FederatedDataset
from .validation import to_float_array

__all__ = [
    "CLIENT_MANIFEST",
    "client_file_name",
    "client_file_names",
    "client_files",
    "read_client_file",
    "write_client_files",
    "write_client_manifest",
]

_META_KEY = b"fedlatent"

#: The file that maps client ids to their files in a directory of per-client files.
CLIENT_MANIFEST = "manifest.json"
# an id kept as its own file name: plain characters, no dot first or last, short
_PLAIN = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,62}[A-Za-z0-9_-])?$")
_INDEXED = re.compile(r"^_[0-9]{6,}$")
# names Windows reserves whatever the extension
_RESERVED = {"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)),
             *(f"lpt{i}" for i in range(10))}


def _plain(cid: str) -> bool:
    return bool(_PLAIN.match(cid)) and cid.split(".")[0].lower() not in _RESERVED


def client_file_names(client_ids, suffix: str = ".npz") -> dict[str, str]:
    """One file name per client id, safe on every file system; nothing is written.

    An id made only of letters, digits, ``_``, ``-`` and inner dots (at most 64, not a Windows
    device name, unique ignoring case) keeps its name, ``<id><suffix>``; any other id (``../x``,
    ``a/b``, ``CON``, spaces, unicode, NUL, 300 characters, ids equal but for case) gets
    ``_<index><suffix>``, its index in ``client_ids``. Plain names never start with ``_``, so the
    two kinds never collide. The mapping is what :func:`write_client_manifest` records.

    Raises
    ------
    ValueError
        An id that is not a string, or twice the same id.
    """
    ids = list(client_ids)
    bad = [c for c in ids if not isinstance(c, str)]
    if bad:
        raise ValueError(f"client ids must be strings; got {bad[0]!r} ({type(bad[0]).__name__})")
    if len(set(ids)) != len(ids):
        dup = next(c for c in ids if ids.count(c) > 1)
        raise ValueError(f"client id {dup!r} appears twice; client ids must be unique")
    folded: dict[str, int] = {}
    for c in ids:
        if _plain(c):
            folded[c.casefold()] = folded.get(c.casefold(), 0) + 1
    return {c: (f"{c}{suffix}" if _plain(c) and folded[c.casefold()] == 1
                else f"_{i:06d}{suffix}") for i, c in enumerate(ids)}


def write_client_manifest(directory: str | os.PathLike, names: dict[str, str]) -> Path:
    """Write ``<directory>/manifest.json``: ``{"format": 1, "clients": [[id, file], ...]}``.

    Written last (a temporary file renamed over it), so a directory with a manifest is complete.
    """
    path = Path(directory) / CLIENT_MANIFEST
    tmp = path.with_name(f".{CLIENT_MANIFEST}.tmp")
    tmp.write_text(json.dumps({"format": 1, "clients": [[c, f] for c, f in names.items()]},
                              indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def client_files(directory: str | os.PathLike, suffix: str = ".npz") -> dict[str, Path]:
    """``{client id: file}`` of a directory of per-client files, read from its manifest.

    Every file named by the manifest must be a plain name inside ``directory`` (a manifest that
    points elsewhere is refused). A directory written before manifests existed (no
    ``manifest.json``) lists its ``<id><suffix>`` files whose id is a plain name.

    Raises
    ------
    ValueError
        The manifest is not readable JSON of the expected form, or names a file outside.
    """
    directory = Path(directory)
    path = directory / CLIENT_MANIFEST
    if not path.exists():
        if not directory.is_dir():
            return {}
        found = sorted(p.name[: -len(suffix)] for p in directory.glob(f"*{suffix}"))
        return {c: directory / f"{c}{suffix}" for c in found if _plain(c)}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        pairs = doc["clients"]
        out = {}
        for c, f in pairs:
            stem = f[: -len(suffix)] if isinstance(f, str) and f.endswith(suffix) else None
            if (not isinstance(c, str) or stem is None or c in out
                    or not (_plain(stem) or _INDEXED.match(stem))):
                raise ValueError(f"entry {[c, f]!r} is not a client id and a plain file name")
            out[c] = directory / f
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise ValueError(f"{path} is not a fedlatent client manifest ({e}); write the directory "
                         "again") from e
    return out


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

    if fd.has_weights:  # refused, not dropped: a site's fit would silently be unweighted
        raise DataValidationError(
            f"client files do not carry frequency weights yet: the weight column "
            f"{fd.weight_name!r} cannot go to a Flower deployment; fit in-process, or repeat "
            "the rows by their (whole) weights")
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


def _client_meta(raw: bytes, path: Path) -> dict:
    """The 'fedlatent' schema metadata of a client file, checked: a client id, a list of
    feature names, a target and an entity (each a name or None), every column in one role."""
    bad = f"client file {str(path)!r} has broken fedlatent metadata"
    try:
        meta = json.loads(raw.decode())
    except (ValueError, UnicodeDecodeError) as err:
        raise DataValidationError(f"{bad} (not JSON: {err}); write it again with `fedlatent "
                                  "flower partition`") from err
    if not isinstance(meta, dict) or not isinstance(meta.get("features"), list):
        raise DataValidationError(f"{bad} (no list of features); write it again")
    cid = meta.get("client_id")
    if not isinstance(cid, str | int) or isinstance(cid, bool) or not str(cid).strip():
        raise DataValidationError(f"{bad} (client id {cid!r}); write it again")
    roles = [*meta["features"], meta.get("target"), meta.get("entity")]
    if not all(isinstance(r, str) for r in meta["features"]) or not all(
            r is None or isinstance(r, str) for r in roles):
        raise DataValidationError(f"{bad} (column names must be text); write it again")
    used = [r for r in roles if r is not None]
    for r in used:
        if used.count(r) > 1:
            raise DataValidationError(
                f"{bad}: column {r!r} is given {used.count(r)} roles (feature, target, entity); "
                "write it again")
    return meta


def read_client_file(path: str | os.PathLike) -> FederatedDataset:
    """The one-client dataset written by :func:`write_client_files`."""
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise DataValidationError(
            f"data file {str(path)!r} does not exist; give each node the path of its own file "
            "(fedlatent flower partition writes them)"
        )
    try:  # (ParquetFile: no pyarrow.dataset, no pandas: a third of read_table's import)
        table = pq.ParquetFile(path).read()
    except (OSError, ValueError) as err:  # ArrowInvalid: not Parquet, truncated
        raise DataValidationError(f"cannot read {str(path)!r} as a Parquet file: {err}") from err
    raw = (table.schema.metadata or {}).get(_META_KEY)
    if raw is None:
        raise DataValidationError(
            f"{str(path)!r} is not a fedlatent client file (no 'fedlatent' schema metadata); "
            "write it with `fedlatent flower partition`"
        )
    meta = _client_meta(raw, path)
    names = table.column_names
    for col in [*meta["features"], meta.get("target"), meta.get("entity")]:
        if col is not None and col not in names:
            raise DataValidationError(f"client file {str(path)!r} misses column {col!r}")
    X = np.ascontiguousarray(np.column_stack(
        [to_float_array(table.column(f).to_numpy(zero_copy_only=False).reshape(-1, 1),
                        lambda j, f=f: f, where=f"client file {str(path)!r}: ")
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
