"""Fixed-point encoding of named float arrays into the ring Z_{2^64} (NumPy uint64 arithmetic).

A float x becomes the integer round(x * scale) taken modulo 2^64 (two's complement for negative
values).  Adding encodings with uint64 wrap-around adds the integers modulo 2^64; as long as the
true sum stays in [-2^63, 2^63) it is read back exactly as an int64 and divided by the scale.
Each entry loses at most 1/(2 scale) to rounding, so a sum over n clients is within n/(2 scale)
of the float sum.  The scale is public and shared by every client; each field declares a bound on
the absolute value of one client's entries, which is checked at encoding time, and
``bound * scale * n_clients < 2^63`` is checked when the number of clients is known.

References
----------
Bonawitz et al., "Practical Secure Aggregation for Privacy-Preserving Machine Learning",
CCS 2017, section 3 (inputs in Z_R).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["FixedPoint", "Flat", "Layout"]

_LIMIT = float(2**63)


def _shape(v) -> tuple[int, ...]:
    """An array's shape (``np.shape`` for what is not an ndarray yet)."""
    return v.shape if isinstance(v, np.ndarray) else tuple(np.shape(v))


@dataclass(frozen=True)
class Layout:
    """The fields of a message, their shapes and their offsets in the flat vector (sorted names).

    Parameters
    ----------
    shapes : mapping of str to tuple of int
        The shape of each named array.
    """

    shapes: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def of(cls, arrays: Mapping[str, np.ndarray]) -> Layout:
        """The layout of a dict of arrays, fields in sorted-name order."""
        return cls.of_shapes(tuple((str(k), _shape(arrays[k])) for k in sorted(arrays)))

    @classmethod
    def of_shapes(cls, shapes: tuple[tuple[str, tuple[int, ...]], ...]) -> Layout:
        """``Layout(shapes)``, one object per distinct layout in a process (the few an
        exchange's replies have), so that its names and size are computed once."""
        got = _LAYOUTS.get(shapes)
        if got is None:
            if len(_LAYOUTS) >= 256:
                _LAYOUTS.clear()
            got = _LAYOUTS[shapes] = cls(shapes)
        return got

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.shapes)

    @functools.cached_property
    def size(self) -> int:
        return sum(math.prod(s) for _, s in self.shapes)

    def flatten(self, arrays: Mapping[str, np.ndarray], dtype) -> np.ndarray:
        """One vector of all fields in sorted-name order."""
        if not self.shapes:
            return np.zeros(0, dtype=dtype)
        return np.concatenate([np.asarray(arrays[k], dtype=dtype).ravel() for k in self.names])

    def unflatten(self, vector: np.ndarray, copy: bool = True) -> dict[str, np.ndarray]:
        """The named arrays of a flat vector (copies; views of it with ``copy=False``)."""
        out = {k: vector[a:b].reshape(s) for k, a, b, s in self._spans}
        return {k: v.copy() for k, v in out.items()} if copy else out

    @functools.cached_property
    def offsets(self) -> dict[str, int]:
        """Where each field starts in the flat vector."""
        return {k: a for k, a, _, _ in self._spans}

    @functools.cached_property
    def _spans(self) -> tuple[tuple[str, int, int, tuple[int, ...]], ...]:
        """``(name, start, stop, shape)`` of each field in the flat vector."""
        out, at = [], 0
        for k, s in self.shapes:
            out.append((k, at, at + math.prod(s), s))
            at += math.prod(s)
        return tuple(out)


#: the layouts :meth:`Layout.of_shapes` made, by their shapes
_LAYOUTS: dict[tuple, Layout] = {}


@dataclass(frozen=True)
class Flat:
    """Named float arrays laid out flat: the float64 vector ``x`` of ``layout``'s fields (what
    :meth:`FixedPoint.encode_flat` takes as well as the named arrays)."""

    layout: Layout
    x: np.ndarray

    def arrays(self) -> dict[str, np.ndarray]:
        """The named arrays (copies)."""
        return self.layout.unflatten(self.x)


@dataclass(frozen=True)
class FixedPoint:
    """The public encoding every client and the server share.

    Parameters
    ----------
    scale : float
        Fixed-point scale: x is sent as round(x * scale). Resolution of one client's entry is
        1/scale; a power of two (``2.0**20``) keeps the scaling exact.
    bound : float or mapping of str to float
        Largest absolute value one client may send, for every field or per field name.

    Examples
    --------
    >>> fp = FixedPoint(scale=2.0**16, bound=10.0)
    >>> enc = fp.encode({"x": np.array([1.5, -2.25])}, client="c1")
    >>> fp.decode({"x": enc["x"]})["x"]
    array([ 1.5 , -2.25])
    """

    scale: float
    bound: float | Mapping[str, float] = field(default=1e6)

    def __post_init__(self):
        if not (np.isfinite(self.scale) and self.scale >= 1):
            raise ValueError(f"fixed-point scale must be a finite number >= 1, got {self.scale!r}")
        bounds = self.bound.values() if isinstance(self.bound, Mapping) else [self.bound]
        for b in bounds:
            if not (np.isfinite(b) and b > 0):
                raise ValueError(f"fixed-point bounds must be finite and > 0, got {b!r}")

    def bound_of(self, name: str) -> float:
        """The declared bound of field ``name`` (error naming the field when none is declared)."""
        if isinstance(self.bound, Mapping):
            if name not in self.bound:
                raise ValueError(f"field {name!r} has no declared bound; add {name!r} to "
                                 f"FixedPoint(bound={{...}}) (declared: {sorted(self.bound)})")
            return float(self.bound[name])
        return float(self.bound)

    def check_capacity(self, n_clients: int) -> None:
        """Refuse settings where a sum over ``n_clients`` bounded entries could leave int64.

        Raises ``ValueError`` naming the first field with bound * scale * n_clients >= 2^63.
        """
        named = ([(f"field {k!r}", b) for k, b in sorted(self.bound.items())]
                 if isinstance(self.bound, Mapping) else [("every field", self.bound)])
        for what, b in named:
            if b * self.scale * n_clients >= _LIMIT:
                raise ValueError(
                    f"{what}: bound {b:g} x scale {self.scale:g} x {n_clients} clients "
                    f"= {b * self.scale * n_clients:.3g} reaches 2^63 = {_LIMIT:.3g}, so the "
                    "masked sum could overflow; lower the scale or that field's bound, "
                    "or rescale the field")

    def encode(self, arrays: Mapping[str, np.ndarray], *, client: str) -> dict[str, np.ndarray]:
        """round(x * scale) mod 2^64 of every field (uint64), after checking its bound.

        Raises ``ValueError`` naming the client and the field for a non-finite value or a value
        beyond the declared bound.
        """
        out = {}
        for name in sorted(arrays):
            x = np.asarray(arrays[name], dtype=np.float64)
            b = self.bound_of(name)
            if not np.all(np.isfinite(x)):
                raise ValueError(f"client {client!r}: field {name!r} has "
                                 f"{int(np.sum(~np.isfinite(x)))} non-finite values; secure "
                                 "aggregation encodes finite numbers only")
            worst = float(np.max(np.abs(x))) if x.size else 0.0
            if worst > b:
                raise ValueError(f"client {client!r}: field {name!r} has |value| {worst:.6g} "
                                 f"beyond the declared bound {b:g}; raise the bound for "
                                 f"{name!r} (and lower the scale if the capacity check fails)")
            out[name] = np.rint(x * self.scale).astype(np.int64).view(np.uint64)
        return out

    def encode_flat(self, arrays: Mapping[str, np.ndarray] | Flat, *, client: str
                    ) -> tuple[Layout, np.ndarray]:
        """``Layout.of(arrays)`` and the flat uint64 vector of :meth:`encode` (fields in sorted
        order), every bound checked in one pass (:meth:`encode`'s error when one fails);
        ``arrays`` may come flat already (:class:`Flat`)."""
        if isinstance(arrays, Flat):
            layout, x = arrays.layout, arrays.x
        else:
            layout = Layout.of(arrays)
            x = layout.flatten(arrays, np.float64)
        if isinstance(self.bound, Mapping):
            bound = np.repeat([self.bound_of(k) for k in layout.names],
                              [int(np.prod(shp)) for _, shp in layout.shapes])
            ok = bool(np.all(np.abs(x) <= bound))
        else:  # NaN fails the comparison, inf the bound
            ok = not x.size or bool(np.abs(x).max() <= float(self.bound))
        if not ok:  # raises, naming the client and the field
            self.encode(arrays.arrays() if isinstance(arrays, Flat) else arrays, client=client)
        return layout, np.rint(x * self.scale).astype(np.int64).view(np.uint64)

    def decode(self, summed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The float64 value of ring elements (a sum of encodings, masks removed)."""
        return {k: np.asarray(v, dtype=np.uint64).view(np.int64).astype(np.float64) / self.scale
                for k, v in summed.items()}
