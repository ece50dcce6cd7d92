"""The Flower runtime: any fedlatent estimator on Flower's Message API, simulated or deployed.

Server side, :class:`FlowerRuntime` implements the engine's :class:`~fedlatent.runtime.base.Runtime`
over a Flower ``Grid``: ``call`` sends one ``query.fedlatent`` message per client and returns the
replies that arrive within the round's timeout; a node that does not answer is absent from the
result, so the engine treats it as not taking part in that round (and the history says so).
Client side, the ``ClientApp`` handler rebuilds a :class:`~fedlatent.engine.client.ClientNode` on
every message from the node's own data file and its private state kept in ``context.state``
(FedGMM's pi_c, HLCR's labels and counts, control variates, SPIDER memory). Models do not change.

A message is a flat dict (see :mod:`fedlatent.engine.messages`): arrays travel in an
``ArrayRecord``, scalars and strings in a ``ConfigRecord``. Replies are validated by the engine
before aggregation; an exception on a node comes back as an error reply naming the node's client
and is raised on the server (a data error as :class:`~fedlatent.data.DataValidationError`).

Three ways to run one fit, one result (same seed, same participation pattern):

- in-process: ``est.fit(fd)`` (default);
- Flower simulation: :func:`simulate` (``pip install fedlatent[flower-sim]``, needs Ray);
- a deployment: one superlink, one supernode per site started with
  ``--node-config 'data-path="/site/client.parquet"'``, and ``flwr run`` of the app directory that
  ``fedlatent flower app`` writes (``pip install fedlatent[flower]``); see
  :mod:`fedlatent.runtime.flower_local` for a loopback deployment.

The server app reads its settings from the run config (:func:`run_config_for`) and writes into
``out-dir``: ``status.json`` (updated every round), the fitted estimator (``model.npz`` and
``model.json``, read back by :func:`load_result`), ``history.csv`` and, when ``record`` is set,
``messages.npz``/``messages.json`` with every message that crossed (for privacy checks).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..data.dataset import DataValidationError
from ..engine.messages import ERROR_KEY, ClientReplyError
from ..engine.runtime import Runtime

__all__ = [
    "FlowerRuntime",
    "client_app",
    "decode",
    "encode",
    "load_result",
    "make_client_app",
    "make_server_app",
    "run_config_for",
    "server_app",
    "simulate",
]

logger = logging.getLogger(__name__)

MESSAGE_TYPE = "query.fedlatent"
_METHOD = "fedlatent.method"
_ERROR = "fedlatent.error"
_ERROR_TYPE = "fedlatent.error_type"
_STATE = "fedlatent.state"
#: methods of a round: a node's error there makes it missing for the round, not the run's end
_ROUND_METHODS = ("estep", "evaluate")
_MODEL = "fedlatent.model"

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")


# ---------------------------------------------------------------------------------------------
# Messages <-> Flower records
# ---------------------------------------------------------------------------------------------
def encode(msg: Mapping[str, Any]):
    """A flat fedlatent message as a Flower ``RecordDict`` (arrays / config)."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

    arrays, config = {}, {}
    for k, v in msg.items():
        if v is None:
            continue
        if isinstance(v, np.ndarray):
            if v.dtype == object:
                raise TypeError(f"message key {k!r}: object arrays cannot travel")
            arrays[k] = Array(np.ascontiguousarray(v))
        elif isinstance(v, np.generic):
            config[k] = v.item()
        elif isinstance(v, bool | int | float | str | bytes):
            config[k] = v
        else:
            raise TypeError(f"message key {k!r}: a {type(v).__name__} cannot travel")
    return RecordDict({"arrays": ArrayRecord(arrays), "config": ConfigRecord(config)})


def decode(rd) -> dict[str, Any]:
    """Inverse of :func:`encode`."""
    out: dict[str, Any] = {}
    if "config" in rd:
        out.update(dict(rd["config"]))
    if "arrays" in rd:
        out.update({k: v.numpy() for k, v in rd["arrays"].items()})
    return out


# ---------------------------------------------------------------------------------------------
# Server side
# ---------------------------------------------------------------------------------------------
class FlowerRuntime(Runtime):
    """The engine's transport over a Flower ``Grid``.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
    describe : dict
        The ``describe`` message (:func:`fedlatent.engine.registry.describe_message`): every node
        answers with its client id, counts and column names, after checking its own data.
    min_nodes : int
        Wait until this many nodes are connected (at most ``node_wait`` seconds).
    round_timeout : float
        Seconds to wait for replies to one call; nodes not answering by then are absent.
    record : bool
        Keep every decoded message in ``self.log`` as (direction, client, method, message).
    """

    def __init__(self, grid, describe: Mapping[str, Any], *, min_nodes: int = 1,
                 node_wait: float = 120.0, round_timeout: float = 120.0, record: bool = False):
        self.grid = grid
        self.round_timeout = float(round_timeout)
        self.record = bool(record)
        self.log: list[tuple[str, str, str, dict[str, Any]]] = []
        self.lost: dict[str, str] = {}  # client -> why its last reply is missing
        t0 = time.perf_counter()
        nodes = sorted(grid.get_node_ids())
        while len(nodes) < int(min_nodes):
            if time.perf_counter() - t0 > float(node_wait):
                raise TimeoutError(
                    f"only {len(nodes)} of min-nodes={min_nodes} Flower nodes connected within "
                    f"{node_wait:g} s; start more supernodes or lower min-nodes"
                )
            time.sleep(0.5)
            nodes = sorted(grid.get_node_ids())
        self._node: dict[str, int] = {}
        self._cid_of: dict[int, str] = {}
        self._describing = True
        replies = self._exchange({n: ("describe", dict(describe)) for n in nodes}, node_wait)
        self._describing = False
        by_cid: dict[str, dict[str, Any]] = {}
        for nid in nodes:
            if nid not in replies:
                logger.warning("Flower node %s did not answer 'describe': left out", nid)
                continue
            rep = replies[nid]
            cid = str(rep["client_id"])
            if cid in by_cid:
                raise DataValidationError(
                    f"nodes {self._node[cid]} and {nid} both hold client {cid!r}; give every "
                    "supernode its own data file"
                )
            self._node[cid] = nid
            self._cid_of[nid] = cid
            by_cid[cid] = rep
        if len(by_cid) < int(min_nodes):
            raise TimeoutError(
                f"only {len(by_cid)} of min-nodes={min_nodes} Flower nodes described their data"
            )
        self.describe_replies = by_cid
        self.startup_seconds = time.perf_counter() - t0

    @property
    def client_ids(self) -> list[str]:
        return sorted(self._node)

    def _exchange(self, jobs: dict[int, tuple[str, dict[str, Any]]], timeout):
        """Send ``jobs[node] = (method, msg)``; return ``{node: decoded reply}``."""
        from flwr.app import Message

        msgs, order = [], []
        for nid, (method, msg) in jobs.items():
            payload = dict(msg)
            payload[_METHOD] = method
            msgs.append(Message(encode(payload), dst_node_id=nid, message_type=MESSAGE_TYPE))
            order.append(nid)
        out: dict[int, dict[str, Any]] = {}
        for rep, dst in self._push_pull(msgs, order, timeout):
            nid = dst if dst is not None else rep.metadata.src_node_id
            cid = self._cid_of.get(nid, f"node {nid}")
            if rep.has_error():
                self.lost[cid] = f"Flower error {rep.error.code}: {rep.error.reason}"
                logger.warning("client %s (node %s): %s", cid, nid, self.lost[cid])
                continue
            out[nid] = decode(rep.content)
            if _ERROR in out[nid]:
                text, kind = str(out[nid][_ERROR]), str(out[nid].get(_ERROR_TYPE, ""))
                if jobs.get(nid, ("",))[0] in _ROUND_METHODS:
                    # as in-process: the loop records the client as missing, with this text
                    out[nid] = {ERROR_KEY: f"{kind}: {text}" if kind else text}
                    logger.warning("client %s (node %s) failed: %s", cid, nid, text)
                    continue
                if kind == "DataValidationError":
                    raise DataValidationError(text)
                if self._describing and kind in ("ValueError", "TypeError"):
                    # the estimator's own check of the node's data: its message names the client
                    raise (ValueError if kind == "ValueError" else TypeError)(text)
                raise ClientReplyError(cid, text)
        return out

    def _push_pull(self, msgs, order, timeout):
        """Push, then pull replies until all arrived or ``timeout``: yields (reply, dst node).

        Grid.send_and_receive sleeps 3 s between pulls; polling from 20 ms up to 0.5 s saves
        seconds per exchange on a deployment.
        """
        ids = [str(i) for i in self.grid.push_messages(msgs)]
        dst_of = dict(zip(ids, order)) if len(ids) == len(order) else {}
        pending = set(ids)
        end = None if timeout is None else time.monotonic() + float(timeout)
        pause = 0.02
        while pending:
            for rep in self.grid.pull_messages(list(pending)):
                rid = str(rep.metadata.reply_to_message_id)
                if rid not in pending:
                    continue
                pending.discard(rid)
                yield rep, dst_of.get(rid)
            if not pending or (end is not None and time.monotonic() >= end):
                break
            time.sleep(pause)
            pause = min(0.5, pause * 1.5)

    def call(self, client_ids, method, messages):
        jobs = {self._node[c]: (method, messages[c]) for c in client_ids}
        if self.record:
            for c in client_ids:
                self.log.append(("down", c, method, dict(messages[c])))
        replies = self._exchange(jobs, self.round_timeout) if jobs else {}
        out = {self._cid_of[n]: r for n, r in replies.items()}
        for c in client_ids:
            if c not in out:
                self.lost.setdefault(c, f"no reply within {self.round_timeout:g} s")
            elif self.record:
                self.log.append(("up", c, method, dict(out[c])))
        return out


def run_config_for(estimator, *, out_dir, min_nodes: int, round_timeout: float = 120.0,
                   node_wait: float = 120.0, data_name: str = "", record: bool = False) -> dict:
    """The ``[tool.flwr.app.config]`` of a fit of ``estimator`` (all TOML scalars)."""
    from ..engine.registry import estimator_config

    name, params = estimator_config(estimator)
    fed = params.pop("federation", None)
    return {
        "estimator": name,
        "params": json.dumps(params),
        "federation": json.dumps(fed) if fed is not None else "",
        "min-nodes": int(min_nodes),
        "round-timeout": float(round_timeout),
        "node-wait": float(node_wait),
        "out-dir": str(Path(out_dir).resolve()),
        "data-name": str(data_name),
        "record": bool(record),
    }


def _write_json(path: Path, obj) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=float))
    os.replace(tmp, path)


def _save_log(out: Path, log) -> None:
    arrays, index = {}, []
    for i, (direction, cid, method, msg) in enumerate(log):
        keys = {}
        for k, v in msg.items():
            if isinstance(v, np.ndarray):
                arrays[f"{i}/{k}"] = v
                keys[k] = "array"
            else:
                keys[k] = v if isinstance(v, bool | int | float | str) else repr(v)
        index.append({"i": i, "direction": direction, "client": cid, "method": method,
                      "message": keys})
    np.savez(out / "messages.npz", **arrays)
    _write_json(out / "messages.json", index)


def run_server(grid, config: Mapping[str, Any]) -> None:
    """The server app's work: rebuild the estimator, fit it over the grid, save the result."""
    from ..data.remote import RemoteDataset
    from ..engine.registry import describe_message, estimator_from_config

    out = Path(str(config["out-dir"]))
    out.mkdir(parents=True, exist_ok=True)
    status: dict[str, Any] = {"status": "running", "error": None, "round": 0}
    _write_json(out / "status.json", status)
    t_start = time.perf_counter()
    rt = None
    try:
        params = json.loads(str(config["params"]))
        if str(config.get("federation", "")):
            params["federation"] = json.loads(str(config["federation"]))
        est = estimator_from_config(str(config["estimator"]), params)
        rt = FlowerRuntime(grid, describe_message(est), min_nodes=int(config["min-nodes"]),
                           node_wait=float(config.get("node-wait", 120.0)),
                           round_timeout=float(config.get("round-timeout", 120.0)),
                           record=bool(config.get("record", False)))
        status["startup_seconds"] = rt.startup_seconds
        status["clients"] = rt.client_ids
        rd = RemoteDataset.from_replies(rt.describe_replies)
        t_fit = time.perf_counter()

        def on_round(k, params, S_hat, record):
            status["round"] = int(k)
            _write_json(out / "status.json", status)
            logger.info("fedlatent round %d: objective %.6g, %d clients answered%s", k,
                        record.objective, record.participants,
                        f", missing {record.missing}" if record.missing else "")

        # a fault keeps the last good round in out-dir/checkpoint.npz
        est.fit(rd, runtime=rt, callbacks=[on_round], progress=False,
                checkpoint=out / "checkpoint", checkpoint_every=1)
        status["fit_seconds"] = time.perf_counter() - t_fit
        est.save(out / "model")
        hist = getattr(est, "history_", None)
        if hist is not None:
            hist.to_frame().to_csv(out / "history.csv", index=False)
            secs = [r.seconds for r in hist]
            status["seconds_per_round"] = float(np.mean(secs)) if secs else None
            status["rounds"] = len(secs)
        status["lost"] = dict(rt.lost)
        status["status"] = "ok"
    except BaseException as err:  # noqa: BLE001 - reported in status.json, then re-raised
        status["status"] = "error"
        status["error"] = f"{type(err).__name__}: {err}"
        raise
    finally:
        status["total_seconds"] = time.perf_counter() - t_start
        if rt is not None and rt.record:
            _save_log(out, rt.log)
        _write_json(out / "status.json", status)


def make_server_app(config: Mapping[str, Any] | None = None):
    """A ``ServerApp`` running :func:`run_server`; ``config`` (for simulations, which do not read
    the app's pyproject) is laid over ``context.run_config``."""
    from flwr.serverapp import ServerApp

    app = ServerApp()
    fixed = dict(config or {})

    @app.main()
    def main(grid, context) -> None:
        run_server(grid, {**dict(context.run_config), **fixed})

    return app


# ---------------------------------------------------------------------------------------------
# Client side
# ---------------------------------------------------------------------------------------------
_DATA_CACHE: dict[tuple[str, float], Any] = {}


def _load_node_data(path: Path):
    from ..data.files import read_client_file

    key = (str(path), path.stat().st_mtime if path.exists() else 0.0)
    if key not in _DATA_CACHE:
        _DATA_CACHE.clear()
        _DATA_CACHE[key] = read_client_file(path)
    return _DATA_CACHE[key]


def _node_data_path(context, paths: list[str] | None) -> Path:
    nc = dict(context.node_config)
    if "data-path" in nc:
        p = Path(str(nc["data-path"]))
        if p.is_dir():
            name = str(dict(context.run_config).get("data-name", ""))
            if not name:
                raise DataValidationError(
                    f"node data-path {str(p)!r} is a directory: give the app's data-name "
                    "(the file to use in it)"
                )
            p = p / name
        return p
    if paths is not None and "partition-id" in nc:
        return Path(paths[int(nc["partition-id"])])
    raise DataValidationError(
        "this Flower node has no data: start the supernode with --node-config "
        "'data-path=\"/path/to/client.parquet\"' (fedlatent flower partition writes the files)"
    )


def serve(fd, state, method: str, msg: dict[str, Any]) -> dict[str, Any]:
    """Answer one message on a node: ``fd`` is the node's one-client dataset, ``state`` Flower's
    ``context.state`` (a RecordDict) where the node's private state persists between messages."""
    from flwr.app import Array, ArrayRecord, ConfigRecord

    from ..engine.client import ClientNode

    (cid,) = fd.client_ids
    saved = {k: v.numpy() for k, v in state[_STATE].items()} if _STATE in state else {}
    node = ClientNode(cid, fd[cid], saved, source=fd)
    if method == "describe":
        return node.handle(method, msg)
    if method != "setup":
        if _MODEL not in state:
            raise RuntimeError(f"client {cid!r} got {method!r} before the model's setup")
        node.handle("setup", dict(state[_MODEL]))
    reply = node.handle(method, msg)
    if method == "setup":
        state[_MODEL] = ConfigRecord({"model": str(msg["model"]),
                                      "model_config": str(msg["model_config"])})
    state[_STATE] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in node.state.items()})
    return reply


def make_client_app(paths: list[str] | None = None):
    """A ``ClientApp`` answering fedlatent messages. ``paths`` (simulation): the data file of
    each partition id; in a deployment the node's ``data-path`` names it."""
    from flwr.app import Message
    from flwr.clientapp import ClientApp

    app = ClientApp()
    paths = [str(p) for p in paths] if paths is not None else None

    @app.query("fedlatent")
    def handle(msg, context):
        try:
            d = decode(msg.content)
            method = str(d.pop(_METHOD))
            fd = _load_node_data(_node_data_path(context, paths))
            reply = serve(fd, context.state, method, d)
        except Exception as err:  # noqa: BLE001 - sent back, raised on the server
            logger.exception("fedlatent client error")
            reply = {_ERROR: str(err), _ERROR_TYPE: type(err).__name__}
        return Message(encode(reply), reply_to=msg)

    return app


# ---------------------------------------------------------------------------------------------
# Results and simulation
# ---------------------------------------------------------------------------------------------
def load_result(out_dir):
    """The estimator a server app fitted and saved in ``out_dir`` (raises its error if it
    failed)."""
    from ..engine.checkpoint import load_arrays_json
    from ..engine.registry import estimator_by_class_name

    out = Path(out_dir)
    st_path = out / "status.json"
    if not st_path.exists():
        raise RuntimeError(f"{out} has no status.json: the Flower server app did not start")
    status = json.loads(st_path.read_text())
    if status.get("status") != "ok":
        raise RuntimeError(f"the Flower run failed: {status.get('error') or status}")
    _, meta = load_arrays_json(out / "model")
    cls = estimator_by_class_name(str(meta["class"]))
    if cls is None:
        raise RuntimeError(f"{out} holds a model of unknown class {meta['class']!r}")
    est = cls.load(out / "model")
    est.flower_status_ = status
    return est


def simulate(estimator, fd, *, workdir=None, round_timeout: float = 600.0, record: bool = False,
             num_cpus: int | None = None, verbose: bool = False):
    """Fit ``estimator`` on ``fd`` with Flower's simulation engine (one supernode per client).

    Each client's rows are written to its own file in ``workdir`` (a temporary directory,
    removed afterwards, by default) and read only by that client's node. Returns the fitted
    estimator loaded from what the server app saved; ``est.flower_status_`` has the timings
    (``startup_seconds``, ``seconds_per_round``, ``total_seconds``).
    """
    import tempfile

    from flwr.simulation import run_simulation

    from ..data.files import write_client_files

    if workdir is None:  # the client files and results are loaded, then removed
        with tempfile.TemporaryDirectory(prefix="fedlatent-") as tmp:
            return simulate(estimator, fd, workdir=tmp, round_timeout=round_timeout,
                            record=record, num_cpus=num_cpus, verbose=verbose)
    work = Path(workdir)
    files = write_client_files(fd, work / "data")
    out = work / "out"
    config = run_config_for(estimator, out_dir=out, min_nodes=fd.n_clients,
                            round_timeout=round_timeout, record=record)
    ncpu = int(num_cpus or os.cpu_count() or 1)
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
               "init_args": {"num_cpus": ncpu, "include_dashboard": False,
                             "log_to_driver": bool(verbose)}}
    t0 = time.perf_counter()
    run_simulation(server_app=make_server_app(config),
                   client_app=make_client_app([str(files[c]) for c in fd.client_ids]),
                   num_supernodes=fd.n_clients, backend_config=backend,
                   verbose_logging=bool(verbose))
    est = load_result(out)
    est.flower_status_["wall_seconds"] = time.perf_counter() - t0
    return est


#: The components a Flower app directory names (``fedlatent flower app`` writes it).
server_app = None
client_app = None
try:  # only with the flower extra installed
    server_app = make_server_app()
    client_app = make_client_app()
except ImportError:  # pragma: no cover - flwr missing
    pass
