"""The site's side of a deployed run: where its private state lives and when it is written.

A SuperNode's private state (what :class:`~fedlatent.engine.node.client.ClientNode` keeps) lives in
Flower's ``context.state`` during a run and, so that it outlives the run, in the node's *site
directory* (:mod:`fedlatent.engine.node.site_state`): the node config's ``site-dir``, by default
``<data file stem>.site`` beside the node's data file. The node writes an entry after every
message that changes its state (a round's E-step, the control-variate start, a model query).

Two keys of a message steer it (the server's :class:`~fedlatent.runtime.flower.FlowerRuntime`
adds them):

- ``fedlatent.run``: the run's description (estimator name and parameters, JSON), recorded with
  every entry so that a site directory is never mistaken for another fit's;
- ``fedlatent.restore``: the round of the server checkpoint a resumed run continues from. The
  node's first round message (``estep``, ``evaluate``, ``cv_init``) then starts from its newest
  entry of that run written at a round ``<=`` it, which is the state it had in the
  uninterrupted run; until then (the resumed run's initialization exchanges) nothing is written.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from ..data.dataset import DataValidationError
from ..engine.node.site_state import read_site_state, run_key, write_site_state
from ..engine.protocol.messages import ERROR_KEY as _ERROR_KEY
from .flower_records import _ERROR, _ERROR_TYPE, _METHOD, _MODEL, _STATE, decode, encode
from .site_threads import pin_blas

__all__ = ["RESTORE", "RUN", "dataset_identity", "make_client_app", "node_policy", "own_signer",
           "provision", "require_roster", "restore_state", "save_after", "serve", "site_dir"]

logger = logging.getLogger(__name__)

RUN = "fedlatent.run"
#: where a node keeps its secure-aggregation secrets during a run (never in its site directory)
_SECAGG = "fedlatent.secagg"
RESTORE = "fedlatent.restore"
#: methods a node's state is restored on (the resumed run's first message of a round)
ROUND_METHODS = ("estep", "evaluate", "cv_init")
#: methods after which the state may have changed
_WRITES = ("estep", "cv_init", "query")


def site_dir(node_config: dict[str, Any], data_path: Path) -> Path:
    """The node's site directory: ``site-dir`` of its node config, else ``<stem>.site`` beside
    its data file."""
    given = node_config.get("site-dir")
    if given not in (None, ""):
        return Path(str(given)).expanduser()
    return data_path.with_name(data_path.stem + ".site")


def own_signer(node):
    """``(signer, trust)`` of a node whose site holds a signing key: its identity, which signs
    the site states it writes, and a roster of its own key alone, which verifies them on
    restore (an entry edited with its sha256 recomputed, or unsigned, is refused); else
    ``(None, None)``."""
    ident = getattr(node, "identity", None)
    if ident is None or ident.keys is None:
        return None, None
    from ..engine.site.keys import Roster

    ident = ident.for_site(node.client_id) if ident.site is None else ident
    return ident, Roster({ident.site: ident.keys.public_key})


def restore_state(where: Path, cid: str, run: str, round_: int,
                  trust=None) -> dict[str, np.ndarray]:
    """The state of client ``cid`` after round ``round_`` of ``run``, from its site directory
    (with ``trust``, a roster: only an entry a rostered site signed).

    Raises FileNotFoundError / ValueError naming the site directory and the fix when it is
    missing or of another client.
    """
    try:
        site = read_site_state(where, at_most_round=int(round_), run_key=run_key(json.loads(run)),
                               trust=trust)
    except FileNotFoundError as err:
        raise FileNotFoundError(f"client {cid!r} cannot resume: {err}") from err
    if site.client_id != cid:
        raise ValueError(
            f"client {cid!r} cannot resume: its site directory {where} holds the state of client "
            f"{site.client_id!r}; give each SuperNode its own site-dir")
    logger.info("client %r: resumed from its site state of round %d (%s)", cid, site.round,
                site.path)
    return dict(site.state)


def save_after(where: Path, cid: str, method: str, msg: dict[str, Any],
               state: dict[str, np.ndarray], run: str | None, restoring: bool,
               signer=None) -> None:
    """Write the node's state into its site directory after ``method`` (if it may have changed
    it, and not while a resumed run's restore is pending), signed by ``signer`` if given."""
    if run is None or method not in _WRITES or (restoring and method not in ROUND_METHODS):
        return
    try:
        write_site_state(where, client_id=cid, state=state, round_=int(msg.get("round", 0)),
                         run=json.loads(run), signer=signer)
    except OSError as err:
        raise OSError(
            f"client {cid!r}: cannot write its site state into {where} ({err}); give the "
            "SuperNode a writable site-dir in its --node-config") from err


# ---------------------------------------------------------------------------------------------
# The ClientApp
# ---------------------------------------------------------------------------------------------
_DATA_CACHE: dict[tuple[str, float], Any] = {}
#: the node's data file as arrays, in its site directory (see :func:`_load_node_data`)
DATA_CACHE = "data-cache"


def _source_id(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {"path": str(path.resolve()), "size": int(st.st_size), "mtime_ns": int(st.st_mtime_ns)}


def _cached(path: Path, site: Path):
    """The node's data from its cache in ``site`` if that is of this very file, else None."""
    from ..data.dataset import ClientData, FederatedDataset
    from ..engine.fedem.checkpoint import load_arrays_json

    try:
        arrays, meta = load_arrays_json(site / DATA_CACHE)
        if meta.get("source") != _source_id(path):
            return None
        cd = ClientData(arrays["X"], arrays.get("y"), arrays.get("entity"))
        return FederatedDataset({str(meta["client_id"]): cd}, list(meta["features"]),
                                target_name=meta.get("target"), entity_name=meta.get("entity"))
    except (OSError, ValueError, KeyError, TypeError):  # no cache yet, stale or damaged
        return None


def _write_cache(path: Path, site: Path, fd) -> None:
    from ..engine.fedem.checkpoint import save_arrays_json

    (cid,) = fd.client_ids
    cd = fd[cid]
    arrays = {k: np.asarray(v) for k, v in (("X", cd.X), ("y", cd.y), ("entity", cd.entity))
              if v is not None}
    if any(a.dtype == object for a in arrays.values()):
        return  # labels or ids of mixed types: read from the data file every time
    meta = {"source": _source_id(path), "client_id": cid, "features": list(fd.feature_names),
            "target": fd.target_name, "entity": fd.entity_name}
    try:
        save_arrays_json(site / DATA_CACHE, arrays, meta)
    except OSError as err:
        logger.warning("cannot cache the node's data in %s (%s); reading %s every time", site,
                       err, path)


def _load_node_data(path: Path, site: Path | None = None):
    """The node's one-client dataset. A ClientApp process answers one message; reading the
    Parquet file costs seconds there (pyarrow's dataset module imports pandas), so the node
    keeps its rows as arrays in its own site directory too (``data-cache.npz``/``.json``, the
    sha256 verified, refreshed when the data file's size or modification time changes)."""
    key = (str(path), path.stat().st_mtime if path.exists() else 0.0)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        fd = _cached(path, site) if site is not None and path.exists() else None
        if fd is None:
            from ..data.files import read_client_file  # the readers: only without a cache

            fd = read_client_file(path)
            if site is not None:
                _write_cache(path, site, fd)
        _DATA_CACHE[key] = fd
    return _DATA_CACHE[key]


#: the sha256 of the node's data file, in its site directory (see :func:`dataset_identity`)
DATA_ID = "data-id.json"


def _content_sha256(path: Path) -> str:
    h = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for f in files:
        if path.is_dir():
            h.update(str(f.relative_to(path)).encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def dataset_identity(policy, name: str, path: Path, site: Path | None) -> str:
    """What the site's ledger keeps a data set's lifetime budget under: its ``[datasets]``
    name when the server named one of the policy's, else ``sha256:`` of the data file's
    content (another name for the same file is the same data set; the server's
    ``data-name`` is never the key). The digest is kept in the site directory, keyed by the
    file's size and modification time (a node answers each message in a fresh process)."""
    if policy is not None and name and name in policy.datasets:
        return name
    source = {"path": str(path.resolve()), "size": path.stat().st_size,
              "mtime_ns": path.stat().st_mtime_ns}
    cache = None if site is None else site / DATA_ID
    try:
        kept = json.loads(cache.read_text()) if cache is not None else {}
    except (OSError, ValueError):
        kept = {}
    if kept.get("source") != source or not isinstance(kept.get("sha256"), str):
        kept = {"source": source, "sha256": _content_sha256(path)}
        if cache is not None:
            try:
                site.mkdir(parents=True, exist_ok=True)
                cache.write_text(json.dumps(kept))
            except OSError as err:
                logger.warning("cannot keep the data file's digest in %s (%s)", site, err)
    return "sha256:" + kept["sha256"]


def _node_data_path(context, paths: list[str] | None, policy=None) -> Path:
    """The node's data file. The server names a data set (the run config's ``data-name``),
    never a path: a name with ``/``, ``\\`` or ``..`` is refused, and under a site policy with
    ``[datasets]`` only its names are (each mapped to a local file by the site)."""
    nc = dict(context.node_config)
    name = str(dict(context.run_config).get("data-name", ""))
    if policy is not None and policy.datasets and name:
        return policy.dataset_path(name)
    if "data-path" in nc:
        p = Path(str(nc["data-path"]))
        if p.is_dir():
            if not name:
                raise DataValidationError(
                    f"node data-path {str(p)!r} is a directory: give the app's data-name "
                    "(the file to use in it)"
                )
            from ..engine.site.policy import SitePolicy

            p = p / (policy or SitePolicy()).dataset_path(name)
        return p
    if paths is not None and "partition-id" in nc:
        return Path(paths[int(nc["partition-id"])])
    raise DataValidationError(
        "this Flower node has no data: start the supernode with --node-config "
        "'data-path=\"/path/to/client.parquet\"' (fedlatent flower partition writes the files)"
    )


def serve(fd, state, method: str, msg: dict[str, Any], site: Path | None = None, *,
          policy=None, dataset: str = "default", simulation: bool = True,
          provisioned=None) -> dict[str, Any]:
    """Answer one message on a node: ``fd`` is the node's one-client dataset, ``state`` Flower's
    ``context.state`` (a RecordDict) where the node's private state persists between messages,
    ``site`` the node's site directory, where it also outlives the run
    (:mod:`fedlatent.runtime.flower_site`). ``policy``: the site's own
    (:class:`~fedlatent.engine.site.SitePolicy`; its ledger lives in ``site`` unless it names a
    directory), ``dataset`` the data set's name on the ledger. Without a policy a deployed node
    (``simulation=False``) holds the library's default, ``SitePolicy()`` (its ledger in
    ``site``); a simulated one the relaxed :meth:`~fedlatent.engine.site.SitePolicy.
    for_simulation` (the simulation holds every site). A deployed node refuses secure
    aggregation unless the site pins a roster (:func:`require_roster`). ``provisioned``
    (simulation): the signing key and roster the simulation gave this site
    (:attr:`ClientNode.provisioned`), or a callable returning them."""
    from flwr.app import Array, ArrayRecord, ConfigRecord

    from ..engine.node.client import ClientNode
    from ..engine.site.policy import SitePolicy

    (cid,) = fd.client_ids
    if policy is None:
        policy = SitePolicy.for_simulation() if simulation else SitePolicy()
    run = msg.pop(RUN, None)
    restore = msg.pop(RESTORE, None)
    saved = {k: v.numpy() for k, v in state[_STATE].items()} if _STATE in state else {}
    node = ClientNode(cid, fd[cid], saved, source=fd, policy=policy, dataset=dataset,
                      site_dir=site, deployed=not simulation)
    signer, trust = own_signer(node)  # a site with a key signs its states and checks them
    if restore is not None and method in ROUND_METHODS and site is not None and run is not None:
        node.state = restore_state(site, cid, str(run), int(restore), trust=trust)
    if method in ("describe", "settings"):  # (before any setup: no model needed)
        return node.handle(method, msg)
    if method != "setup":
        if _MODEL not in state:
            raise RuntimeError(f"client {cid!r} got {method!r} before the model's setup")
        again = node.handle("setup", dict(state[_MODEL]))
        if _ERROR_KEY in again:  # the site's policy refuses the run now (a replaced file)
            return again
    secure = method == "secagg" or "secagg/slot" in msg
    if secure and not simulation and msg.get("step") == "keys":
        require_roster(node)
    if method == "secagg" and provisioned is not None:
        node.provisioned = provisioned() if callable(provisioned) else provisioned
    if secure and _SECAGG in state and msg.get("step") != "keys":  # "keys": a new fit
        from ..engine.secagg import SecAggClient

        node.secagg = SecAggClient.load(str(state[_SECAGG]["client"]))
    reply = node.handle(method, msg)
    if secure and node.secagg is not None:  # the secrets stay in the node's context only
        state[_SECAGG] = ConfigRecord({"client": node.secagg.dump()})
    if site is not None:
        save_after(site, cid, method, msg, node.state, None if run is None else str(run),
                   restoring=restore is not None, signer=signer)
    if method == "setup" and _ERROR_KEY not in reply:  # a refused setup is not replayed
        state[_MODEL] = ConfigRecord({"run": str(msg.get("run", "")),
                                      "model": str(msg["model"]),
                                      "model_config": str(msg["model_config"]),
                                      "disclosure": str(msg.get("disclosure", "")),
                                      # differential privacy: replayed with every message
                                      "privacy": str(msg.get("privacy", "")),
                                      "privacy_releases": int(msg.get("privacy_releases", 0)),
                                      "verify": str(msg.get("verify", ""))})
    state[_STATE] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in node.state.items()})
    return reply


def require_roster(node) -> None:
    """A deployed site answers secure aggregation only with a pinned roster of the consortium's
    site keys and its own signing key: without them the server could stand in for every peer
    (its own keys, commitments and confirmations) and unmask this site's replies.
    ValueError naming the site and the fix otherwise."""
    ident = getattr(node, "identity", None)
    if ident is not None and ident.roster is not None and ident.keys is not None:
        return
    lacks = "a pinned roster" if ident is None or ident.roster is None else "a signing key"
    raise ValueError(
        f"site {node.client_id!r} refuses secure aggregation: a deployed site needs {lacks} "
        "(without a roster of the consortium's keys a server can stand in for every peer and "
        "unmask this site's replies); fix: each site runs 'fedlatent site keygen DIR', the "
        "consortium runs 'fedlatent site roster roster.json SITE=DIR/site-key.pub ...', and "
        "every site names both in its policy file ([site] signing-key and roster)")


def node_policy(node_config: dict[str, Any], policies: list[str] | None = None):
    """The node's site policy: its node config's ``policy-path``, else (simulation) the file
    of its partition id in ``policies``; None without one."""
    from ..engine.site.policy import SitePolicy

    given = node_config.get("policy-path")
    if given in (None, "") and policies is not None and "partition-id" in node_config:
        given = policies[int(node_config["partition-id"])]
    return None if given in (None, "") else SitePolicy.load(Path(str(given)).expanduser())


def make_client_app(paths: list[str] | None = None, policies: list[str] | None = None,
                    identities: tuple[list[str], str] | None = None):
    """A ``ClientApp`` answering fedlatent messages. ``paths`` (simulation): the data file of
    each partition id; in a deployment the node's ``data-path`` names it. ``policies``
    (simulation): the site policy file of each partition id (or None); in a deployment the
    node config's ``policy-path`` names it. ``identities`` (simulation): ``(key files, roster
    file)``, the signing key of each partition id and the roster of them all, provisioned for
    secure aggregation (:func:`provision`)."""
    from flwr.app import Message
    from flwr.clientapp import ClientApp

    app = ClientApp()
    paths = [str(p) for p in paths] if paths is not None else None

    @app.query("fedlatent")
    def handle(msg, context):
        try:
            d = decode(msg.content)
            method = str(d.pop(_METHOD))
            nc = dict(context.node_config)
            if "data-path" in nc:  # a deployed site: one BLAS thread for its process
                pin_blas(nc)
            policy = node_policy(nc, policies)
            path = _node_data_path(context, paths, policy)
            site = site_dir(nc, path)
            fd = _load_node_data(path, site)
            name = str(dict(context.run_config).get("data-name", ""))
            mine = None if identities is None or "partition-id" not in nc else (
                lambda i=int(nc["partition-id"]): _identity(identities, i, fd.client_ids[0]))
            reply = serve(fd, context.state, method, d, site, policy=policy,
                          dataset=dataset_identity(policy, name, path, site),
                          simulation="data-path" not in nc, provisioned=mine)
        except Exception as err:  # noqa: BLE001 - sent back, raised on the server
            logger.exception("fedlatent client error")
            reply = {_ERROR: str(err), _ERROR_TYPE: type(err).__name__}
        return Message(encode(reply), reply_to=msg)

    return app


def provision(client_ids: list[str], where: Path) -> tuple[list[str], str]:
    """A signing key per simulated site (``where/site-<i>.pem``) and the roster of their keys
    (``where/roster.json``): what :func:`make_client_app`'s ``identities`` takes."""
    from ..engine.site.keys import Roster, SiteKeys

    where.mkdir(parents=True, exist_ok=True)
    keys = {c: SiteKeys.generate() for c in client_ids}
    files = [str(keys[c].save(where / f"site-{i}.pem")) for i, c in enumerate(client_ids)]
    roster = where / "roster.json"
    roster.write_text(Roster({c: k.public_key for c, k in keys.items()}).to_json())
    return files, str(roster)


def _identity(identities: tuple[list[str], str], i: int, cid: str):
    from ..engine.site.keys import SiteIdentity

    files, roster = identities
    return SiteIdentity.from_paths(files[i], roster, site=cid)
