"""A site's private state, kept on the site itself between rounds and after the run.

On a deployment each site (a Flower SuperNode) holds its private state (FedGMM's ``pi_c``, HLCR's
labels and counts, control variates, SPIDER memory: the flat dict of a
:class:`~fedlatent.engine.node.client.ClientNode`) in its *site directory*. After every round it
takes part in, the site writes the state as one entry: ``state-<seq>.npz`` (the arrays) and
``state-<seq>.json`` (the client id, the round, the run it belongs to and the sha256 of the
``.npz``), each written atomically, the JSON last (:func:`~fedlatent.engine.fedem.checkpoint.
save_arrays_json`). The newest :data:`KEEP` entries of the run are kept (a server that stopped
may have checkpointed one round behind its sites); entries of another run are removed when a new
run writes its first one, so a site directory holds one run's state.

Two uses:

- **prediction at the site** after the run: :func:`read_site_state` gives the newest entry, and a
  model with per-site state predicts with it (``FedGMM.load_site_state(directory)``, or
  ``fedlatent predict --model RESULT --site-state DIR --data SITE_FILE``); :func:`check_run`
  refuses a state written by a fit of another model or other settings;
- **resuming** a deployed run: the server's checkpoint is at round ``r``; every site goes back to
  its newest entry of that run written at a round ``<= r`` (``read_site_state(at_most_round=r,
  run_key=...)``), which is the state the uninterrupted run had there.

Everything is read with ``allow_pickle=False`` and verified against its sha256. A sha256 is a
checksum anyone editing the files can recompute: a site with a signing key signs every entry
(``write_site_state(..., signer=identity)``), and ``read_site_state(..., trust=roster)`` then
refuses an entry that is unsigned, signed by a key the roster does not hold, or edited since.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedlatent.engine.fedem.checkpoint import load_arrays_json, save_arrays_json

__all__ = ["KEEP", "SiteState", "check_run", "read_site_state", "run_key", "write_site_state"]

#: entries of one run a site keeps (the newest ones)
KEEP = 3
FORMAT = 1
_ENTRY = re.compile(r"^state-(\d{6,})\.json$")


@dataclass(frozen=True)
class SiteState:
    """One entry of a site directory.

    Attributes
    ----------
    client_id : str
        The client the site holds.
    state : dict of str to ndarray
        The node's private state (``model/...``, ``V/...``, ``spider_S/...``).
    round : int
        The round after which it was written.
    run : dict
        ``{"estimator": registry name, "params": the estimator's JSON parameters}`` of the fit.
    key : str
        :func:`run_key` of ``run``.
    path : Path
        The entry's ``.json``.
    """

    client_id: str
    state: dict[str, np.ndarray]
    round: int
    run: dict[str, Any]
    key: str
    path: Path


def run_key(run: Mapping[str, Any]) -> str:
    """A short fingerprint of a run description (estimator name and parameters)."""
    text = json.dumps(run, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _entries(directory: Path) -> list[tuple[int, Path]]:
    """``(seq, json path)`` of every entry in ``directory``, oldest first."""
    if not directory.is_dir():
        return []
    out = []
    for p in directory.iterdir():
        m = _ENTRY.match(p.name)
        if m:
            out.append((int(m.group(1)), p))
    return sorted(out)


def _meta(path: Path) -> dict[str, Any] | None:
    try:
        meta = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) and meta.get("format") == FORMAT else None


def _remove(json_path: Path) -> None:
    for p in (json_path, json_path.with_suffix(".npz")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()


def write_site_state(directory: str | Path, *, client_id: str, state: Mapping[str, np.ndarray],
                     round_: int, run: Mapping[str, Any], signer=None) -> Path:
    """Write one entry of ``client_id``'s private ``state`` after round ``round_`` of ``run``
    into ``directory`` (created if needed); returns the entry's ``.json``. With ``signer``
    (the site's :class:`~fedlatent.engine.site.keys.SiteIdentity`) the entry is signed.

    Keeps the :data:`KEEP` newest entries of this run and removes those of other runs.
    """
    directory = Path(directory)
    key = run_key(run)
    entries = _entries(directory)
    seq = entries[-1][0] + 1 if entries else 1
    arrays = {str(k): np.asarray(v) for k, v in state.items()}
    meta = {"format": FORMAT, "client_id": str(client_id), "round": int(round_),
            "run": dict(run), "run_key": key, "keys": sorted(arrays)}
    prefix = directory / f"state-{seq:06d}"
    save_arrays_json(prefix, arrays, meta, signer=signer)
    mine = []
    for _, p in entries:
        m = _meta(p)
        if m is not None and m.get("run_key") == key and m.get("client_id") == str(client_id):
            mine.append(p)
        else:
            _remove(p)  # another run's (or an unreadable) entry
    for p in mine[: max(0, len(mine) - (KEEP - 1))]:
        _remove(p)
    return prefix.with_suffix(".json")


def read_site_state(directory: str | Path, *, at_most_round: int | None = None,
                    run_key: str | None = None, trust=None) -> SiteState:
    """The newest entry of a site directory (of the run ``run_key`` and written at a round
    ``<= at_most_round`` when given), verified against its sha256 and, with ``trust`` (a
    pinned :class:`~fedlatent.engine.site.keys.Roster`), against a rostered site's signature.

    Raises
    ------
    FileNotFoundError
        ``directory`` holds no entry (or none of the run / round asked for); the message says
        where and what to do.
    ValueError
        The entry is damaged (its ``.npz`` does not match its sha256, its metadata is not
        fedlatent's).
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(
            f"site state directory {directory} does not exist; give the directory the site "
            "named in its node config (site-dir), by default <its data file>.site beside it")
    entries = _entries(directory)
    if not entries:
        raise FileNotFoundError(
            f"site state directory {directory} holds no state-*.json entry; the site wrote none "
            "(it took part in no round of a deployed fit)")
    for _, path in reversed(entries):
        meta = _meta(path)
        if meta is None:
            raise ValueError(f"site state {path} is not readable fedlatent site state; delete it "
                             "and its .npz")
        if run_key is not None and meta.get("run_key") != run_key:
            continue
        if at_most_round is not None and int(meta.get("round", -1)) > int(at_most_round):
            continue
        arrays, meta = load_arrays_json(path.with_suffix(""), trust=trust)
        return SiteState(str(meta["client_id"]), arrays, int(meta["round"]),
                         dict(meta.get("run") or {}), str(meta.get("run_key", "")), path)
    what = [] if run_key is None else [f"of run {run_key}"]
    if at_most_round is not None:
        what.append(f"written at round <= {at_most_round}")
    raise FileNotFoundError(
        f"site state directory {directory} holds no entry {' '.join(what)}; the site's state of "
        "this run is lost: start the run afresh (without resume)")


def check_run(site: SiteState, name: str, params: Mapping[str, Any]) -> None:
    """Raise ValueError unless ``site`` was written by a fit of estimator ``name`` with
    ``params`` (:func:`fedlatent.engine.contract.registry.estimator_config`)."""
    got_name = site.run.get("estimator")
    if got_name != name:
        raise ValueError(
            f"site state {site.path} was written by a {got_name!r} fit, the model is a {name!r}; "
            "give the site directory of this model's deployment")
    want = json.loads(json.dumps(dict(params), sort_keys=True, default=str))
    got = json.loads(json.dumps(site.run.get("params", {}), sort_keys=True, default=str))
    if got != want:
        diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        raise ValueError(
            f"site state {site.path} was written by a fit with other settings ({', '.join(diff)}"
            " differ); give the site directory of the deployment that produced this model")
