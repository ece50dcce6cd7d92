"""Checkpoints without pickle: arrays in one .npz, everything else in JSON.

Written atomically (temporary file, then rename) so a crash mid-write keeps the previous one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "load_arrays_json",
    "load_loop_checkpoint",
    "save_arrays_json",
    "save_loop_checkpoint",
]


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


def save_loop_checkpoint(path, *, params, state, history, client_states, meta: dict[str, Any]):
    """The round loop's checkpoint: parameters, ``S_hat``, ``V``, every client's private state
    (where the runtime can see it) and the history so far."""
    from dataclasses import asdict

    arrays = {f"params/{k}": v for k, v in params.items()}
    if state.S_hat is not None:
        arrays.update(state.S_hat.to_dict("S_hat/"))
    if state.V is not None:
        arrays.update(state.V.to_dict("V/"))
    for cid, st in (client_states or {}).items():
        for k, v in st.items():
            arrays[f"client/{cid}/{k}"] = v
    save_arrays_json(path, arrays, {**meta, "history": [asdict(r) for r in history]})


def load_loop_checkpoint(path, model_name: str, seed: int):
    """``(params, S_hat, V, history records, client states, round)`` of a checkpoint; raises
    ValueError if it is of another model or seed."""
    from .stats import Stats

    arrays, meta = load_arrays_json(path)
    if meta.get("model") != model_name or meta.get("seed") != int(seed):
        raise ValueError(
            f"checkpoint {path} is of model {meta.get('model')!r} with seed "
            f"{meta.get('seed')}; this fit is {model_name!r} with seed {seed}"
        )
    params = {k[7:]: v for k, v in arrays.items() if k.startswith("params/")}
    S_hat = Stats.from_dict(arrays, "S_hat/")
    V = Stats.from_dict(arrays, "V/") if any(k.startswith("V/") for k in arrays) else None
    states: dict[str, dict[str, np.ndarray]] = {}
    for k, v in arrays.items():
        if k.startswith("client/"):
            _, cid, rest = k.split("/", 2)
            states.setdefault(cid, {})[rest] = v
    return params, S_hat, V, meta["history"], states, int(meta["round"])
