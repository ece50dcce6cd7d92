"""Checkpoints without pickle: arrays in one .npz, everything else in JSON.

Written atomically (temporary file, then rename) so a crash mid-write keeps the previous one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["save_arrays_json", "load_arrays_json"]


def save_arrays_json(path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: dict[str, Any]):
    """Write ``path.npz`` and ``path.json`` atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_npz = path.with_name(path.name + ".tmp.npz")
    tmp_json = path.with_name(path.name + ".tmp.json")
    with open(tmp_npz, "wb") as f:
        np.savez(f, **{k: np.asarray(v) for k, v in arrays.items()})
    with open(tmp_json, "w") as f:
        json.dump(meta, f, indent=1, default=_json_default)
    os.replace(tmp_npz, path.with_name(path.name + ".npz"))
    os.replace(tmp_json, path.with_name(path.name + ".json"))


def load_arrays_json(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    path = Path(path)
    npz = path.with_name(path.name + ".npz")
    js = path.with_name(path.name + ".json")
    if not npz.exists() or not js.exists():
        raise FileNotFoundError(f"no checkpoint at {path} (expected {npz.name} and {js.name})")
    with np.load(npz, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    with open(js) as f:
        meta = json.load(f)
    return arrays, meta


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
