"""Run a fedlatent Flower app on a real Flower deployment on this machine (loopback).

A deployment here is the same set of processes a multi-host federation runs, only all on
127.0.0.1: one ``flower-superlink`` and one ``flower-supernode`` per client data file, each
supernode told its file through ``--node-config 'data-path="..."'``. The app itself is a
directory holding only ``pyproject.toml`` (its run configuration) and a README: the code is
``fedlatent.runtime.flower``, which must already be installed beside every node.

>>> from fedlatent.runtime.flower_local import LocalDeployment, run_app, write_app
>>> app_dir = write_app("app", run_config)                      # doctest: +SKIP
>>> with LocalDeployment(paths, workdir="deploy") as dep:        # doctest: +SKIP
...     out_dir = run_app(app_dir, dep, timeout=600)

``flwr run`` exits 0 even when the server app failed, so :func:`run_app` judges the run by the
``status.json`` the server app writes into its ``out-dir``.

The processes of the deployment are managed in :mod:`fedlatent.runtime.flower_deployment` and
the app directory is written by :mod:`fedlatent.runtime.flower_app`; their names are importable
from here too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .flower_app import _APP_README as _APP_README
from .flower_app import _BARE_KEY as _BARE_KEY
from .flower_app import (
    APP_COMPONENTS,
    _toml_key,
    read_app_config,
    toml_value,
    write_app,
)
from .flower_app import APP_NAME as APP_NAME
from .flower_app import APP_PUBLISHER as APP_PUBLISHER
from .flower_app import _toml_string as _toml_string
from .flower_deployment import _LOG_TAIL_CHARS as _LOG_TAIL_CHARS
from .flower_deployment import ENV_TAG as ENV_TAG
from .flower_deployment import (
    LocalDeployment,
    _flower_exe,
    _signal_group,
    _tail,
    free_port,
    free_ports,
    pid_alive,
)
from .flower_deployment import _tagged_pids as _tagged_pids
from .flower_deployment import _wait_gone as _wait_gone

__all__ = [
    "APP_COMPONENTS",
    "CONNECTION_NAME",
    "LocalDeployment",
    "free_port",
    "free_ports",
    "local_fit",
    "pid_alive",
    "read_app_config",
    "run_app",
    "toml_value",
    "write_app",
]

logger = logging.getLogger(__name__)

CONNECTION_NAME = "fedlatent-local"


# --------------------------------------------------------------------------------------------
# flwr run
# --------------------------------------------------------------------------------------------


def _write_connection(deployment: LocalDeployment) -> None:
    deployment.write_connection(CONNECTION_NAME)  # over TLS when it has credentials


def _read_status(out_dir: Path) -> dict[str, Any] | None:
    try:
        return json.loads((out_dir / "status.json").read_text())
    except (OSError, ValueError):
        return None


def run_app(
    app_dir: str | os.PathLike,
    deployment: LocalDeployment,
    *,
    overrides: Mapping[str, Any] | None = None,
    timeout: float = 600.0,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    on_wait: Callable[[dict[str, Any] | None, float], None] | None = None,
    wait_every: float = 5.0,
) -> Path:
    """Run the app on a started deployment with ``flwr run --stream``; return its ``out-dir``.

    Parameters
    ----------
    app_dir : path
        Directory written by :func:`write_app`.
    deployment : LocalDeployment
        Started deployment.
    overrides : mapping, optional
        Run-config values replacing the app's (``flwr run -c``); every key must be in the app's
        ``[tool.flwr.app.config]``.
    timeout : float
        Seconds for the whole run; the run is stopped (``flwr stop``) when it runs over.
    on_round : callable, optional
        Called with the server app's ``status.json`` (a dict: ``round``, ``last`` = the round's
        objective, participants, missing clients and seconds) each time a round ends.
    on_wait : callable, optional
        Called with the server's status (None before it wrote one: ``exchanges`` counts the
        initialization's exchanges) and the seconds since the run started, every
        ``wait_every`` seconds without a new round: progress of the long first steps.

    Raises
    ------
    RuntimeError
        The run timed out, or the server app's ``status.json`` does not say ``"ok"`` (the
        message holds the server's error and the end of the logs).
    """
    app_dir = Path(app_dir).resolve()
    out_dir = _prepare_out_dir(read_app_config(app_dir), dict(overrides or {}))
    _write_connection(deployment)
    n = next(deployment._runs)
    log = deployment.workdir / f"flwr-run-{n}.log"
    cmd = _flwr_run_command(app_dir, deployment, dict(overrides or {}), n)
    t0 = time.monotonic()
    proc = _start_logged(cmd, deployment, log)
    try:
        _wait_reporting(proc, t0 + timeout, out_dir / "status.json", on_round, on_wait,
                        wait_every)
    except subprocess.TimeoutExpired:
        _stop_run(deployment, log)
        raise RuntimeError(
            f"the Flower run did not finish within {timeout:.0f} s; "
            f"{_describe(out_dir, deployment, log)}"
        ) from None
    finally:
        _end_process(proc)
    seconds = time.monotonic() - t0
    status = _outcome(proc.returncode, out_dir, deployment, log)
    logger.info("Flower run finished in %.1f s (%s rounds)", seconds, status.get("round"))
    deployment.last_run_seconds = seconds
    deployment.last_status = status
    return out_dir


def _prepare_out_dir(config: dict[str, Any], overrides: dict[str, Any]) -> Path:
    """The run's ``out-dir`` (the app's run config with ``overrides``), without a previous
    run's ``status.json``; ValueError for an override the app does not declare."""
    unknown = sorted(set(overrides) - set(config))
    if unknown:
        raise ValueError(
            f"run-config overrides {unknown} are not in the app's [tool.flwr.app.config] "
            f"(keys: {sorted(config)})"
        )
    config = {**config, **overrides}
    if "out-dir" not in config:
        raise ValueError(f"the app's run config has no 'out-dir' (keys: {sorted(config)})")
    out_dir = Path(config["out-dir"])
    status_path = out_dir / "status.json"
    if status_path.exists():
        status_path.unlink()  # a previous run's status must not be mistaken for this one's
    return out_dir


def _flwr_run_command(app_dir: Path, deployment: LocalDeployment, overrides: dict[str, Any],
                      n: int) -> list[str]:
    """``flwr run APP CONNECTION --stream``, with ``--run-config`` a file of ``overrides``."""
    cmd = [_flower_exe("flwr"), "run", str(app_dir), CONNECTION_NAME, "--stream"]
    if overrides:
        ov = deployment.workdir / f"overrides-{n}.toml"
        ov.write_text(
            "".join(f"{_toml_key(k)} = {toml_value(v)}\n" for k, v in overrides.items()),
            encoding="utf-8",
        )
        cmd += ["--run-config", str(ov)]
    return cmd


def _start_logged(cmd: list[str], deployment: LocalDeployment, log: Path) -> subprocess.Popen:
    """Start ``cmd`` in its own session, output appended to ``log``; the deployment stops it."""
    with log.open("ab") as f:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
            env=deployment.env(), cwd=deployment.workdir, start_new_session=True,
        )
    deployment._seen.add(proc.pid)
    return proc


def _end_process(proc: subprocess.Popen) -> None:
    """Stop ``proc``'s process group if it still runs: SIGTERM, then SIGKILL after 5 s."""
    if proc.poll() is not None:
        return
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait()


def _outcome(returncode: int, out_dir: Path, deployment: LocalDeployment,
             log: Path) -> dict[str, Any]:
    """The server app's status after ``flwr run`` exited (it exits 0 even when the app
    failed); RuntimeError with the reason and the end of the logs unless it says ``"ok"``."""
    status = _read_status(out_dir)
    if returncode != 0 or status is None or status.get("status") != "ok":
        reason = (
            f"flwr run exited with code {returncode}" if returncode != 0
            else "the server app wrote no status.json" if status is None
            else f"the server app reported status {status.get('status')!r}: {status.get('error')}"
        )
        raise RuntimeError(f"Flower run failed: {reason}; {_describe(out_dir, deployment, log)}")
    return status


def _wait_reporting(proc: subprocess.Popen, deadline: float, status_path: Path,
                    on_round: Callable[[dict[str, Any]], None] | None,
                    on_wait: Callable[[dict[str, Any] | None, float], None] | None = None,
                    wait_every: float = 5.0) -> None:
    """Wait for ``proc`` until ``deadline`` (TimeoutExpired after it), calling ``on_round``
    with the server's status each time its round advances, and ``on_wait`` (status, seconds
    since the start) every ``wait_every`` seconds without a new round."""
    seen = 0
    start = last = time.monotonic()
    while True:
        try:
            proc.wait(timeout=min(0.5, wait_every))
            finished = True
        except subprocess.TimeoutExpired:
            finished = False
        status = _read_status(status_path.parent)
        if on_round is not None and status is not None and int(status.get("round") or 0) > seen:
            seen = int(status["round"])
            on_round(status)
            last = time.monotonic()
        elif on_wait is not None and not finished and time.monotonic() - last >= wait_every:
            last = time.monotonic()
            on_wait(status, last - start)
        if finished:
            return
        if time.monotonic() >= deadline:
            raise subprocess.TimeoutExpired(proc.args, 0)


def _stop_run(deployment: LocalDeployment, log: Path) -> None:
    m = re.search(r"Successfully started run (\d+)", _tail(log, 100_000))
    if m is None:
        return
    try:
        subprocess.run(
            [_flower_exe("flwr"), "stop", m.group(1), CONNECTION_NAME],
            env=deployment.env(), cwd=deployment.workdir, timeout=30,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
    except (subprocess.TimeoutExpired, OSError):
        logger.warning("flwr stop %s did not finish", m.group(1))


def _describe(out_dir: Path, deployment: LocalDeployment, run_log: Path) -> str:
    status = _read_status(out_dir)
    parts = [f"status.json: {json.dumps(status) if status else 'missing'}"]
    for path in [run_log, *deployment.log_paths]:
        parts.append(f"--- last lines of {path} ---\n{_tail(path, 1500)}")
    return "\n".join(parts)


# --------------------------------------------------------------------------------------------
# One call
# --------------------------------------------------------------------------------------------


def local_fit(
    estimator_or_run_config: Any,
    data_paths: Sequence[str | os.PathLike],
    *,
    out_dir: str | os.PathLike,
    timeout: float = 600.0,
    workdir: str | os.PathLike | None = None,
    min_nodes: int | None = None,
    round_timeout: float = 120.0,
    node_wait: float = 120.0,
    data_name: str = "",
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    resume: bool = False,
    on_round: Callable[[dict[str, Any]], None] | None = None,
    policy_paths: Sequence[str | os.PathLike | None] | None = None,
    credentials=None,
) -> Any:
    """Fit on a loopback Flower deployment, one SuperNode per data file; return the estimator.

    Parameters
    ----------
    estimator_or_run_config : estimator or mapping
        An unfitted fedlatent estimator (its run config comes from
        ``fedlatent.runtime.flower.run_config_for``), or a ready run-config mapping.
    data_paths : list of path
        One client file per SuperNode (``fedlatent.data.files.write_client_files``).
    out_dir : path
        Where the server app writes ``status.json``, the model and ``history.csv``.
    workdir : path, optional
        Logs, app directory and Flower homes (default: ``out_dir / "deploy"``).
    min_nodes : int, optional
        Nodes the server waits for (default: all of ``data_paths``).
    env : mapping, optional
        Extra environment variables of every process.
    resume : bool
        Continue the run that stopped in ``out_dir`` (its server checkpoint) with the sites'
        states (each site's ``<data file stem>.site`` directory): ends as the uninterrupted run.
    on_round : callable, optional
        Called with the server's status after every round (see :func:`run_app`).
    policy_paths : list of path or None, optional
        A site policy file per SuperNode, its node config's ``policy-path``.
    credentials : Credentials, optional
        TLS and SuperNode authentication (:mod:`fedlatent.runtime.flower_credentials`);
        None: insecure, on loopback only.

    Returns
    -------
    estimator
        Loaded from ``out_dir`` by ``fedlatent.runtime.flower.load_result``, with
        ``flower_deployment_`` = ``{"startup_seconds", "run_seconds", "pids", "workdir"}``: the
        deployment's start-up time, the ``flwr run`` time and every PID it started (all stopped).
    """
    from . import flower

    out_dir = Path(out_dir).resolve()
    workdir = Path(workdir).resolve() if workdir is not None else out_dir / "deploy"
    if isinstance(estimator_or_run_config, Mapping):
        run_config = dict(estimator_or_run_config)
        run_config["out-dir"] = str(out_dir)
        run_config["resume"] = bool(resume)
    else:
        run_config = flower.run_config_for(
            estimator_or_run_config, out_dir=str(out_dir),
            min_nodes=len(data_paths) if min_nodes is None else min_nodes,
            round_timeout=round_timeout, node_wait=node_wait, data_name=data_name, resume=resume,
        )
    app_dir = write_app(workdir / "app", run_config)
    with LocalDeployment(data_paths, workdir=workdir, env=env, policy_paths=policy_paths,
                         credentials=credentials) as dep:
        run_app(app_dir, dep, overrides=overrides, timeout=timeout, on_round=on_round)
    est = flower.load_result(out_dir)
    est.flower_deployment_ = {
        "startup_seconds": dep.startup_seconds,
        "run_seconds": dep.last_run_seconds,
        "pids": dep.all_pids(),
        "workdir": str(workdir),
    }
    return est

