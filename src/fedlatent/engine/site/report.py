"""What a site can see for itself: its ledger as a table, and a summary per run.

``fedlatent site ledger DIR`` prints :func:`ledger_rows`; ``fedlatent site report DIR`` prints
:func:`report_rows` (per run: exchanges answered, releases and the epsilon they spent, the
rules that refused something, refusals) and the lifetime epsilon of every data set. Both read
the ledger with its chain verified (:func:`~fedlatent.engine.site.ledger.read_ledger`).
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

from fedlatent.engine.site.ledger import (
    HEAD_FILE,
    LEDGER_FILE,
    LedgerError,
    check_witness,
    compose_epsilon,
    ledger_witness,
    read_ledger,
)

__all__ = ["LEDGER_COLUMNS", "REPORT_COLUMNS", "backup_note", "format_table", "ledger_entries",
           "ledger_rows", "lifetime_rows", "report_rows"]

LEDGER_COLUMNS = ("seq", "time (UTC)", "kind", "run", "exchange", "round", "detail")
REPORT_COLUMNS = ("run", "data set", "model", "exchanges", "releases", "epsilon", "refusals",
                  "rules that refused")


def ledger_entries(where: str | Path) -> list[dict[str, Any]]:
    """The entries of the ledger in site directory ``where`` (or the ledger file itself),
    checked against its witness when it has one."""
    path = Path(where)
    if path.is_dir():
        path = path / LEDGER_FILE
    if not path.exists():
        if (path.parent / HEAD_FILE).exists():
            raise LedgerError(f"ledger {path} is missing while its anchor {HEAD_FILE} is "
                              "there: the ledger was deleted (its budgets would start again)")
        raise FileNotFoundError(f"no ledger {path}: a site writes it in its site directory "
                                "(the policy's site.directory, or the node's site-dir)")
    entries = read_ledger(path)
    witness = ledger_witness(path.parent)
    if witness is not None:
        check_witness(witness, path, entries)
    return entries


def backup_note(where: str | Path) -> str:
    """What ``fedlatent site report`` says about restoring a backup of the site directory."""
    path = Path(where)
    witness = ledger_witness(path if path.is_dir() else path.parent)
    if witness is None:
        return ("note: this ledger has no witness outside its site directory: restoring a "
                "backup of the site directory resets its budgets and answers, and nothing "
                "shows it (set [site] witness in the site policy)")
    return f"witness: {witness} (a copy of the anchor outside the site directory: checked)"


def _detail(e: dict[str, Any]) -> str:
    kind = e["kind"]
    if kind == "release":
        return (f"{e['mechanism']} z={e['noise_multiplier']:.4g} release {e['release']}/"
                f"{e['planned']} eps_run={e['epsilon_run']:.4g} delta={e['delta']:g} "
                f"records={e['records']}")
    if kind == "refusal":
        return f"[{e.get('rule')}] {e.get('reason', '')}"
    if kind == "plan":
        p = e.get("privacy")
        dp = ("no DP" if not p else f"DP eps={p['epsilon']:g} delta={p['delta']:g} "
              f"releases={p['releases']}")
        return f"model={e.get('model')} {dp}"
    if kind == "answer":
        return "masked" if e.get("masked") else "clear"
    if kind == "replay":
        return "re-asked: the recorded answer sent again (no new release)"
    return ""


def _cell(v: Any) -> str:
    return "" if v is None else str(v)


def ledger_rows(entries: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per entry, in :data:`LEDGER_COLUMNS`."""
    return [(str(e["seq"]), time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(e["time"])),
             e["kind"], _cell(e.get("run")), _cell(e.get("exchange")), _cell(e.get("round")),
             _detail(e)) for e in entries]


def report_rows(entries: list[dict[str, Any]]) -> list[tuple[str, ...]]:
    """One row per run, in :data:`REPORT_COLUMNS` (refusals before any setup under "-")."""
    runs: dict[str, dict[str, Any]] = {}
    for e in entries:
        r = runs.setdefault(_cell(e.get("run")) or "-", {"dataset": "", "model": "",
                                                         "answers": Counter(), "releases": [],
                                                         "refusals": 0, "rules": Counter()})
        r["dataset"] = r["dataset"] or _cell(e.get("dataset"))
        if e["kind"] == "plan":
            r["model"] = _cell(e.get("model"))
        elif e["kind"] in ("answer", "replay"):  # a replay: the recorded answer, sent again
            r["answers"][e.get("exchange")] += e["kind"] == "answer"
        elif e["kind"] == "release":
            r["releases"].append(e)
        elif e["kind"] == "refusal":
            r["refusals"] += 1
            for rule in e.get("rules") or [e.get("rule")]:
                r["rules"][rule] += 1
    rows = []
    for run, r in runs.items():
        ex = ", ".join(f"{k} x{n}" for k, n in sorted(r["answers"].items()))
        rel = r["releases"]
        eps = f"{rel[-1]['epsilon_run']:.4g}" if rel else "0"
        rules = ", ".join(f"{k} x{n}" for k, n in sorted(r["rules"].items()))
        rows.append((run, r["dataset"], r["model"], ex or "-",
                     f"{len(rel)}/{rel[-1]['planned']}" if rel else "0", eps,
                     str(r["refusals"]), rules or "-"))
    return rows


def trust_note(entries: list[dict[str, Any]]) -> str | None:
    """What ``site report`` says of the runs set up with neither differential privacy nor
    verified secure aggregation (None: there are none): they trusted the server with the
    site's records (a server that crafts the parameters can rebuild them from the replies)."""
    runs = [_cell(e.get("run")) for e in entries if e["kind"] == "plan"
            and not e.get("privacy") and not e.get("verified")]
    if not runs:
        return None
    shown = ", ".join(runs[:10]) + (f" and {len(runs) - 10} more" if len(runs) > 10 else "")
    return (f"note: {len(runs)} run(s) had neither differential privacy nor verified secure "
            f"aggregation ({shown}): they trusted the server with this site's records (a "
            "server that crafts the parameters it sends can rebuild them from the replies). "
            "Require one with [privacy] required = true or \"dp-or-verified\".")


def lifetime_rows(entries: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """``(data set, releases, epsilon at the largest delta released)`` composed over runs."""
    by: dict[str, dict[str, list]] = {}
    for e in entries:
        if e["kind"] == "release":
            d = by.setdefault(_cell(e.get("dataset")), {})
            d.setdefault(e["run"], []).append(e)
    out = []
    for ds, runs in sorted(by.items()):
        pairs = [(float(v[0]["noise_multiplier"]), len(v)) for v in runs.values()]
        delta = max(float(v[0]["delta"]) for v in runs.values())
        out.append((ds, str(sum(k for _, k in pairs)),
                    f"{compose_epsilon(pairs, delta):.4g} (delta={delta:g})"))
    return out


def format_table(columns: tuple[str, ...], rows: list[tuple[str, ...]], width: int = 60) -> str:
    """A plain-text table (cells cut to ``width`` characters with an ellipsis)."""
    cut = [tuple(c if len(c) <= width else c[: width - 1] + "…" for c in row) for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cut]) for i, h in enumerate(columns)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(columns, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cut]
    return "\n".join(lines)
