"""Designs from Wilkinson formulas, as statisticians write models: ``y ~ x1 + C(sex) + x1:x2``,
with an optional second part after ``|`` for concomitant variables (``y ~ x | z``, as R's
``Formula`` package and flexmix write them).

``FederatedDataset.from_pandas(df, client="site", formula="y ~ x1 + C(sex) + x1:x2")`` builds
each row's design with formulaic (https://matthewwardrop.github.io/formulaic/), the library
statsmodels' formula API moves to. What the sites must agree on is the levels of each
categorical variable, settled as one-hot encoding settles them
(:mod:`fedlatent.data.categorical`): each client reports the distinct labels of its column,
the agreed levels are their sorted union (numbers sorted as numbers), and every site codes its
rows against them, so a site that holds two of a variable's five levels gets the same
columns as every other. Transforms that learn from the data (``center(x)``, ``scale(x)``,
splines) would learn from each site's rows alone and are refused; row-wise functions
(``np.log(x)``, ``x ** 2`` via ``I(x**2)``, interactions) are what a site computes alone.

The design a dataset was built with is ``fd.formula`` (a :class:`FormulaDesign`: the formula,
the agreed levels and the design's columns); a fitted model keeps it (``est.formula_``, saved
with the model) and turns a DataFrame of the formula's variables into the same columns for
``predict``. ``from_pandas(..., formula=fd.formula)`` codes new data (a deployment site's own
table) with the agreed levels.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .categorical import _labels, agree_levels, categorical_columns, client_levels
from .validation import DataValidationError

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["FormulaDesign", "formula_design"]

_INSTALL = ("formulas need the formulaic package: pip install 'fedlatent[formula]' (or pip "
            "install formulaic)")
#: variables named inside C(...) are categorical whatever their dtype
_C_CALL = re.compile(r"\bC\(\s*([A-Za-z_][A-Za-z_0-9]*)")


def _formulaic():
    try:
        import formulaic
    except ImportError as err:  # an extra, not a core dependency
        raise ImportError(_INSTALL) from err
    return formulaic


@dataclass(frozen=True)
class FormulaDesign:
    """A formula, the levels agreed for its categorical variables and the design's columns.

    Attributes
    ----------
    formula : str
    target : str or None
        The response column (the left-hand side), None for a one-sided formula.
    levels : dict of str to tuple of str
        Each categorical variable's agreed levels, in order (the first is the reference).
    regressors : tuple of str
        The design's columns of the first right-hand part (no ``Intercept`` column).
    concomitant : tuple of str
        The design's columns of the part after ``|`` (no ``Intercept``; empty without one).
    intercept : bool
        Whether the first part has an intercept (``y ~ x - 1`` has none).
    extra : tuple of str
        Columns kept as they are beside the design (offsets, trials).
    indicators : dict of str to tuple of str
        The indicator columns of each categorical variable's main effect, one per level in
        order, the reference level (reduced-rank coding: an intercept or an earlier
        variable) named ``""``: what the rare-level rule counts (:meth:`level_counts`).
    """

    formula: str
    target: str | None
    levels: dict[str, tuple[str, ...]]
    regressors: tuple[str, ...]
    concomitant: tuple[str, ...] = ()
    intercept: bool = True
    extra: tuple[str, ...] = ()
    indicators: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def feature_names(self) -> list[str]:
        """The dataset's columns: the regressors, then the concomitant columns not among
        them, then the extra columns."""
        out = list(self.regressors)
        out += [c for c in self.concomitant if c not in out]
        return out + [c for c in self.extra if c not in out]

    def to_json(self) -> dict[str, Any]:
        return {"formula": self.formula, "target": self.target,
                "levels": {c: list(v) for c, v in self.levels.items()},
                "regressors": list(self.regressors), "concomitant": list(self.concomitant),
                "intercept": bool(self.intercept), "extra": list(self.extra),
                "indicators": {v: list(c) for v, c in self.indicators.items()}}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> FormulaDesign:
        """The design :meth:`to_json` wrote; anything else is refused (ValueError)."""
        try:
            out = cls(str(doc["formula"]), None if doc["target"] is None else str(doc["target"]),
                      {str(c): tuple(str(v) for v in lv) for c, lv in doc["levels"].items()},
                      tuple(str(c) for c in doc["regressors"]),
                      tuple(str(c) for c in doc["concomitant"]), doc["intercept"],
                      tuple(str(c) for c in doc["extra"]),
                      {str(v): tuple(str(c) for c in cols)
                       for v, cols in doc.get("indicators", {}).items()})
        except (KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"not a formula design ({err!r}); expected the entries formula, "
                             "target, levels, regressors, concomitant, intercept, extra") from err
        if not isinstance(out.intercept, bool) or any(not v for v in out.levels.values()):
            raise ValueError("not a formula design: intercept must be true/false and each "
                             "variable's levels not empty")
        return out

    def level_counts(self, feature_names: Sequence[str], X: np.ndarray,
                     weight: np.ndarray | None = None) -> list[tuple[str, list[str], np.ndarray]]:
        """How many of one client's records hold each level of each categorical variable with
        a main effect, from its design rows ``X`` (the rows with no indicator set hold the
        reference level): ``[(variable, level names, counts)]``, as
        :func:`fedlatent.data.categorical.level_counts` gives them for one-hot columns."""
        where = {str(n): j for j, n in enumerate(feature_names)}
        rec = np.ones(X.shape[0], dtype=bool) if weight is None else np.asarray(weight) > 0
        out = []
        for var, cols in self.indicators.items():
            idx = [where.get(c) for c in cols if c]
            if not idx or any(j is None for j in idx):
                continue
            ind = np.asarray(X[rec][:, idx], dtype=np.float64) != 0
            counts = ind.sum(axis=0).astype(np.float64)
            if "" in cols:  # the reference level: no indicator set
                counts = np.insert(counts, cols.index(""), float((~ind.any(axis=1)).sum()))
            out.append((var, list(self.levels.get(var, cols)), counts))
        return out

    def design_frame(self, df: pd.DataFrame, where: Callable[[int], str] | None = None
                     ) -> pd.DataFrame:
        """The design of the rows of ``df`` (a DataFrame holding the formula's variables), as
        a DataFrame of :attr:`feature_names`, coded with the agreed levels (an unseen label is
        an error naming it and the column)."""
        import pandas as pd

        X, names = _build(self, df, where or (lambda i: ""))
        return pd.DataFrame(X, columns=names, index=df.index)


def _split(formula: str):
    """``(target or None, [right-hand parts])`` of a formula, or a DataValidationError."""
    f = _formulaic().Formula(formula)
    lhs = getattr(f, "lhs", None) if getattr(f, "_has_structure", False) else None
    rhs = f.rhs if lhs is not None else (getattr(f, "rhs", f) if getattr(
        f, "_has_structure", False) else f)
    parts = list(rhs) if isinstance(rhs, tuple) else [rhs]
    if len(parts) > 2:
        raise DataValidationError(f"formula {formula!r} has {len(parts)} parts after '~'; "
                                  "write 'y ~ x' or 'y ~ x | z' (z: concomitant variables)")
    target = None
    if lhs is not None:
        target = str(lhs).strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*", target):
            raise DataValidationError(f"formula {formula!r}: the response must be one column "
                                      f"(y ~ ...), got {target!r}; make the column first")
    return target, parts


def _variables(parts, columns: Sequence[str]) -> list[str]:
    needed = set()
    for part in parts:
        needed |= {str(v) for v in part.required_variables}
    return [c for c in columns if c in needed]


def _categorical(df: pd.DataFrame, variables: list[str], formula: str) -> list[str]:
    called = set(_C_CALL.findall(formula))
    return [v for v in variables if v in called or v in categorical_columns(df, [v])]


def _sorted_levels(df: pd.DataFrame, col: str, levels: tuple[str, ...]) -> tuple[str, ...]:
    """Labels of a numeric column sorted as numbers (2 before 10), others as text."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(df[col].dtype) and not pd.api.types.is_bool_dtype(
            df[col].dtype):
        return tuple(sorted(levels, key=float))
    return levels


def _coded(df: pd.DataFrame, design: FormulaDesign, where) -> pd.DataFrame:
    """``df``'s variables with each categorical one coded against its agreed levels."""
    import pandas as pd

    out = df.copy()
    for col, levels in design.levels.items():
        if col not in out.columns:
            raise DataValidationError(f"the formula's variable {col!r} is not in the data")
        lab = _labels(out[col])
        missing = lab.isna().to_numpy()
        if missing.any():
            i = int(np.flatnonzero(missing)[0])
            raise DataValidationError(
                f"{where(i)}column {col!r} has {int(missing.sum())} missing values; give them a "
                "level of their own (e.g. df[col].fillna('missing')) or drop those rows")
        known = lab.isin(levels).to_numpy()
        if not known.all():
            i = int(np.flatnonzero(~known)[0])
            raise DataValidationError(
                f"{where(i)}column {col!r} has level {lab.iloc[i]!r}, unseen when the levels "
                f"were agreed ({list(levels)}); agree the formula on data that hold it")
        out[col] = pd.Categorical(lab, categories=list(levels))
    return out


def _indicators(spec, levels: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """Each categorical variable's main-effect columns, one per level (``""``: the
    reference), from a formulaic model spec."""
    out = {}
    for st in spec.structure:
        term = str(st.term)
        kind = spec.encoder_state.get(term, (None,))[0]
        if ":" in term or getattr(kind, "value", None) != "categorical":
            continue
        m = _C_CALL.match(term) or re.fullmatch(r"([A-Za-z_][A-Za-z_0-9]*)", term)
        var = m.group(1) if m else None
        if var in levels:
            cols = tuple(str(c) for c in st.columns)
            out[var] = ("", *cols) if len(cols) == len(levels[var]) - 1 else cols
    return out


def _part_matrix(part, df: pd.DataFrame, formula: str):
    mm = part.get_model_matrix(df, na_action="ignore")
    state = {k: v for k, v in mm.model_spec.transform_state.items() if v}
    if state:
        raise DataValidationError(
            f"formula {formula!r}: {sorted(state)[0]!r} learns from the data (its state: "
            f"{sorted(state[sorted(state)[0]])}), which each site would learn from its own rows "
            "alone; compute it beforehand with values agreed across sites, or leave it out")
    names = [str(c) for c in mm.columns]
    X = np.asarray(mm, dtype=np.float64)
    keep = [j for j, c in enumerate(names) if c != "Intercept"]
    return X[:, keep], [names[j] for j in keep], "Intercept" in names, mm.model_spec


def _matrices(formula: str, coded: pd.DataFrame) -> list[tuple]:
    """Each right-hand part's ``(matrix, column names, intercept, model spec)`` for coded
    rows."""
    _, parts = _split(formula)
    return [_part_matrix(part, coded, formula) for part in parts]


def _assemble(design: FormulaDesign, mats, df: pd.DataFrame) -> np.ndarray:
    """The columns :attr:`FormulaDesign.feature_names` from the parts' matrices and the
    extra columns of ``df``."""
    blocks: dict[str, np.ndarray] = {}
    for X, names, *_ in mats:
        for c, name in enumerate(names):
            blocks.setdefault(name, X[:, c])
    for col in design.extra:
        blocks.setdefault(col, df[col].to_numpy(dtype=np.float64, na_value=np.nan))
    names = design.feature_names
    if set(names) != set(blocks):
        raise DataValidationError(f"the formula {design.formula!r} gives the columns "
                                  f"{sorted(blocks)}, not the fitted {names}")
    return np.column_stack([blocks[c] for c in names]) if names else np.empty((len(df), 0))


def _build(design: FormulaDesign, df: pd.DataFrame, where) -> tuple[np.ndarray, list[str]]:
    """The design matrix of ``df``'s rows and its column names (:attr:`feature_names`)."""
    mats = _matrices(design.formula, _coded(df, design, where))
    return _assemble(design, mats, df), design.feature_names


def formula_design(df: pd.DataFrame, formula: str | FormulaDesign, row_client: np.ndarray,
                   clients: np.ndarray, extra: Sequence[str] = (),
                   where: Callable[[int], str] = lambda i: "") -> tuple[FormulaDesign,
                                                                         np.ndarray]:
    """The design of a long table: the levels agreed from what each client reports, then
    every row coded against them.

    Parameters
    ----------
    df : DataFrame
        The table (its index a RangeIndex).
    formula : str or FormulaDesign
        A formula, or a design whose levels are given (new data coded as the training's).
    row_client : ndarray of shape (n_rows,)
        Each row's client number (an index into ``clients``).
    clients : ndarray of shape (n_clients,)
        The client ids.
    extra : sequence of str
        Columns kept beside the design as they are (an offset, trials).
    where : callable
        ``where(i)``: the prefix naming the client of row ``i`` in errors.

    Returns
    -------
    (FormulaDesign, X) with X of shape (n_rows, len(design.feature_names)).

    Notes
    -----
    Each row's design is a function of that row and the agreed levels only (transforms that
    learn from the data are refused), so coding the table at once gives each site the rows it
    would code alone.
    """
    if isinstance(formula, FormulaDesign):
        design = formula
        X, _ = _build(design, df, where)
        return design, X
    if not isinstance(formula, str):
        raise DataValidationError(f"formula must be a string such as 'y ~ x1 + C(sex)' or a "
                                  f"FormulaDesign (fd.formula), got {type(formula).__name__}")
    target, parts = _split(formula)
    columns = [str(c) for c in df.columns]
    variables = _variables(parts, columns)
    cats = _categorical(df, variables, formula)
    reports = client_levels({c: _labels(df[c]) for c in cats}, row_client, clients)
    levels = {c: _sorted_levels(df, c, lv) for c, lv in agree_levels(reports, cats).items()}
    draft = FormulaDesign(formula, target, levels, (), (), True, tuple(str(c) for c in extra))
    mats = _matrices(formula, _coded(df, draft, where))
    indicators = {}
    for m in mats:
        indicators.update({v: c for v, c in _indicators(m[3], levels).items()
                           if v not in indicators})
    design = FormulaDesign(formula, target, levels, tuple(mats[0][1]),
                           tuple(mats[1][1]) if len(mats) > 1 else (), bool(mats[0][2]),
                           draft.extra, indicators)
    return design, _assemble(design, mats, df)
