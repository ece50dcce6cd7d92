"""The processes of a loopback Flower deployment: a SuperLink and one SuperNode per data file.

With ``credentials`` (:mod:`fedlatent.runtime.flower_credentials`) the deployment runs as a real
one should: TLS between every SuperNode and the SuperLink, and Flower's SuperNode authentication
(the SuperLink admits only the SuperNodes whose public keys were registered with ``flwr
supernode register``). Without them it runs insecure, on loopback only, and says so.

Every process is started in its own session and gets an environment tag; on exit the deployment
stops supernodes first, then the superlink (SIGTERM, then SIGKILL after a grace period), and then
any process still carrying the tag (the SuperExec and app processes Flower starts detached).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .flower_app import _toml_string, _toml_table

__all__ = ["LocalDeployment", "free_port", "free_ports", "pid_alive"]

logger = logging.getLogger(__name__)

ENV_TAG = "FEDLATENT_FLOWER_DEPLOYMENT"
#: the ``flwr`` connection the deployment registers its SuperNodes through
_REGISTRAR = "fedlatent-local"
_LOG_TAIL_CHARS = 3000


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
    policy_paths : list of path or None, optional
        A site policy file per SuperNode (None: none for that node), passed as its node
        config's ``policy-path`` (:mod:`fedlatent.engine.site`).
    credentials : Credentials, optional
        TLS and SuperNode authentication (one node key per data file); None: insecure (a
        warning is logged: only for loopback).

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
        policy_paths: Sequence[str | os.PathLike | None] | None = None,
        credentials=None,
    ) -> None:
        if credentials is not None and len(credentials.node_keys) < len(data_paths):
            raise ValueError(f"{len(data_paths)} SuperNodes need as many node keys; the "
                             f"credentials hold {len(credentials.node_keys)}")
        self.credentials = credentials
        self.data_paths = [Path(p).resolve() for p in data_paths]
        self.policy_paths = [None if p is None else Path(p).resolve()
                             for p in (policy_paths or [None] * len(self.data_paths))]
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

    def write_connection(self, name: str) -> None:
        """Write ``FLWR_HOME/config.toml`` with connection ``name`` (the default) to this
        deployment's SuperLink: over TLS trusting its CA, or insecure without credentials."""
        how = ({"root-certificates": str(self.credentials.ca)} if self.credentials is not None
               else {"insecure": True})
        self.flwr_home.mkdir(parents=True, exist_ok=True)
        (self.flwr_home / "config.toml").write_text(
            _toml_table("superlink", {"default": name}) + "\n"
            + _toml_table(f"superlink.{name}", {"address": self.address, **how}),
            encoding="utf-8")

    def _security(self, node: int | None = None) -> list[str]:
        """The TLS and authentication flags of the SuperLink (``node`` None) or a SuperNode."""
        c = self.credentials
        if c is None:
            return ["--insecure"]
        if node is None:
            return ["--ssl-ca-certfile", str(c.ca), "--ssl-certfile", str(c.server_cert),
                    "--ssl-keyfile", str(c.server_key), "--enable-supernode-auth"]
        return ["--root-certificates", str(c.ca),
                "--auth-supernode-private-key", str(c.node_keys[node])]

    def _register_supernodes(self) -> None:
        """``flwr supernode register`` every SuperNode's public key (authentication on)."""
        self.write_connection(_REGISTRAR)
        procs = [subprocess.Popen(  # at once: each flwr process takes seconds to start
            [_flower_exe("flwr"), "supernode", "register", str(self.credentials.node_public(i)),
             _REGISTRAR], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=self.env(), cwd=self.workdir) for i in range(len(self.data_paths))]
        for i, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=self.startup_timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                out, _ = p.communicate()
            if p.returncode != 0:
                raise RuntimeError(f"flwr supernode register of SuperNode {i} failed "
                                   f"(code {p.returncode}): {out[-2000:]}")

    def _health(self, url: str) -> bool:
        import ssl

        ctx = None
        if self.credentials is not None:
            ctx = ssl.create_default_context(cafile=str(self.credentials.ca))
        try:
            with urllib.request.urlopen(url, timeout=1.0, context=ctx) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def _start_superlink(self, t0: float) -> None:
        log = self.workdir / "superlink.log"
        cmd = [
            _flower_exe("flower-superlink"), *self._security(),
            "--disable-runtime-dependency-installation",
            "--host", self.host, "--port", str(self.port),
        ]
        if self.credentials is None:
            logger.warning("Flower deployment on %s without TLS or SuperNode authentication "
                           "(loopback only; give credentials for anything else)", self.address)
        self._link = self._spawn(cmd, log, self.flwr_home)
        scheme = "http" if self.credentials is None else "https"
        url = f"{scheme}://{self.address}/health"
        while True:
            if self._link.poll() is not None:
                self._fail_start(f"flower-superlink exited with code {self._link.returncode}", log)
            if self._health(url):
                if self.credentials is not None:
                    self._register_supernodes()
                return
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
                _flower_exe("flower-supernode"), *self._security(i),
                "--superlink", self.address,
                "--host", self.host, "--port", str(port),
                "--node-config", f"data-path={_toml_string(str(path))}" + (
                    "" if self.policy_paths[i] is None
                    else f" policy-path={_toml_string(str(self.policy_paths[i]))}"),
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
