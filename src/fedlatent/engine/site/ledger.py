"""The site's ledger: an append-only, hash-chained record of what left the site.

One JSON object per line in ``<site directory>/ledger.jsonl``; every line carries ``prev``, the
sha256 of the line before it (64 zeros for the first), so an edited, removed or reordered line
breaks the chain (:meth:`Ledger.verify`). The ledger lives beside the site's restorable state
(:mod:`fedlatent.engine.site_state`), never in it: restoring a state or resuming a fit does not
roll it back.

Entries (``kind``):

``plan``      a run's plan, fixed at its first setup (model, disclosure, privacy: epsilon,
              delta, planned releases, noise multiplier, accountant)
``release``   one differential-privacy release, written before the reply leaves (run,
              exchange, round, mechanism, noise multiplier, epsilon after it, records touched)
``answer``    an exchange answered (run, exchange, round, the question's digest, masked or not)
``refusal``   a message refused (rule and the one-line reason)
``replay``    a question asked again, answered with the recorded answer (no new release)

The chain shows an edited, removed or reordered line; a ledger cut after its last line looks
whole (keep a copy of the last line's sha256 elsewhere to detect that).

:meth:`Ledger.lifetime_epsilon` composes the releases of every run on a data set with the
accountant (:mod:`fedlatent.engine.privacy.accountant`): Gaussian releases with noise
multipliers ``z_i`` compose to one Gaussian mechanism with ``z = (sum_i 1/z_i^2)^(-1/2)``.
Recorded answers of private exchanges (so that a re-asked question gets the same noise, never
fresh noise) are kept in ``<site directory>/answers/``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["GENESIS", "LEDGER_FILE", "Ledger", "LedgerError", "compose_epsilon"]

LEDGER_FILE = "ledger.jsonl"
GENESIS = "0" * 64


class LedgerError(ValueError):
    """The ledger's chain is broken (a line was edited, removed or reordered)."""


def _sha(line: str) -> str:
    return hashlib.sha256(line.encode("utf-8")).hexdigest()


def compose_epsilon(runs: list[tuple[float, int]], delta: float, accountant: str = "pld") -> float:
    """Epsilon at ``delta`` of ``runs``, ``(noise_multiplier, releases)`` each, composed."""
    from ..privacy.accountant import composed_epsilon

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
    """

    def __init__(self, directory: str | Path | None, site: str):
        self.directory = None if directory is None else Path(directory)
        self.site = str(site)
        self.entries: list[dict[str, Any]] = []
        self._last = GENESIS
        self._answers: dict[str, dict[str, Any]] = {}
        if self.directory is not None and self.path.exists():
            self.entries = read_ledger(self.path)
            self._last = self.entries[-1]["_sha"] if self.entries else GENESIS

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

    # ---- recorded answers ----------------------------------------------------------------
    def keep_answer(self, key: str, reply: dict[str, Any]) -> None:
        """Keep the reply of a private exchange (re-asked, it is sent again as it was)."""
        self._answers[key] = dict(reply)
        if self.directory is None:
            return
        from ..checkpoint import save_arrays_json

        arrays = {k: np.asarray(v) for k, v in reply.items() if isinstance(v, np.ndarray)}
        rest = {k: v for k, v in reply.items() if not isinstance(v, np.ndarray)}
        (self.directory / "answers").mkdir(parents=True, exist_ok=True)
        save_arrays_json(self.directory / "answers" / key, arrays, {"rest": rest})

    def answer(self, key: str) -> dict[str, Any] | None:
        """The reply kept under ``key``, or None."""
        if key not in self._answers and self.directory is not None:
            from ..checkpoint import load_arrays_json

            base = self.directory / "answers" / key
            if base.with_suffix(".json").exists():
                arrays, meta = load_arrays_json(base)
                self._answers[key] = {**arrays, **dict(meta.get("rest", {}))}
        got = self._answers.get(key)
        return None if got is None else dict(got)


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """Every entry of a ledger file, the chain verified (:class:`LedgerError` naming the first
    line that breaks it)."""
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
    return entries
