"""Statistics containers: a named collection of arrays with addition, scaling and flattening.

Everything a client sends to the server in fedlatent is a ``Stats``: a sum (or mean) over the
client's own samples of complete-data sufficient statistics.  Because these are additive, the
server can add the clients' contributions and run the M-step on the sum, which is exactly what
centralized EM does on the pooled data (Dieuleveut, Fort, Moulines and Robin, 2021).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

__all__ = ["Stats", "units_number"]


def units_number(n) -> int | float:
    """A count of units as a message carries it: an int when whole, else the float (units of
    frequency-weighted rows are weight sums, :mod:`fedlatent.data.weights`)."""
    f = float(n)
    return int(f) if f.is_integer() else f


class Stats(Mapping[str, np.ndarray]):
    """An ordered, named collection of float arrays that behaves like a vector.

    Supports ``a + b``, ``a - b``, ``c * a``, ``a / c``, :meth:`flatten` and :meth:`unflatten`,
    and is what the engine aggregates, smooths, quantizes and checkpoints.

    Parameters
    ----------
    arrays : mapping of str to array_like
        The named blocks. They are converted to float64 arrays (copied).

    Examples
    --------
    >>> a = Stats({"n": [1.0, 2.0], "sx": [[1.0], [2.0]]})
    >>> (a + a)["n"]
    array([2., 4.])
    """

    __slots__ = ("_d",)

    def __init__(self, arrays: Mapping[str, np.ndarray] | None = None, *, copy: bool = True):
        self._d: dict[str, np.ndarray] = {}
        for k, v in (arrays or {}).items():
            arr = np.array(v, dtype=np.float64, copy=True) if copy else np.asarray(v, np.float64)
            self._d[str(k)] = arr

    # Mapping interface -------------------------------------------------------------------------
    def __getitem__(self, key: str) -> np.ndarray:
        return self._d[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._d)

    def __len__(self) -> int:
        return len(self._d)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}: {v.shape}" for k, v in self._d.items())
        return f"Stats({{{inner}}})"

    # Vector arithmetic -------------------------------------------------------------------------
    def _check_same(self, other: Stats) -> None:
        if not isinstance(other, Stats):
            raise TypeError(f"expected Stats, got {type(other).__name__}")
        if list(self._d) != list(other._d):
            raise ValueError(
                f"statistics have different blocks: {list(self._d)} vs {list(other._d)}"
            )
        for k in self._d:
            if self._d[k].shape != other._d[k].shape:
                raise ValueError(
                    f"block {k!r} has shape {self._d[k].shape} vs {other._d[k].shape}"
                )

    def __add__(self, other: Stats) -> Stats:
        self._check_same(other)
        return Stats({k: self._d[k] + other._d[k] for k in self._d}, copy=False)

    def __sub__(self, other: Stats) -> Stats:
        self._check_same(other)
        return Stats({k: self._d[k] - other._d[k] for k in self._d}, copy=False)

    def __neg__(self) -> Stats:
        return Stats({k: -v for k, v in self._d.items()}, copy=False)

    def __mul__(self, c: float) -> Stats:
        c = float(c)
        return Stats({k: v * c for k, v in self._d.items()}, copy=False)

    __rmul__ = __mul__

    def __truediv__(self, c: float) -> Stats:
        c = float(c)
        return Stats({k: v / c for k, v in self._d.items()}, copy=False)

    def add_(self, other: Stats, scale: float = 1.0) -> Stats:
        """In place ``self += scale * other``; returns self."""
        self._check_same(other)
        for k in self._d:
            if scale == 1.0:
                self._d[k] += other._d[k]
            else:
                self._d[k] += scale * other._d[k]
        return self

    def copy(self) -> Stats:
        return Stats(self._d, copy=True)

    def zeros_like(self) -> Stats:
        return Stats({k: np.zeros_like(v) for k, v in self._d.items()}, copy=False)

    # Shapes and flattening ---------------------------------------------------------------------
    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: v.shape for k, v in self._d.items()}

    @property
    def size(self) -> int:
        return int(sum(v.size for v in self._d.values()))

    @property
    def nbytes(self) -> int:
        return int(sum(v.nbytes for v in self._d.values()))

    def flatten(self) -> np.ndarray:
        """All blocks, raveled and concatenated in order, as one float64 vector."""
        if not self._d:
            return np.zeros(0)
        return np.concatenate([v.ravel() for v in self._d.values()])

    def unflatten(self, vec: np.ndarray) -> Stats:
        """A Stats with this one's blocks and shapes, filled from ``vec``."""
        vec = np.asarray(vec, dtype=np.float64)
        if vec.shape != (self.size,):
            raise ValueError(f"expected a vector of length {self.size}, got shape {vec.shape}")
        out, i = {}, 0
        for k, v in self._d.items():
            out[k] = vec[i : i + v.size].reshape(v.shape).copy()
            i += v.size
        return Stats(out, copy=False)

    def squared_norm(self) -> float:
        return float(sum(np.vdot(v, v) for v in self._d.values()))

    def all_finite(self) -> bool:
        return all(bool(np.isfinite(v).all()) for v in self._d.values())

    def to_dict(self, prefix: str = "") -> dict[str, np.ndarray]:
        return {prefix + k: v for k, v in self._d.items()}

    @classmethod
    def from_dict(cls, d: Mapping[str, np.ndarray], prefix: str = "") -> Stats:
        return cls({k[len(prefix) :]: v for k, v in d.items() if k.startswith(prefix)})

    def allclose(self, other: Stats, rtol: float = 1e-12, atol: float = 0.0) -> bool:
        self._check_same(other)
        return all(np.allclose(self._d[k], other._d[k], rtol=rtol, atol=atol) for k in self._d)
