"""Per-round history: one small record per round."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

__all__ = ["RoundRecord", "History"]


@dataclass
class RoundRecord:
    """What happened in one round.

    Attributes
    ----------
    round : int
        1-based round index. Round 1 is the initialization E-step (every client, uncompressed).
    objective : float
        Mean per-unit objective (log-likelihood) at the parameters broadcast this round, over the
        clients that answered. Under ``Federation(acceleration="newton")`` the round's statistic
        is the plain EM step of the point accepted the round before; the extra points' objectives
        are not recorded (the fit ends on the EM step of the best point evaluated, whose
        objective is at least every recorded one).
    h_norm2 : float or None
        ``||h(S)||^2`` after the round's update, when tracked.
    bytes_up, bytes_down : int
        Bytes sent by clients and to clients this round.
    participants : int
        Clients whose reply was aggregated.
    step_size : float
    seconds : float
    missing : list of str
        Clients that were asked but did not answer (treated as not taking part), including
        those that raised (their exception text is in ``errors``).
    rejected : dict of str to str
        Clients whose reply was malformed (a block missing, a wrong shape, a non-finite or
        non-numeric value) or broke its model's invariants (negative counts, units claimed
        other than set up, a moment matrix not positive semi-definite...), with the reason;
        nothing of their reply was aggregated. A reason starting ``evaluate:`` concerns the
        ``track_h`` evaluation (left out of ``h_norm2`` only).
    errors : dict of str to str
        Clients that raised during the round, with the exception's type and text
        (``evaluate:`` first when it was in the ``track_h`` evaluation).
    epsilon : float or None
        Under differential privacy, the epsilon spent by the fit up to and including this
        round (initialization included; at the setting's delta), the accountant's figure.
        None without it.
    skipped : str
        Why the round was skipped ("" when it ran): under secure aggregation, a draw of fewer
        clients than the threshold; nothing was exchanged, the parameters were kept, and the
        round counts toward ``max_rounds``.
    stat_change : float or None
        How much the server statistic moved this round, per unit step:
        ``max_b ||S_k[b] - S_{k-1}[b]|| / (gamma_k max(||S_k[b]||, 1e-8 max_b' ||S_k[b']||))``
        over the statistic's blocks ``b`` (None in round 1). The stopping rule of fits that
        are not plain EM reads it (:class:`fedlatent.engine.rounds.loop.LoopOptions`).
    """

    round: int
    objective: float
    h_norm2: float | None
    bytes_up: int
    bytes_down: int
    participants: int
    step_size: float
    seconds: float
    missing: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    epsilon: float | None = None
    skipped: str = ""
    stat_change: float | None = None


def _as_reasons(value) -> dict[str, str]:
    """``{client: reason}`` from a dict, its JSON text (a frame or CSV), or nothing (histories
    saved before the column existed)."""
    if isinstance(value, dict):
        return {str(k): str(v) for k, v in value.items()}
    if isinstance(value, str) and value.strip():
        loaded = json.loads(value)
        if not isinstance(loaded, dict):
            raise ValueError(f"a history's reasons must be a JSON object, got {value!r}")
        return {str(k): str(v) for k, v in loaded.items()}
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return {}
    raise ValueError(f"a history's reasons must be a dict or its JSON text, got {value!r}")


class History(list):
    """A list of :class:`RoundRecord` with a DataFrame view.

    Attributes
    ----------
    excluded : dict of str to str
        The sites left out of the fit at its setup (they refused it by a rule), with the
        refusal; ``to_frame()`` carries it in ``DataFrame.attrs["excluded"]``.
    adopted : dict
        The disclosure floors the sites announced at setup that raised the fit's policy:
        ``{"disclosure": the policy in force, "raised": {setting: [sites]}}`` (empty when the
        server's policy was already at least as strict; ``attrs["adopted"]`` of ``to_frame()``).
    """

    def __init__(self, *args):
        super().__init__(*args)
        self.excluded: dict[str, str] = {}
        self.adopted: dict = {}

    def to_frame(self):
        rows = [asdict(r) for r in self]
        for r in rows:
            r["missing"] = ";".join(r["missing"])
            r["rejected"] = json.dumps(r["rejected"], sort_keys=True)
            r["errors"] = json.dumps(r["errors"], sort_keys=True)
        cols = list(RoundRecord.__dataclass_fields__)
        import pandas as pd

        frame = pd.DataFrame(rows, columns=cols)
        frame.attrs["excluded"] = dict(self.excluded)
        frame.attrs["adopted"] = dict(self.adopted)
        return frame

    def to_csv(self, path) -> None:
        self.to_frame().to_csv(path, index=False)

    @property
    def objective(self) -> list[float]:
        return [r.objective for r in self]

    @classmethod
    def from_records(cls, rows: list[dict]) -> History:
        h = cls()
        for r in rows:
            r = dict(r)
            m = r.get("missing") or []
            r["missing"] = m.split(";") if isinstance(m, str) and m else list(m) if m else []
            r["rejected"] = _as_reasons(r.get("rejected"))
            r["errors"] = _as_reasons(r.get("errors"))
            s = r.get("skipped")  # histories saved before the column: ""
            r["skipped"] = s if isinstance(s, str) else ""
            h.append(RoundRecord(**r))
        return h
