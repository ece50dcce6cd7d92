"""Which of a dataset's columns play which role in a latent class regression: regressors,
concomitant variables, an offset, binomial trials. Columns are named (the data API's
``concomitant=["age"]``, ``offset="log_exposure"``, ``trials="n"``) and resolved to positions
once, the same way at fit and at prediction."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["ColumnRoles", "column_roles"]


@dataclass(frozen=True)
class ColumnRoles:
    """Column positions of each role (``offset``, ``trials``: one position or None)."""

    regressors: tuple[int, ...]
    concomitant: tuple[int, ...] = ()
    offset: int | None = None
    trials: int | None = None

    @property
    def plain(self) -> bool:
        """Every column a regressor: nothing but the design."""
        return not self.concomitant and self.offset is None and self.trials is None


def _position(names: list[str], name, role: str) -> int:
    if not isinstance(name, str):
        raise ValueError(f"{role} must name one column (a string), got {name!r}")
    if name not in names:
        shown = names[:10] + ([f"... and {len(names) - 10} more"] if len(names) > 10 else [])
        raise ValueError(f"{role} column {name!r} is not a feature of the data; features: "
                         f"{shown}")
    return names.index(name)


def column_roles(feature_names: Sequence[str], concomitant=None, offset=None, trials=None,
                 formula=None) -> ColumnRoles:
    """The roles of the columns ``feature_names``.

    Parameters
    ----------
    feature_names : sequence of str
    concomitant : list of str or None
        The concomitant variables; None: those of ``formula`` (its part after ``|``), or none.
    offset, trials : str or None
        The offset and trials columns.
    formula : FormulaDesign or None
        The dataset's formula (``fd.formula``): its regressors are the design's columns;
        without one every column not given another role is a regressor.

    Returns
    -------
    ColumnRoles
    """
    names = [str(f) for f in feature_names]
    if concomitant is None and formula is not None:
        concomitant = list(formula.concomitant)
    if isinstance(concomitant, str):
        raise ValueError(f"concomitant must be a list of column names, got the string "
                         f"{concomitant!r}; write concomitant=[{concomitant!r}]")
    conc = tuple(_position(names, c, "concomitant") for c in (concomitant or ()))
    off = None if offset is None else _position(names, offset, "offset")
    tri = None if trials is None else _position(names, trials, "trials")
    special = {j for j in (off, tri) if j is not None}
    if formula is not None:
        reg = tuple(names.index(c) for c in formula.regressors)
    else:
        reg = tuple(j for j in range(len(names)) if j not in special and j not in conc)
    clash = sorted(special & set(reg))
    if clash:
        raise ValueError(f"column {names[clash[0]]!r} is both a regressor and the "
                         "offset or trials column; leave it out of the formula")
    return ColumnRoles(reg, conc, off, tri)
