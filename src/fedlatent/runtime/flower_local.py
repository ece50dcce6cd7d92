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

Every process is started in its own session and gets an environment tag; on exit the deployment
stops supernodes first, then the superlink (SIGTERM, then SIGKILL after a grace period), and then
any process still carrying the tag (the SuperExec and app processes Flower starts detached).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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

APP_COMPONENTS = {
    "serverapp": "fedlatent.runtime.flower:server_app",
    "clientapp": "fedlatent.runtime.flower:client_app",
}
APP_NAME = "fedlatent-app"
APP_PUBLISHER = "fedlatent"
CONNECTION_NAME = "fedlatent-local"
ENV_TAG = "FEDLATENT_FLOWER_DEPLOYMENT"
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_LOG_TAIL_CHARS = 3000


# --------------------------------------------------------------------------------------------
# TOML writing (the standard library only reads TOML)
# --------------------------------------------------------------------------------------------


def _toml_key(key: str) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"TOML keys must be non-empty strings; got {key!r}")
    return key if _BARE_KEY.match(key) else _toml_string(key)


def _toml_string(value: str) -> str:
    # JSON string escapes (\" \\ \n \t \r \b \f \u00XX) are all valid TOML basic-string
    # escapes; TOML additionally forbids a raw DEL character.
    if any(0xD800 <= ord(c) <= 0xDFFF for c in value):
        raise ValueError(f"string {value!r} holds a lone surrogate; TOML cannot encode it")
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def toml_value(value: Any) -> str:
    """One TOML scalar: a bool, int, float or str (the types a Flower run config accepts).

    >>> toml_value('{"k": [1, 2]}')
    '"{\\\\"k\\\\": [1, 2]}"'
    >>> toml_value(0.5), toml_value(True), toml_value(3)
    ('0.5', 'true', '3')
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    raise TypeError(
        f"run config values must be bool, int, float or str; got {type(value).__name__} "
        f"({value!r}): encode structures as a JSON string"
    )


def _toml_table(name: str, values: Mapping[str, Any]) -> str:
    lines = [f"[{name}]"]
    for key, value in values.items():
        if isinstance(value, list):
            rendered = "[" + ", ".join(toml_value(v) for v in value) + "]"
        else:
            rendered = toml_value(value)
        lines.append(f"{_toml_key(key)} = {rendered}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# The app directory
# --------------------------------------------------------------------------------------------

_APP_README = """\
# fedlatent Flower app

Written by `fedlatent.runtime.flower_local.write_app` (or `fedlatent flower app`).

This app carries no code: its components are

- server: `{serverapp}`
- client: `{clientapp}`

so **fedlatent must already be installed** (with the Flower extra: `pip install
"fedlatent[flower]"`) in the environment of the SuperLink and of every SuperNode.
`[project].dependencies` is empty on purpose; start the SuperLink with
`--disable-runtime-dependency-installation` (machines without internet access would
otherwise fail the run with code 608 while trying to install them).

Each SuperNode names its data file, one Parquet file per client written by
`fedlatent flower partition`:

    flower-supernode --insecure --superlink HOST:PORT --port 9094 \\
        --node-config 'data-path="/abs/path/client.parquet"'

Run with `flwr run <this directory> <connection> --stream`. `flwr run` exits 0 even when the
server app failed: read `status.json` in the `out-dir` of `[tool.flwr.app.config]`.
"""


def write_app(
    out_dir: str | os.PathLike,
    run_config: Mapping[str, Any],
    *,
    components: Mapping[str, str] | None = None,
) -> Path:
    """Write a runnable Flower app directory whose ``[tool.flwr.app.config]`` is ``run_config``.

    Parameters
    ----------
    out_dir : path
        Directory to create (or reuse); ``pyproject.toml`` and ``README.md`` go there.
    run_config : mapping of str to bool, int, float or str
        The app's run configuration, e.g. from ``fedlatent.runtime.flower.run_config_for``.
    components : mapping, optional
        ``{"serverapp": "module:object", "clientapp": ...}``; fedlatent's by default.

    Returns
    -------
    Path
        ``out_dir``.
    """
    for key, value in run_config.items():
        _toml_key(key)
        toml_value(value)  # raises TypeError on anything but a TOML scalar
    components = dict(APP_COMPONENTS if components is None else components)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    from .. import __version__

    parts = [
        "# Written by fedlatent.runtime.flower_local.write_app. fedlatent must be installed\n"
        "# on the SuperLink and on every SuperNode (see README.md).\n",
        _toml_table(
            "project",
            {
                "name": APP_NAME,
                "version": __version__,
                "description": "fedlatent federated latent-variable model on Flower",
                "license": "BSD-3-Clause",
                "dependencies": [],
            },
        ),
        _toml_table("tool.flwr.app", {"publisher": APP_PUBLISHER}),
        _toml_table("tool.flwr.app.components", components),
        _toml_table("tool.flwr.app.config", dict(run_config)),
    ]
    (out / "pyproject.toml").write_text("\n".join(parts), encoding="utf-8")
    (out / "README.md").write_text(_APP_README.format(**components), encoding="utf-8")
    return out


def read_app_config(app_dir: str | os.PathLike) -> dict[str, Any]:
    """The ``[tool.flwr.app.config]`` table of an app directory."""
    path = Path(app_dir) / "pyproject.toml"
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; write the app with write_app first")
    with path.open("rb") as f:
        doc = tomllib.load(f)
    return dict(doc.get("tool", {}).get("flwr", {}).get("app", {}).get("config", {}))


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now (held together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One TCP port free on ``host`` right now."""
    return free_ports(1, host)[0]


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc: trust os.kill
    return stat[stat.rfind(")") + 2 :][:1] not in ("Z", "X")


def _tagged_pids(token: str) -> list[int]:
    """PIDs of live processes whose environment holds ``ENV_TAG=token`` (Linux /proc)."""
    needle = f"{ENV_TAG}={token}".encode()
    own = os.getpid()
    found = []
    proc = Path("/proc")
    if not proc.is_dir():
        return found
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return sorted(found)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(pids: Sequence[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    left = [p for p in pids if pid_alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if pid_alive(p)]
    return left


def _tail(path: Path, chars: int = _LOG_TAIL_CHARS) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-chars:]


def _flower_exe(name: str) -> str:
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(
            f"{name!r} not found beside {sys.executable} nor on PATH; install the Flower extra: "
            'pip install "fedlatent[flower]"'
        )
    return found


class LocalDeployment:
    """A Flower SuperLink and one SuperNode per data file, all on 127.0.0.1.

    Parameters
    ----------
    data_paths : list of path
        One data file per SuperNode, passed as ``--node-config 'data-path="<abs path>"'``.
    workdir : path
        Where the processes' logs (``superlink.log``, ``supernode-<i>.log``) and private
        ``FLWR_HOME`` directories go.
    env : mapping, optional
        Extra environment variables for every process.
    startup_timeout : float
        Seconds to wait for the SuperLink's health and every SuperNode's registration.
    stop_timeout : float
        Grace seconds after SIGTERM before SIGKILL.

    Attributes
    ----------
    pids, node_pids : list of int
        PIDs this object started (the SuperLink first), and those of the SuperNodes only.
    address : str
        ``host:port`` of the SuperLink (Fleet, Control and Runtime APIs share one HTTP port).
    startup_seconds : float
        Wall time from starting the SuperLink until every SuperNode had registered.
    superlink_seconds : float
        The part of it until the SuperLink answered its health check.
    last_run_seconds, last_status : float, dict
        Wall time of the last :func:`run_app` to finish on this deployment and its status.
    """

    def __init__(
        self,
        data_paths: Sequence[str | os.PathLike],
        *,
        workdir: str | os.PathLike,
        env: Mapping[str, str] | None = None,
        host: str = "127.0.0.1",
        startup_timeout: float = 90.0,
        stop_timeout: float = 10.0,
    ) -> None:
        self.data_paths = [Path(p).resolve() for p in data_paths]
        self.workdir = Path(workdir).resolve()
        self.extra_env = dict(env or {})
        self.host = host
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self.token = uuid.uuid4().hex
        self.port: int | None = None
        self.node_ports: list[int] = []
        self.startup_seconds: float | None = None
        self.superlink_seconds: float | None = None
        self.last_run_seconds: float | None = None
        self.last_status: dict[str, Any] | None = None
        self._link: subprocess.Popen | None = None
        self._nodes: list[subprocess.Popen] = []
        self._seen: set[int] = set()  # every tagged PID ever observed
        self._logs: list[Path] = []
        self._stopped = False
        self._runs = itertools.count()  # numbers the logs of runs, also of concurrent ones

    # -- properties ---------------------------------------------------------------------------

    @property
    def address(self) -> str:
        if self.port is None:
            raise RuntimeError("the deployment has not been started")
        return f"{self.host}:{self.port}"

    @property
    def flwr_home(self) -> Path:
        """FLWR_HOME of the SuperLink and of ``flwr run`` (each SuperNode has its own)."""
        return self.workdir / "flwr-home"

    @property
    def pids(self) -> list[int]:
        return ([self._link.pid] if self._link else []) + self.node_pids

    @property
    def node_pids(self) -> list[int]:
        return [p.pid for p in self._nodes]

    @property
    def log_paths(self) -> list[Path]:
        return list(self._logs)

    def all_pids(self) -> list[int]:
        """Every PID started for this deployment and seen so far, Flower's own children too."""
        self._seen.update(_tagged_pids(self.token))
        return sorted(self._seen | set(self.pids))

    def env(self, flwr_home: Path | None = None) -> dict[str, str]:
        """The environment of the deployment's processes (and of ``flwr run``)."""
        env = dict(os.environ)
        for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, "1")  # many small processes share few cores
        # SuperExec looks for a message to start a ClientApp/ServerApp process every second by
        # default; on loopback a shorter poll shortens every exchange at a negligible cost.
        env.setdefault("FLWR_SUPEREXEC_TASK_POLL_INTERVAL", "0.2")
        env.update(self.extra_env)
        env["FLWR_TELEMETRY_ENABLED"] = "0"
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
        env["FLWR_HOME"] = str(flwr_home or self.flwr_home)
        env[ENV_TAG] = self.token
        bindir = str(Path(sys.executable).parent)  # Flower starts flower-superexec by name
        env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
        return env

    # -- start --------------------------------------------------------------------------------

    def _spawn(self, cmd: list[str], log: Path, flwr_home: Path) -> subprocess.Popen:
        flwr_home.mkdir(parents=True, exist_ok=True)
        self._logs.append(log)
        with log.open("ab") as f:
            return subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=self.env(flwr_home),
                cwd=self.workdir,
                start_new_session=True,
            )

    def _fail_start(self, what: str, log: Path) -> None:
        raise RuntimeError(f"{what}; last lines of {log}:\n{_tail(log)}")

    def start(self) -> LocalDeployment:
        """Start the SuperLink, wait for its health, then start and wait for every SuperNode."""
        if self._link is not None:
            raise RuntimeError("the deployment is already started")
        if not self.data_paths:
            raise ValueError("a deployment needs at least one data path (one per SuperNode)")
        for p in self.data_paths:
            if '"' in str(p) or "'" in str(p):
                raise ValueError(f"data path {p} holds a quote; Flower's --node-config cannot")
        self.workdir.mkdir(parents=True, exist_ok=True)
        ports = free_ports(1 + len(self.data_paths), self.host)
        self.port, self.node_ports = ports[0], ports[1:]
        t0 = time.monotonic()
        try:
            self._start_superlink(t0)
            self.superlink_seconds = time.monotonic() - t0
            self._start_supernodes(t0)
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - t0
        logger.info(
            "Flower deployment on %s: SuperLink healthy in %.1f s, %d SuperNodes registered "
            "%.1f s later",
            self.address, self.superlink_seconds, len(self._nodes),
            self.startup_seconds - self.superlink_seconds,
        )
        return self

    def _start_superlink(self, t0: float) -> None:
        log = self.workdir / "superlink.log"
        cmd = [
            _flower_exe("flower-superlink"), "--insecure",
            "--disable-runtime-dependency-installation",
            "--host", self.host, "--port", str(self.port),
        ]
        self._link = self._spawn(cmd, log, self.flwr_home)
        url = f"http://{self.address}/health"
        while True:
            if self._link.poll() is not None:
                self._fail_start(f"flower-superlink exited with code {self._link.returncode}", log)
            try:
                with urllib.request.urlopen(url, timeout=1.0) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() - t0 > self.startup_timeout:
                self._fail_start(
                    f"flower-superlink not healthy at {url} after {self.startup_timeout:.0f} s", log
                )
            time.sleep(0.1)

    def _start_supernodes(self, t0: float) -> None:
        logs = []
        for i, (path, port) in enumerate(zip(self.data_paths, self.node_ports)):
            log = self.workdir / f"supernode-{i}.log"
            cmd = [
                _flower_exe("flower-supernode"), "--insecure",
                "--superlink", self.address,
                "--host", self.host, "--port", str(port),
                "--node-config", f"data-path={_toml_string(str(path))}",
            ]
            self._nodes.append(self._spawn(cmd, log, self.workdir / f"supernode-{i}" / "flwr-home"))
            logs.append(log)
        waiting = set(range(len(self._nodes)))
        while waiting:
            for i in sorted(waiting):
                node = self._nodes[i]
                if node.poll() is not None:
                    self._fail_start(f"flower-supernode {i} exited with code {node.returncode}",
                                     logs[i])
                if "SuperNode ID:" in _tail(logs[i], 100_000):
                    waiting.discard(i)
            if waiting and time.monotonic() - t0 > self.startup_timeout:
                i = min(waiting)
                self._fail_start(
                    f"flower-supernode {i} did not register within {self.startup_timeout:.0f} s",
                    logs[i],
                )
            if waiting:
                time.sleep(0.1)

    # -- stop ---------------------------------------------------------------------------------

    def kill_node(self, i: int) -> int:
        """SIGKILL SuperNode ``i`` and its process group (a crash); return its PID."""
        node = self._nodes[i]
        self._seen.update(_tagged_pids(self.token))
        _signal_group(node.pid, signal.SIGKILL)
        node.wait()
        return node.pid

    def _stop_group(self, procs: list[subprocess.Popen]) -> None:
        live = [p for p in procs if p.poll() is None]
        for p in live:
            _signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for p in live:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            _signal_group(p.pid, signal.SIGKILL)  # leftovers of the group, or the leader
            try:
                p.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                logger.warning("process %d did not exit after SIGKILL", p.pid)

    def stop(self) -> None:
        """Stop SuperNodes, then the SuperLink, then any process left with this deployment's tag.

        Safe to call twice; it runs on ``__exit__`` whatever the exception.
        """
        if self._stopped:
            return
        self._stopped = True
        self._seen.update(_tagged_pids(self.token))
        self._stop_group(self._nodes)
        if self._link is not None:
            self._stop_group([self._link])
        # Flower starts SuperExec and app processes detached (own session); they watch their
        # parent and exit soon after it, but do not rely on it.
        self._seen.update(_tagged_pids(self.token))
        left = _wait_gone(sorted(self._seen), 3.0)
        for pid in left:
            _signal_group(pid, signal.SIGTERM)
        left = _wait_gone(left, self.stop_timeout)
        for pid in left:
            _signal_group(pid, signal.SIGKILL)
        left = _wait_gone(left + _tagged_pids(self.token), self.stop_timeout)
        if left:
            logger.warning("Flower processes %s are still running after SIGKILL", left)

    def __enter__(self) -> LocalDeployment:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------------------------
# flwr run
# --------------------------------------------------------------------------------------------


def _write_connection(deployment: LocalDeployment) -> None:
    home = deployment.flwr_home
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text(
        _toml_table("superlink", {"default": CONNECTION_NAME})
        + "\n"
        + _toml_table(
            f"superlink.{CONNECTION_NAME}", {"address": deployment.address, "insecure": True}
        ),
        encoding="utf-8",
    )


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

    Raises
    ------
    RuntimeError
        The run timed out, or the server app's ``status.json`` does not say ``"ok"`` (the
        message holds the server's error and the end of the logs).
    """
    app_dir = Path(app_dir).resolve()
    config = read_app_config(app_dir)
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(config))
    if unknown:
        raise ValueError(
            f"run-config overrides {unknown} are not in the app's [tool.flwr.app.config] "
            f"(keys: {sorted(config)})"
        )
    config.update(overrides)
    if "out-dir" not in config:
        raise ValueError(f"the app's run config has no 'out-dir' (keys: {sorted(config)})")
    out_dir = Path(config["out-dir"])
    status_path = out_dir / "status.json"
    if status_path.exists():
        status_path.unlink()  # a previous run's status must not be mistaken for this one's

    _write_connection(deployment)
    n = next(deployment._runs)
    log = deployment.workdir / f"flwr-run-{n}.log"
    cmd = [_flower_exe("flwr"), "run", str(app_dir), CONNECTION_NAME, "--stream"]
    if overrides:
        ov = deployment.workdir / f"overrides-{n}.toml"
        ov.write_text(
            "".join(f"{_toml_key(k)} = {toml_value(v)}\n" for k, v in overrides.items()),
            encoding="utf-8",
        )
        cmd += ["--run-config", str(ov)]
    t0 = time.monotonic()
    with log.open("ab") as f:
        proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
            env=deployment.env(), cwd=deployment.workdir, start_new_session=True,
        )
    deployment._seen.add(proc.pid)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop_run(deployment, log)
        raise RuntimeError(
            f"the Flower run did not finish within {timeout:.0f} s; "
            f"{_describe(out_dir, deployment, log)}"
        ) from None
    finally:
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
    seconds = time.monotonic() - t0
    status = _read_status(out_dir)
    if proc.returncode != 0 or status is None or status.get("status") != "ok":
        reason = (
            f"flwr run exited with code {proc.returncode}" if proc.returncode != 0
            else "the server app wrote no status.json" if status is None
            else f"the server app reported status {status.get('status')!r}: {status.get('error')}"
        )
        raise RuntimeError(f"Flower run failed: {reason}; {_describe(out_dir, deployment, log)}")
    logger.info("Flower run finished in %.1f s (%s rounds)", seconds, status.get("round"))
    deployment.last_run_seconds = seconds
    deployment.last_status = status
    return out_dir


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
    else:
        run_config = flower.run_config_for(
            estimator_or_run_config, out_dir=str(out_dir),
            min_nodes=len(data_paths) if min_nodes is None else min_nodes,
            round_timeout=round_timeout, node_wait=node_wait, data_name=data_name,
        )
    app_dir = write_app(workdir / "app", run_config)
    with LocalDeployment(data_paths, workdir=workdir, env=env) as dep:
        run_app(app_dir, dep, overrides=overrides, timeout=timeout)
    est = flower.load_result(out_dir)
    est.flower_deployment_ = {
        "startup_seconds": dep.startup_seconds,
        "run_seconds": dep.last_run_seconds,
        "pids": dep.all_pids(),
        "workdir": str(workdir),
    }
    return est

