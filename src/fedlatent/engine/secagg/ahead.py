"""The in-process set-up's X25519 agreements computed ahead in worker processes (``n_jobs``).

The in-process runtime holds every simulated site in one process, so its secure-aggregation
set-up runs every site's agreements (k per site, some 58% of the set-up) on one core, and
``cryptography``'s X25519 holds the GIL (threads give nothing). With ``n_jobs`` other than 1,
:class:`Ahead` forks ``jobs - 1`` worker processes when the roster step starts (Linux only):
each takes the sites from the end of the list, every ``jobs - 1``-th, and computes the shared
secrets of that site's private key with the keys its roster message lists, while this process
handles the sites a worker finished as they come and, when none is ready, the next one from
the start (:meth:`Ahead.order`). A worker writes a site's secrets, raw 32
bytes each, into a shared anonymous memory map (nothing pickled) and its place and own row, 8
bytes, into a pipe; a site this process reaches that a worker finished is offered them
(:meth:`~fedlatent.engine.secagg.enrol.Enrolment.offer_agreements`), and uses them only after
its own roster checks passed and only for exactly the peer keys the worker used; any other
site agrees as with one job. The workers stop where this process is, and are killed and
reaped when the step ends (also on an error).

What a worker computes is a pure function of a site's key and public keys: the transcript and
every site's state are those of one job, given the same keys (tested). A site's secrets land
only in its own object. The worker is a copy of this process (``fork``), which holds every
site's key already: no key is sent anywhere. An agreement with a key that a site's checks
later refuse is never used (a discarded Diffie-Hellman output reveals nothing); a key
``cryptography`` refuses (low order) leaves the site to this process, which refuses it as
with one job.
"""

from __future__ import annotations

import gc
import json
import logging
import mmap
import os
import signal
import struct
import sys
from collections.abc import Mapping, Sequence

import numpy as np

import fedlatent.engine.secagg._crypto as _crypto

__all__ = ["Ahead", "can_fork", "effective_jobs"]

log = logging.getLogger(__name__)

_POS = 8  # bytes at the map's start: the place this process has reached (int64)


def can_fork() -> bool:
    """Whether worker processes are forked here (Linux: ``os.fork`` with ``cryptography``'s
    state safe to copy); elsewhere the set-up runs in one process."""
    return sys.platform.startswith("linux") and hasattr(os, "fork")


def effective_jobs(n_jobs) -> int:
    """Processes for ``n_jobs`` by scikit-learn's convention (joblib's ``effective_n_jobs``:
    None or 1 one, -1 every core this process may use, -2 all but one; 0 refused)."""
    import joblib

    return int(joblib.effective_n_jobs(n_jobs))


def own_row(cid: str, msg: Mapping) -> int | None:
    """The row of site ``cid`` in its roster message's keys (None: not a roster listing it
    with one 32-byte key per member)."""
    try:
        members = json.loads(msg.get("members") or msg["ids"])
        rows = np.asarray(msg["enc_key"])
        me = members.index(cid)
    except (KeyError, TypeError, ValueError):
        return None
    return me if rows.dtype == np.uint8 and rows.shape == (len(members), 32) else None


def peer_keys(msg: Mapping, me: int) -> bytes:
    """The raw public keys, joined, of every row of a roster message's keys but row ``me``
    (the site's own), in the message's order: its peers, sorted."""
    rows = np.asarray(msg["enc_key"])
    return rows[:me].tobytes() + rows[me + 1:].tobytes()


def _rows_of(msg: Mapping) -> int:
    """The key rows of a roster message (0: none)."""
    rows = np.asarray(msg.get("enc_key"))
    return rows.shape[0] if rows.ndim == 2 else 0


class Ahead:
    """The agreements of one roster step ahead in ``jobs - 1`` forked workers (a context
    manager; with ``jobs`` 1, or where :func:`can_fork` is false, it does nothing).

    Parameters
    ----------
    ids : sequence of str
        The sites in the order this process handles them.
    clients : sequence
        Each site's :class:`~fedlatent.engine.secagg.client.SecAggClient` (None: none).
    messages : mapping of str to dict
        Each site's roster message.
    jobs : int
        Processes in all, this one included.
    """

    def __init__(self, ids: Sequence[str], clients: Sequence, messages: Mapping, jobs: int):
        self.ids, self.clients, self.messages = list(ids), list(clients), messages
        self.jobs = int(jobs) if can_fork() else 1
        self.pids: list[int] = []
        #: CPU seconds of the workers (user + system), once they are reaped
        self.worker_cpu = 0.0
        #: sites offered the workers' secrets
        self.taken = 0
        self._buf = self._read = None
        self._rest = b""
        self._ready: list[int] = []  # the sites reported finished, in the order reported
        self._done = np.zeros(len(self.ids), dtype=bool)
        sizes = [0 if c is None else max(0, _rows_of(messages[u]) - 1) * 32
                 for u, c in zip(self.ids, self.clients)] if self.jobs > 1 else []
        self._me = np.zeros(len(self.ids), dtype=np.int64)  # each site's own row, as reported
        self._at = np.concatenate([[_POS], _POS + np.cumsum(sizes)]).astype(np.int64) \
            if sizes else np.zeros(1, np.int64)

    def __enter__(self) -> Ahead:
        if self.jobs > 1 and len(self.ids) > 1:
            try:
                self._start()
            except OSError as err:  # no fork (limits, memory): the workers started are stopped
                self.stop()
                log.warning("secure aggregation set-up: no worker process (%s); its agreements "
                            "run in this process (1 job)", err)
            except BaseException:
                self.stop()
                raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> None:
        self._buf = mmap.mmap(-1, int(self._at[-1]))  # shared with the forked workers
        struct.pack_into("<q", self._buf, 0, -1)
        read, write = os.pipe()
        try:
            for r in range(self.jobs - 1):
                pid = os.fork()
                if pid == 0:  # the worker: never returns into the caller's stack
                    code = 1
                    try:
                        gc.disable()  # (a collection would touch, hence copy, every page)
                        os.close(read)
                        self._work(r, write)
                        code = 0
                    finally:
                        os._exit(code)
                self.pids.append(pid)
        finally:
            os.close(write)
            self._read = read
            os.set_blocking(read, False)
        log.debug("secure aggregation set-up: agreements ahead in %d worker processes %s",
                  len(self.pids), self.pids)

    def _work(self, r: int, out: int) -> None:
        """Worker ``r``: the sites ``n - 1 - r``, ``n - 1 - r - (jobs - 1)``, ... down to where
        this process has reached, each one's secrets into the map and its place into ``out``."""
        buf, step = self._buf, self.jobs - 1
        for i in range(len(self.ids) - 1 - r, -1, -step):
            if struct.unpack_from("<q", buf, 0)[0] >= i:
                return
            client, msg = self.clients[i], self.messages[self.ids[i]]
            me = None if client is None else own_row(self.ids[i], msg)
            keys = None if me is None else peer_keys(msg, me)
            if not keys or len(keys) != self._at[i + 1] - self._at[i]:
                continue
            try:
                shared = _crypto.agree_many(client._private, [
                    keys[j:j + 32] for j in range(0, len(keys), 32)])
            except Exception:  # noqa: BLE001 - a refused key: this process meets it itself
                continue
            buf[self._at[i]:self._at[i + 1]] = b"".join(shared)
            os.write(out, struct.pack("<II", i, me))

    def order(self):
        """The places of the sites in the order this process handles them: a site a worker
        finished whenever there is one (the last reported first), else the first site not
        handled yet, from the start (the workers then skip it and every one before). So this
        process agrees for a site itself only when no worker's is ready, and the two share the
        step's work evenly (without workers: the sites in order)."""
        n = len(self.ids)
        if self._buf is None:
            yield from range(n)
            return
        handled, front, ready = np.zeros(n, dtype=bool), 0, self._ready
        while front < n:
            self._drain()
            while ready and handled[ready[-1]]:
                ready.pop()
            if ready:
                i = ready.pop()
            else:
                i = front
                struct.pack_into("<q", self._buf, 0, i)
            handled[i] = True
            while front < n and handled[front]:
                front += 1
            yield i

    def offer(self, i: int) -> None:
        """Before this process handles site ``i`` (:meth:`order`): if a worker finished it,
        its client is offered the secrets."""
        if self._buf is None:
            return
        self._drain()
        client = self.clients[i]
        if self._done[i] and client is not None:  # (a wrong row: keys it never agrees to)
            self.taken += 1
            client.offer_agreements(peer_keys(self.messages[self.ids[i]], int(self._me[i])),
                                    self._buf[self._at[i]:self._at[i + 1]])

    def _drain(self) -> None:
        """Mark the sites the workers reported finished (their place and own row, 8 bytes
        each, read as they come)."""
        while True:
            try:
                got = self._rest + os.read(self._read, 1 << 16)
            except BlockingIOError:
                return
            if len(got) == len(self._rest):
                return
            whole = len(got) // 8 * 8  # (8-byte writes are atomic: kept whole in any case)
            done = np.frombuffer(got[:whole], dtype="<u4").reshape(-1, 2)
            self._done[done[:, 0]] = True
            self._me[done[:, 0]] = done[:, 1]
            self._ready += done[:, 0].tolist()
            self._rest = got[whole:]

    def stop(self) -> None:
        """Kill and reap the workers, close the pipe and the map (idempotent)."""
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in self.pids:
            try:
                _, _, use = os.wait4(pid, 0)
                self.worker_cpu += use.ru_utime + use.ru_stime
            except ChildProcessError:
                pass
        self.pids = []
        if self._read is not None:
            os.close(self._read)
            self._read = None
        if self._buf is not None:
            self._buf.close()
            self._buf = None
