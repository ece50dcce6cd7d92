"""Checkpoints and saved models without pickle, written atomically and verified when read.

**A checkpoint of the round loop is one file**, ``<path>.npz``: the arrays (parameters,
``S_hat``, ``V``, the initial parameters, every client's private state where the runtime can
see it) and, as its entry ``meta.json`` (UTF-8 bytes in a uint8 array), what the run was: model
and settings, seed, federation, the clients and their numbers of units, the keys and shapes of
the client states, the history, and one sha256 of the arrays and of every other entry of that
metadata (an edited history or round is refused as an edited array is). It is written to a
temporary file
in the same directory, flushed and fsynced, renamed over the previous one (``os.replace``) and
the directory fsynced: a crash at any point leaves the previous checkpoint or the new one, never
a mix. :func:`load_loop_checkpoint` refuses a checkpoint of another run (another model, seed,
federation, clients, or with client states missing) with a message saying what differs.

**A saved model is two files**, ``<path>.npz`` (arrays) and ``<path>.json`` (settings,
history), each written atomically, the ``.npz`` first; the JSON, written last, records the
sha256 of the ``.npz``. :func:`load_arrays_json` refuses a pair whose hash differs (an
interrupted save, a truncated or edited file). Everything is read with ``allow_pickle=False``.

**A hash is a checksum, not a signature**: whoever edits a file can recompute its sha256. A
pair saved with a ``signer`` (a :class:`~fedlatent.engine.site.keys.SiteIdentity` holding a
signing key and a site id) also records, in the JSON, that site's Ed25519 signature of the
.npz's sha256 and of the rest of the JSON (``"signature": {"site", "ed25519"}``). Loaded with
``trust`` (a pinned :class:`~fedlatent.engine.site.keys.Roster`), a pair is refused unless it
is signed by a rostered site and the signature verifies (an unsigned file, an edited one, one
signed by another key). Without ``trust`` the signature is not checked and files written
before signatures (or without one) load as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "RunIdentity",
    "atomic_write",
    "load_arrays_json",
    "load_loop_checkpoint",
    "save_arrays_json",
    "save_loop_checkpoint",
]

#: the entry of a checkpoint's .npz that holds its JSON metadata
META_ENTRY = "meta.json"
#: version of the one-file checkpoint layout
CHECKPOINT_FORMAT = 3  # 3: the sha256 covers the metadata too


# ---- writing files atomically ---------------------------------------------------------------
def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file in the same directory, flushed
    and fsynced, renamed over ``path``, then the directory fsynced. A crash leaves the old file
    or the new one, never part of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if hasattr(os, "fchmod"):
                os.fchmod(f.fileno(), 0o644)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    if os.name != "posix":  # pragma: no cover - directories cannot be opened on Windows
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def _read_npz(data: bytes, where: Path | str) -> dict[str, np.ndarray]:
    """The arrays of an .npz archive held in ``data``; ValueError naming ``where`` when it is
    not one (truncated, corrupt, pickled objects), or whose declared sizes are beyond the
    limits of :func:`~fedlatent.engine.protocol.bounds.check_zip` (checked before anything is
    unpacked)."""
    from fedlatent.engine.protocol.bounds import check_zip

    check_zip(data, str(where))
    try:
        z = np.load(io.BytesIO(data), allow_pickle=False)
        if not isinstance(z, np.lib.npyio.NpzFile):
            raise ValueError("it holds a single array, not an .npz archive")
        with z:
            return {k: z[k] for k in z.files}
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as err:
        raise ValueError(f"{where} is not a readable .npz archive ({err})") from err


def _read_bytes(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as err:
        raise ValueError(f"cannot read {what} {path} ({err})") from err


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.bool_):
        return bool(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def _to_json(obj: Any) -> Any:
    """``obj`` as it reads back from JSON (tuples become lists, NumPy scalars numbers)."""
    return json.loads(json.dumps(obj, default=_json_default))


# ---- saved models: a pair committed by the JSON, written last --------------------------------
#: the JSON field holding a saved pair's signature, and what such a signature is for
SIGNATURE_KEY, FILE_PURPOSE = "signature", "saved-file"


def _signed_content(meta: dict[str, Any]) -> bytes:
    """What a pair's signature covers: the canonical JSON of ``meta`` without its signature
    (the .npz's sha256 included)."""
    doc = {k: v for k, v in _to_json(meta).items() if k != SIGNATURE_KEY}
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _sign_meta(meta: dict[str, Any], signer) -> dict[str, Any]:
    import base64

    if signer.keys is None or signer.site is None:
        raise ValueError("a file is signed by a site: give a SiteIdentity with a signing key "
                         "and a site id (SiteIdentity(SiteKeys.load(...), site='...'))")
    sig = signer.keys.sign(FILE_PURPOSE, {"site": signer.site}, _signed_content(meta))
    return {**meta, SIGNATURE_KEY: {"site": signer.site,
                                    "ed25519": base64.b64encode(sig).decode()}}


def _verify_meta(meta: dict[str, Any], trust, where: Path) -> None:
    """Raise ValueError unless ``meta`` carries a rostered site's valid signature."""
    import base64
    import binascii

    sig = meta.get(SIGNATURE_KEY)
    if not isinstance(sig, dict) or not isinstance(sig.get("site"), str):
        raise ValueError(f"{where} is not signed, and a roster was given to check it: only "
                         "files signed by a rostered site are loaded; ask its author to save it "
                         "with a signing key (save(..., signer=...))")
    try:
        raw = base64.b64decode(str(sig.get("ed25519", "")), validate=True)
    except (ValueError, binascii.Error):
        raw = b""
    trust.verify(sig["site"], raw, FILE_PURPOSE, {"site": sig["site"]}, _signed_content(meta),
                 what=f"{where} (signed)")


def save_arrays_json(path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: dict[str, Any],
                     *, signer=None):
    """Write ``path.npz`` then ``path.json`` (which records the .npz's sha256 and, with a
    ``signer``, its Ed25519 signature of the pair), each atomically."""
    path = Path(path)
    data = _npz_bytes(arrays)
    atomic_write(path.with_name(path.name + ".npz"), data)
    meta = {**meta, "npz_sha256": hashlib.sha256(data).hexdigest()}
    if signer is not None:
        meta = _sign_meta(meta, signer)
    text = json.dumps(meta, indent=1, default=_json_default)
    atomic_write(path.with_name(path.name + ".json"), text.encode())


def load_arrays_json(path: str | os.PathLike, *, trust=None
                     ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """``(arrays, meta)`` of what :func:`save_arrays_json` wrote at ``path`` (the .npz is
    verified against the sha256 in the .json), or of a one-file checkpoint ``path.npz``.

    With ``trust`` (a pinned :class:`~fedlatent.engine.site.keys.Roster`), the pair must also
    carry a rostered site's valid signature (ValueError naming the file and the site otherwise);
    a one-file checkpoint, which is never signed, is then refused."""
    path = Path(path)
    npz = path.with_name(path.name + ".npz")
    js = path.with_name(path.name + ".json")
    if not js.exists():
        if npz.exists() and trust is not None:
            raise ValueError(f"{npz} is a checkpoint, which is never signed; a roster was given "
                             "to check a signed model or site state")
        if npz.exists():
            return _read_checkpoint_file(npz)
        raise FileNotFoundError(f"no model or checkpoint at {path} (expected {npz.name} and "
                                f"{js.name}, or a checkpoint {npz.name})")
    if not npz.exists():
        raise FileNotFoundError(f"{js} has no array file {npz.name} beside it")
    try:
        meta = json.loads(_read_bytes(js, "the model settings"))
    except ValueError as err:
        raise ValueError(f"{js} is not readable JSON ({err})") from err
    if not isinstance(meta, dict):
        raise ValueError(f"{js} does not hold a JSON object")
    data = _read_bytes(npz, "the model arrays")
    want = meta.get("npz_sha256")
    if not isinstance(want, str):
        raise ValueError(f"{js} records no sha256 of {npz.name} ('npz_sha256'): it was written "
                         "by an older fedlatent or edited; fit and save the model again")
    got = hashlib.sha256(data).hexdigest()
    if got != want:
        raise ValueError(
            f"{npz} does not match {js.name}: its sha256 is {got[:12]}..., the settings record "
            f"{want[:12]}... (an interrupted save, or a file truncated or edited since); save "
            "the model again"
        )
    if trust is not None:
        _verify_meta(meta, trust, js)
    return _read_npz(data, npz), meta


# ---- checkpoints: one file ------------------------------------------------------------------
def _arrays_sha256(arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}\0{a.dtype.str}\0{a.shape}\0".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def _checkpoint_sha256(arrays: dict[str, np.ndarray], meta: dict[str, Any]) -> str:
    """One sha256 of a checkpoint's arrays and of its metadata (every entry but the digest)."""
    rest = {k: v for k, v in meta.items() if k != "sha256"}
    text = json.dumps(rest, sort_keys=True, separators=(",", ":"), default=_json_default)
    return hashlib.sha256((_arrays_sha256(arrays) + "\0" + text).encode()).hexdigest()


def _read_checkpoint_file(npz: Path) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    arrays = _read_npz(_read_bytes(npz, "the checkpoint"), f"checkpoint {npz}")
    raw = arrays.pop(META_ENTRY, None)
    if raw is None:
        raise ValueError(f"checkpoint {npz} has no {META_ENTRY!r} entry: it was written by an "
                         "older fedlatent (an unverified .npz/.json pair) or is not a checkpoint;"
                         " delete it and fit without resume=True")
    try:
        meta = json.loads(np.asarray(raw, dtype=np.uint8).tobytes())
    except ValueError as err:
        raise ValueError(f"checkpoint {npz}: its {META_ENTRY!r} entry is not JSON ({err})") from err
    if not isinstance(meta, dict) or meta.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"checkpoint {npz} is of another format (format "
                         f"{meta.get('format') if isinstance(meta, dict) else None!r}, expected "
                         f"{CHECKPOINT_FORMAT}); delete it and fit without resume=True")
    if meta.get("sha256") != _checkpoint_sha256(arrays, meta):
        raise ValueError(f"checkpoint {npz}: its arrays or metadata do not match the sha256 it "
                         "records (edited or corrupted); delete it and fit without resume=True")
    return arrays, meta


@dataclass(frozen=True)
class RunIdentity:
    """What a checkpoint must match to be resumed: the model and its settings, the seed, the
    federation (``Federation.to_config()``), the clients in order and their numbers of units."""

    model: str
    model_config: dict[str, Any]
    federation: dict[str, Any]
    seed: int
    clients: dict[str, int]

    def to_meta(self) -> dict[str, Any]:
        d = _to_json(asdict(self))
        if isinstance(d["federation"].get("step_size"), str):  # a callable, by its repr
            d["federation"]["step_size"] = re.sub(r" at 0x[0-9a-fA-F]+", "",
                                                  d["federation"]["step_size"])
        d["clients"] = [[str(c), int(n)] for c, n in self.clients.items()]
        return d


def save_loop_checkpoint(path, *, params, state, history, client_states, identity: RunIdentity,
                         round_: int, params0, mirror=None) -> Path:
    """Write the round loop's checkpoint ``<path>.npz`` atomically (see the module docstring);
    returns the file written. ``mirror`` is ``(V_c by client (None: unknown), clients to
    resync)``, the server's copy of the clients' control variates (``rounds.screen.Mirror``), or
    None."""
    path = Path(path)
    ids = list(identity.clients)
    arrays = {f"params/{k}": np.asarray(v) for k, v in params.items()}
    arrays.update({f"params0/{k}": np.asarray(v) for k, v in params0.items()})
    if state.S_hat is not None:
        arrays.update(state.S_hat.to_dict("S_hat/"))
    if state.V is not None:
        arrays.update(state.V.to_dict("V/"))
    layout = None
    if client_states is not None:
        # clients by their index: an id is data, never part of a name
        layout = []
        for i, cid in enumerate(ids):
            st = {k: np.asarray(v) for k, v in client_states.get(cid, {}).items()}
            arrays.update({f"client/{i}/{k}": v for k, v in st.items()})
            layout.append({k: [v.dtype.str, list(v.shape)] for k, v in st.items()})
    mirror_meta = None
    if mirror is not None:
        # clients by their index, as their states; "known": indices whose V_c the server knows
        by_cid, resync = mirror
        known = [i for i, c in enumerate(ids) if by_cid.get(c) is not None]
        for i in known:
            arrays.update(by_cid[ids[i]].to_dict(f"mirror/{i}/"))
        mirror_meta = {"known": known, "resync": [i for i, c in enumerate(ids) if c in resync]}
    meta = {
        "format": CHECKPOINT_FORMAT,
        **identity.to_meta(),
        "round": int(round_),
        "client_states": layout,
        "mirror": mirror_meta,
        "history": [asdict(r) for r in history],
    }
    meta = json.loads(json.dumps(meta, default=_json_default))  # as it is read back
    meta["sha256"] = _checkpoint_sha256(arrays, meta)
    text = json.dumps(meta, default=_json_default).encode()
    arrays[META_ENTRY] = np.frombuffer(text, dtype=np.uint8)
    npz = path.with_name(path.name + ".npz")
    atomic_write(npz, _npz_bytes(arrays))
    stale = path.with_name(path.name + ".json")  # the .json of the older two-file layout
    with contextlib.suppress(FileNotFoundError):
        stale.unlink()
    return npz


def _short(ids: list[str], n: int = 8) -> str:
    return repr(ids) if len(ids) <= n else repr(ids[:n])[:-1] + f", ... ({len(ids)} in all)]"


def _differences(saved: dict, now: dict) -> str:
    keys = list(dict.fromkeys([*saved, *now]))
    out = [f"{k} {json.dumps(saved.get(k))} in the checkpoint, {json.dumps(now.get(k))} now"
           for k in keys if saved.get(k) != now.get(k)]
    return "; ".join(out)


def _check_identity(where: str, meta: dict, ident: RunIdentity) -> None:
    now = ident.to_meta()
    if meta.get("model") != now["model"]:
        raise ValueError(f"{where} is of model {meta.get('model')!r}; this fit is "
                         f"{now['model']!r}")
    if meta.get("seed") != now["seed"]:
        raise ValueError(f"{where} was written with seed {meta.get('seed')}; this fit has seed "
                         f"{now['seed']} (give the same random_state to resume)")
    for field, what in (("model_config", "model settings differ"),
                        ("federation", "federation differs")):
        saved = meta.get(field)
        if not isinstance(saved, dict) or saved != now[field]:
            diff = _differences(saved if isinstance(saved, dict) else {}, now[field])
            raise ValueError(f"{where}: {what}: {diff}")
    saved_clients = meta.get("clients")
    if not isinstance(saved_clients, list) or not all(
        isinstance(e, list) and len(e) == 2 for e in saved_clients
    ):
        raise ValueError(f"{where} records no clients")
    ids_then = [str(c) for c, _ in saved_clients]
    ids_now = list(ident.clients)
    if ids_then != ids_now:
        raise ValueError(f"{where} was written for clients {_short(ids_then)}; this fit has "
                         f"{_short(ids_now)}")
    for c, n in saved_clients:
        if n != ident.clients[str(c)]:
            raise ValueError(f"{where}: client {c!r} had {n} units in the checkpoint, "
                             f"{ident.clients[str(c)]} now (its data changed)")


def _check_arrays(where: str, arrays: dict, params0: dict, stat_shapes: dict, round_: int,
                  use_cv: bool):
    from fedlatent.engine.stats import Stats

    saved = {k[7:]: v for k, v in arrays.items() if k.startswith("params/")}
    first = {k[8:]: v for k, v in arrays.items() if k.startswith("params0/")}
    for name, p0 in params0.items():
        p0 = np.asarray(p0)
        for part, got in (("parameter", saved), ("initial parameter", first)):
            if name not in got:
                raise ValueError(f"{where} has no {part} {name!r}")
            if got[name].shape != p0.shape:
                raise ValueError(f"{where}: {part} {name!r} has shape {got[name].shape} in the "
                                 f"checkpoint, {p0.shape} in this fit")
        if not np.allclose(first[name], p0, rtol=1e-8, atol=1e-12, equal_nan=True):
            raise ValueError(f"{where}: the initial parameter {name!r} differs from this fit's "
                             "(the clients' data changed since it was written); delete it or "
                             "fit without resume=True")
    extra = sorted(set(saved) - set(params0))
    if extra:
        raise ValueError(f"{where} has parameters {extra} this fit does not have")
    blocks = {}
    for pre in ("S_hat/", "V/"):
        st = {k[len(pre):]: v for k, v in arrays.items() if k.startswith(pre)}
        if not st and (round_ == 0 or (pre == "V/" and not use_cv)):
            blocks[pre] = None
            continue
        shapes = {k: v.shape for k, v in st.items()}
        want = {k: tuple(s) for k, s in stat_shapes.items()}
        if shapes != want:
            raise ValueError(f"{where}: statistic {pre[:-1]} has blocks {shapes}, this fit's "
                             f"model has {want}")
        blocks[pre] = Stats(st)
    for k, v in arrays.items():
        if k.startswith(("params/", "params0/", "S_hat/", "V/")):
            if v.dtype != np.float64:
                raise ValueError(f"{where}: {k!r} has dtype {v.dtype}, not float64")
            # the M-step's parameters are finite (the loop stops otherwise); initial ones may
            # hold NaN placeholders
            if (round_ > 0 and not k.startswith("params0/")) and not np.all(np.isfinite(v)):
                raise ValueError(f"{where}: {k!r} has non-finite values")
    return saved, blocks["S_hat/"], blocks["V/"]


def _check_states(where: str, arrays: dict, meta: dict, ident: RunIdentity, now_states):
    layout = meta.get("client_states")
    ids = list(ident.clients)
    present = sorted({k.split("/", 2)[1] for k in arrays if k.startswith("client/")})
    if layout is None:
        if present:
            raise ValueError(f"{where} holds client states it does not list")
        if now_states is not None:
            raise ValueError(f"{where} was written by a runtime whose clients keep their state "
                             "themselves (a deployment); resume it with that kind of runtime")
        return None
    if now_states is None:
        raise ValueError(f"{where} holds the clients' private states, which this runtime "
                         "cannot restore; resume it with an in-process runtime")
    if not isinstance(layout, list) or len(layout) != len(ids):
        n = len(layout) if isinstance(layout, list) else 0
        raise ValueError(f"{where} lists the states of {n} clients, this fit has {len(ids)}")
    states: dict[str, dict[str, np.ndarray]] = {}
    listed = set()
    for i, (cid, keys) in enumerate(zip(ids, layout)):
        st = {}
        for key, (dtype, shape) in keys.items():
            name = f"client/{i}/{key}"
            listed.add(name)
            if name not in arrays:
                raise ValueError(f"{where} is missing the private state of client {cid!r} "
                                 f"({key!r}); it cannot be resumed: delete it or fit without "
                                 "resume=True")
            a = arrays[name]
            if a.dtype.str != dtype or list(a.shape) != list(shape):
                raise ValueError(f"{where}: state {key!r} of client {cid!r} has dtype "
                                 f"{a.dtype.str} and shape {a.shape}, recorded {dtype} {shape}")
            cur = now_states.get(cid, {}).get(key)
            if cur is not None and np.shape(cur) != a.shape:
                raise ValueError(f"{where}: state {key!r} of client {cid!r} has shape {a.shape}"
                                 f" in the checkpoint, {np.shape(cur)} in this fit")
            st[key] = a
        states[cid] = st
    unlisted = sorted(k for k in arrays if k.startswith("client/") and k not in listed)
    if unlisted:
        raise ValueError(f"{where} holds client states it does not list: {unlisted[:3]}")
    return states


def _check_mirror(where: str, arrays: dict, meta: dict, ident: RunIdentity, stat_shapes):
    """``(V_c by client, clients to resync)`` of the checkpoint (None: written without it)."""
    from fedlatent.engine.stats import Stats

    m = meta.get("mirror")
    ids = list(ident.clients)
    names = sorted(k for k in arrays if k.startswith("mirror/"))
    if m is None:
        if names:
            raise ValueError(f"{where} holds control variates it does not list: {names[:3]}")
        return None
    ok = isinstance(m, dict) and all(
        isinstance(m.get(f), list) and all(isinstance(i, int) and 0 <= i < len(ids)
                                           for i in m[f]) for f in ("known", "resync"))
    if not ok:
        raise ValueError(f"{where}: its list of mirrored control variates is malformed")
    want = {k: tuple(v) for k, v in stat_shapes.items()}
    mirror: dict = {c: None for c in ids}
    listed = set()
    for i in m["known"]:
        st = {k: arrays.get(f"mirror/{i}/{k}") for k in want}
        listed.update(f"mirror/{i}/{k}" for k in want)
        if any(v is None or v.shape != want[k] or v.dtype != np.float64
               or not np.all(np.isfinite(v)) for k, v in st.items()):
            raise ValueError(f"{where}: the mirrored control variate of client {ids[i]!r} is "
                             f"missing, not float64, not finite or not of shapes {want}")
        mirror[ids[i]] = Stats(st)
    if sorted(listed) != names:
        raise ValueError(f"{where} holds control variates it does not list: "
                         f"{sorted(set(names) - listed)[:3]}")
    return mirror, {ids[i] for i in m["resync"]}


def load_loop_checkpoint(path, identity: RunIdentity, params0, stat_shapes, client_states):
    """``(params, S_hat, V, history records, client states, round, mirror)`` of the
    checkpoint at ``path``, after checking it is of this run: ValueError saying what differs
    otherwise. ``mirror`` is the server's mirror of the clients' control variates, ``(V_c by
    client, clients to resync)`` (None in a checkpoint without it).

    ``params0`` (this fit's initial parameters), ``stat_shapes`` (the model's statistic
    blocks) and ``client_states`` (the runtime's current client states, None when it cannot
    see them) are what the checkpoint's arrays are checked against.
    """
    path = Path(path)
    npz = path.with_name(path.name + ".npz")
    where = f"checkpoint {npz}"
    if not npz.exists():
        raise FileNotFoundError(f"no checkpoint {npz} to resume from; fit without resume=True")
    arrays, meta = _read_checkpoint_file(npz)
    _check_identity(where, meta, identity)
    round_ = meta.get("round")
    history = meta.get("history")
    if not isinstance(round_, int) or round_ < 0 or not isinstance(history, list) \
            or len(history) != round_ or any(
                not isinstance(r, dict) or r.get("round") != i + 1 for i, r in enumerate(history)):
        raise ValueError(f"{where}: its round ({round_!r}) and history do not agree")
    use_cv = bool(identity.federation.get("control_variates"))
    params, S_hat, V = _check_arrays(where, arrays, params0, stat_shapes, round_, use_cv)
    states = _check_states(where, arrays, meta, identity, client_states)
    mirror = _check_mirror(where, arrays, meta, identity, stat_shapes)
    return params, S_hat, V, history, states, round_, mirror
