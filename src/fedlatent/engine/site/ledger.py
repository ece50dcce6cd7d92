"""The site's ledger: an append-only, hash-chained record of what left the site.

One JSON object per line in ``<site directory>/ledger.jsonl``; every line carries ``prev``, the
sha256 of the line before it (64 zeros for the first), so an edited, removed or reordered line
breaks the chain (:meth:`Ledger.verify`). The ledger lives beside the site's restorable state
(:mod:`fedlatent.engine.node.site_state`), never in it: restoring a state or resuming a fit does not
roll it back.

Entries (``kind``):

``plan``      a run's plan, fixed at its first setup (model, disclosure, privacy: epsilon,
              delta, planned releases, noise multiplier, accountant)
``release``   one differential-privacy release, written before the reply leaves (run,
              exchange, round, mechanism, noise multiplier, epsilon after it, records touched)
``answer``    an exchange answered (run, exchange, round, the question's digest, masked or not)
``refusal``   a message refused (rule and the one-line reason)
``replay``    a question asked again, answered with the recorded answer (no new release)
``secagg-keys`` a secure-aggregation key set-up (its label: a second one is refused)
``sec-model`` a SEC model the site evaluated in a run (its sha256 and signer: the quota)

Everything a site must remember across messages is here, never in a process: on Flower every
message is answered by a fresh ClientApp process.

The chain shows an edited, removed or reordered line. A ledger cut after a line would look
whole, so every append also rewrites an **anchor**, ``<site directory>/ledger.head.json``: the
number of lines and the sha256 of the last one, signed with the site's Ed25519 key when the site
has one (``[site] signing-key``; the purpose ``"ledger-head"``). Reading a ledger checks its
anchor: a truncated ledger (fewer lines than the anchor says), a missing anchor beside a
ledger, a missing ledger beside its anchor, an anchor edited or (with a key) not signed by the
site are refused.

What cannot be seen from inside the site directory is the directory replaced as a whole: deleted,
or restored from a backup taken before a fit (its old anchor carries the site's own signature).
A **witness** sees it: a copy of the anchor kept outside the site directory (``[site] witness``,
a directory on another volume; one file per site directory in it), rewritten at every append.
A ledger with fewer lines than its witness records, or whose line at the witness's count is not
the one the witness names, is refused (:func:`check_witness`). Without a witness, restoring a
backup of the site directory resets the budgets it keeps: ``fedlatent site report`` says so.

:meth:`Ledger.lifetime_epsilon` composes the releases of every run on a data set with the
accountant (:mod:`fedlatent.engine.privacy.accountant`): Gaussian releases with noise
multipliers ``z_i`` compose to one Gaussian mechanism with ``z = (sum_i 1/z_i^2)^(-1/2)``.
Recorded answers of unmasked exchanges (so that a re-asked question gets the same noise, never
fresh noise), with the node's state after each, are kept in ``<site directory>/answers/``
(signed with the site's key when it has one).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["GENESIS", "HEAD_FILE", "LEDGER_FILE", "Ledger", "LedgerError", "check_witness",
           "compose_epsilon", "ledger_witness", "read_ledger", "witness_path"]

LEDGER_FILE = "ledger.jsonl"
#: the anchor: line count and last sha256, signed by the site (see the module docstring)
HEAD_FILE = "ledger.head.json"
HEAD_PURPOSE = "ledger-head"
GENESIS = "0" * 64

logger = logging.getLogger(__name__)


class LedgerError(ValueError):
    """The ledger's chain is broken (a line was edited, removed or reordered)."""


def _sha(line: str) -> str:
    return hashlib.sha256(line.encode("utf-8")).hexdigest()


def compose_epsilon(runs: list[tuple[float, int]], delta: float, accountant: str = "pld") -> float:
    """Epsilon at ``delta`` of ``runs``, ``(noise_multiplier, releases)`` each, composed."""
    from fedlatent.engine.privacy.accountant import composed_epsilon

    inv = sum(k / (z * z) for z, k in runs if k > 0)
    if inv <= 0:
        return 0.0
    return float(composed_epsilon(1.0 / math.sqrt(inv), 1, float(delta), accountant=accountant))


class Ledger:
    """The ledger of one site.

    Parameters
    ----------
    directory : path or None
        The site directory (created if needed); None: kept in memory (a node that lives in
        this process only).
    site : str
        The site's name, written with every entry.
    keys : SiteKeys or None
        The site's signing key: it signs the anchor and its public key verifies it on reading
        (None: an unsigned anchor, which still shows a cut ledger unless it is rewritten too).
    witness : path or None
        A directory outside the site directory where a copy of the anchor is kept
        (:func:`witness_path`): a site directory restored from a backup is refused.
    """

    def __init__(self, directory: str | Path | None, site: str, keys=None, witness=None):
        self.directory = None if directory is None else Path(directory)
        self.site = str(site)
        self.keys = keys
        self.witness = (None if witness is None or self.directory is None
                        else witness_path(witness, self.directory))
        self.entries: list[dict[str, Any]] = []
        self._last = GENESIS
        self._answers: dict[str, dict[str, Any]] = {}
        if self.directory is None:
            return
        if self.path.exists():
            self.entries = read_ledger(self.path, keys=keys)
            self._last = self.entries[-1]["_sha"] if self.entries else GENESIS
        elif (self.directory / HEAD_FILE).exists():
            raise LedgerError(
                f"ledger {self.path} is missing while its anchor {HEAD_FILE} is there: the "
                "ledger was deleted, and with it the record of what left the site (its "
                "budgets would start again at zero); restore it from a copy, or, to start a "
                "new site on purpose, remove the whole site directory")
        if self.witness is not None:
            check_witness(self.witness, self.path, self.entries)

    @property
    def path(self) -> Path:
        assert self.directory is not None
        return self.directory / LEDGER_FILE

    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Write one entry (flushed and synced to disk before returning)."""
        entry = {"seq": len(self.entries) + 1, "time": round(time.time(), 3),
                 "site": self.site, "kind": str(kind), **fields, "prev": self._last}
        line = json.dumps(entry, sort_keys=True, separators=(",", ":"), default=str)
        if self.directory is not None:
            self.directory.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        self._last = _sha(line)
        entry["_sha"] = self._last
        self.entries.append(entry)
        if self.directory is not None:
            write_head(self.directory, self.site, len(self.entries), self._last, self.keys,
                       witness=self.witness)
            if self.witness is not None:
                write_head(self.witness.parent, self.site, len(self.entries), self._last,
                           self.keys, name=self.witness.name)
        return entry

    # ---- queries -------------------------------------------------------------------------
    def of(self, kind: str, **match: Any) -> list[dict[str, Any]]:
        """Entries of ``kind`` whose fields equal ``match``."""
        return [e for e in self.entries if e["kind"] == kind
                and all(e.get(k) == v for k, v in match.items())]

    def plan(self, run: str) -> dict[str, Any] | None:
        """The plan fixed at ``run``'s first setup, or None."""
        plans = self.of("plan", run=run)
        return plans[0] if plans else None

    def releases(self, run: str) -> int:
        """Releases ``run`` has made (whatever the site's restorable state says)."""
        return len(self.of("release", run=run))

    def spent_runs(self, dataset: str) -> list[tuple[float, int]]:
        """``(noise multiplier, releases made)`` of every run on ``dataset``."""
        out = []
        for plan in self.of("plan", dataset=dataset):
            priv = plan.get("privacy")
            if priv:
                out.append((float(priv["noise_multiplier"]), self.releases(plan["run"])))
        return out

    def lifetime_epsilon(self, dataset: str, delta: float,
                         extra: list[tuple[float, int]] = ()) -> float:
        """Epsilon at ``delta`` of every release on ``dataset`` (and ``extra``), composed."""
        return compose_epsilon(self.spent_runs(dataset) + list(extra), delta)

    def _own(self):
        """``(signer, roster of its own key)`` of a site with a key, else ``(None, None)``."""
        if self.keys is None:
            return None, None
        from fedlatent.engine.site.keys import Roster, SiteIdentity

        return (SiteIdentity(self.keys, site=self.site),
                Roster({self.site: self.keys.public_key}))

    # ---- recorded answers ----------------------------------------------------------------
    def keep_answer(self, key: str, reply: dict[str, Any]) -> None:
        """Keep the reply of a private exchange (re-asked, it is sent again as it was)."""
        self._answers[key] = dict(reply)
        if self.directory is None:
            return
        from fedlatent.engine.fedem.checkpoint import save_arrays_json

        arrays = {k: np.asarray(v) for k, v in reply.items() if isinstance(v, np.ndarray)}
        rest = {k: v for k, v in reply.items() if not isinstance(v, np.ndarray)}
        (self.directory / "answers").mkdir(parents=True, exist_ok=True)
        save_arrays_json(self.directory / "answers" / key, arrays, {"rest": rest},
                         signer=self._own()[0])

    def answer(self, key: str) -> dict[str, Any] | None:
        """The reply kept under ``key``, or None."""
        if key not in self._answers and self.directory is not None:
            from fedlatent.engine.fedem.checkpoint import load_arrays_json

            base = self.directory / "answers" / key
            if base.with_suffix(".json").exists():  # signed by the site when it has a key
                arrays, meta = load_arrays_json(base, trust=self._own()[1])
                self._answers[key] = {**arrays, **dict(meta.get("rest", {}))}
        got = self._answers.get(key)
        return None if got is None else dict(got)


def _head_statement(site: str, seq: int, sha: str) -> tuple[str, dict[str, Any], bytes]:
    return HEAD_PURPOSE, {"site": str(site), "seq": int(seq)}, bytes.fromhex(sha)


def witness_path(witness: str | Path, directory: Path) -> Path:
    """The witness file of site directory ``directory`` in witness directory ``witness``
    (named by the site directory's resolved path: one witness directory serves many sites)."""
    where = str(Path(directory).resolve())
    return Path(witness) / f"witness-{hashlib.sha256(where.encode()).hexdigest()[:24]}.json"


def check_witness(witness: Path, path: Path, entries: list[dict[str, Any]]) -> None:
    """Raise :class:`LedgerError` when ledger ``path`` (its ``entries``) is behind its witness
    (the site directory restored from a backup, or the ledger replaced); a witness not there
    yet is started at the next append."""
    if not witness.exists():
        if entries:
            logger.warning("ledger %s: its witness %s does not exist yet; it starts now (a "
                           "backup restored before this point cannot be seen)", path, witness)
        return
    try:
        head = json.loads(witness.read_text(encoding="utf-8"))
        seq, sha = int(head["seq"]), str(head["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LedgerError(f"ledger {path}: its witness {witness} is unreadable ({err})") from err
    if seq > len(entries) or (seq and entries[seq - 1]["_sha"] != sha):
        raise LedgerError(
            f"ledger {path}: it holds {len(entries)} line(s), its witness {witness} (kept "
            f"outside the site directory) records {seq} ending in {sha[:12]}...: the site "
            "directory was restored from a backup or replaced, which would reset its budgets; "
            "put the newest site directory back (or, to start a new site on purpose, remove "
            "the witness file too)")


def write_head(directory: Path, site: str, seq: int, sha: str, keys=None,
               name: str = HEAD_FILE, witness: Path | None = None) -> None:
    """Rewrite the anchor (atomically: a temporary file renamed over it); ``witness``: where
    its copy outside the site directory is kept (recorded for ``fedlatent site report``)."""
    head = {"format": "fedlatent-ledger-head/1", "site": str(site), "seq": int(seq),
            "sha256": sha, "signature": "", "witness": "" if witness is None else str(witness)}
    if keys is not None:
        head["signature"] = base64.b64encode(keys.sign(*_head_statement(site, seq, sha))).decode()
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / (name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(head, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, directory / name)


def check_head(path: Path, entries: list[dict[str, Any]], keys=None) -> None:
    """Raise :class:`LedgerError` unless the anchor beside ledger ``path`` counts its lines and
    names its last line's sha256 (and, with ``keys``, carries the site's signature of both)."""
    where = path.parent / HEAD_FILE
    if not where.exists():
        if entries:
            raise LedgerError(f"ledger {path}: its anchor {where.name} is missing, so a cut "
                              "ledger cannot be told from a whole one; restore the site "
                              "directory from a copy")
        return
    try:
        head = json.loads(where.read_text(encoding="utf-8"))
        seq, sha = int(head["seq"]), str(head["sha256"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise LedgerError(f"ledger {path}: its anchor {where.name} is unreadable ({err})") from err
    last = entries[-1]["_sha"] if entries else GENESIS
    if seq != len(entries) or sha != last:
        raise LedgerError(
            f"ledger {path}: it holds {len(entries)} line(s), its anchor records {seq} ending "
            f"in {sha[:12]}...: the ledger was truncated (or its anchor replaced)")
    if keys is not None:
        _check_head_signature(path, head, keys)


def _check_head_signature(path: Path, head: dict[str, Any], keys) -> None:
    from fedlatent.engine.site.keys import AuthenticationError, Roster

    site = str(head.get("site", ""))
    try:
        sig = base64.b64decode(str(head.get("signature", "")), validate=True)
        Roster({site or "site": keys.public_key}).verify(
            site or "site", sig, *_head_statement(site, int(head["seq"]), str(head["sha256"])),
            what=f"the anchor of ledger {path}")
    except (AuthenticationError, ValueError) as err:
        raise LedgerError(f"ledger {path}: its anchor is not signed by the site's key ({err}); "
                          "the ledger or its anchor was replaced") from err


def ledger_witness(directory: str | Path) -> Path | None:
    """The witness file the anchor beside the ledger in ``directory`` names, or None (the
    ledger has none: a restored backup of its site directory would go unseen)."""
    try:
        head = json.loads((Path(directory) / HEAD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    where = str(head.get("witness") or "") if isinstance(head, dict) else ""
    return Path(where) if where else None


def read_ledger(path: str | Path, *, keys=None) -> list[dict[str, Any]]:
    """Every entry of a ledger file, the chain verified (:class:`LedgerError` naming the first
    line that breaks it) and its anchor checked (:func:`check_head`: a cut ledger is refused;
    with the site's ``keys``, so is an anchor it did not sign)."""
    path = Path(path)
    entries, last = [], GENESIS
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            line = line.rstrip("\n")
            try:
                entry = json.loads(line)
            except ValueError as err:
                raise LedgerError(f"ledger {path}, line {n}: not JSON ({err})") from err
            if not isinstance(entry, dict) or entry.get("prev") != last:
                raise LedgerError(
                    f"ledger {path}, line {n}: the hash chain is broken (its 'prev' is not the "
                    "sha256 of the line before); the ledger was edited, truncated or reordered")
            last = _sha(line)
            entry["_sha"] = last
            entries.append(entry)
    check_head(path, entries, keys)
    return entries
