"""Per-round history: one small record per round."""

from __future__ import annotations

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
        clients that answered.
    h_norm2 : float or None
        ``||h(S)||^2`` after the round's update, when tracked.
    bytes_up, bytes_down : int
        Bytes sent by clients and to clients this round.
    participants : int
        Clients whose reply was aggregated.
    step_size : float
    seconds : float
    missing : list of str
        Clients that were asked but did not answer (treated as not taking part).
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


class History(list):
    """A list of :class:`RoundRecord` with a DataFrame view."""

    def to_frame(self):
        rows = [asdict(r) for r in self]
        for r in rows:
            r["missing"] = ";".join(r["missing"])
        cols = list(RoundRecord.__dataclass_fields__)
        import pandas as pd

        return pd.DataFrame(rows, columns=cols)

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
            h.append(RoundRecord(**r))
        return h
