"""Resource bounds checked before anything is allocated: files, messages, a model's size.

A file or a reply declares its sizes before its data: a zip archive (an ``.npz`` of saved
arrays, a skops model file) lists every member's uncompressed and compressed size in its
central directory, and each ``.npy`` member starts with a header giving its dtype and shape; a
NumPy array in a message has a shape, a dtype and strides before anyone copies it. Each is
checked here, against a limit, before decompression or copy, so a small file or a cheap view
cannot make the reader allocate gigabytes (a 0.4 MB ``model.npz`` that inflates to 430 MB, a
zero-stride 40,000 x 40,000 reply):

- :func:`check_zip`: every member's declared size at most ``limit`` (and all of them
  together), no member inflating more than :data:`MAX_RATIO` times (what only a bomb does:
  deflate of real statistics or fitted trees stays far below it; NumPy's own ``.npz`` is
  stored, ratio 1), every ``.npy`` header of a plain dtype whose shape fits in the member;
- :func:`message_problem`: every array of a message of a plain dtype, at most
  :data:`MAX_MESSAGE_BYTES`, and laid out as bytes that crossed a wire (no zero-stride view
  beyond 1 MB: a view repeating one value costs its sender nothing, its copy its full size);
- :func:`check_memory`: a model whose statistics would exceed :data:`MEMORY_BUDGET` is refused
  before the first round with its size and the fix (a 20,000-column full-covariance mixture
  needs 2.98 GiB per copy of its second moments: ``covariance_type="diag"``).

Each raises ValueError (or returns the reason) naming the file, the client or the member.
"""

from __future__ import annotations

import io
import math
import zipfile

import numpy as np

__all__ = ["MAX_FILE_BYTES", "MAX_MESSAGE_BYTES", "MAX_RATIO", "MEMORY_BUDGET", "check_memory",
           "check_zip", "message_problem", "statistic_bytes"]

#: the most an archive's compressed members (a skops file's) may unpack to, all together
MAX_FILE_BYTES = 1 << 30
#: the most a member larger than :data:`_RATIO_FLOOR` may inflate (uncompressed / compressed)
MAX_RATIO = 200.0
_RATIO_FLOOR = 1 << 20
#: the most one array of a message may take
MAX_MESSAGE_BYTES = 1 << 30
#: a zero-stride view larger than this (once copied) is refused (smaller ones cost little)
_VIEW_FLOOR = 1 << 20
#: the memory a fit's statistics may take (every copy the server and a client hold together)
MEMORY_BUDGET = 4 << 30
#: copies of the statistics a fit holds at once (the client's, the sum, ``S_hat``, the M-step's)
STAT_COPIES = 4


def _gib(nbytes: float) -> str:
    return f"{nbytes / 2**30:.3g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:.3g} MB"


def _npy_header(z: zipfile.ZipFile, info: zipfile.ZipInfo) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype a ``.npy`` member declares, read from its first bytes only."""
    from numpy.lib import format as npy

    with z.open(info) as f:
        version = npy.read_magic(f)
        read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
        shape, _, dtype = read(f, max_header_size=10_000)
    return tuple(int(s) for s in shape), np.dtype(dtype)


def _member_problem(z: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> str | None:
    size, packed = int(info.file_size), int(info.compress_size)
    if info.compress_type == zipfile.ZIP_STORED and size > packed:
        return f"is stored (not compressed) yet declares {_gib(size)} in {_gib(packed)}"
    if size > _RATIO_FLOOR and size > MAX_RATIO * max(packed, 1):
        return (f"inflates {size / max(packed, 1):.0f} times ({_gib(packed)} to {_gib(size)}), "
                f"beyond {MAX_RATIO:g}: a compression bomb, not data")
    if not info.filename.endswith(".npy"):
        return None
    try:
        shape, dtype = _npy_header(z, info)
    except (ValueError, OSError, EOFError, SyntaxError, zipfile.BadZipFile) as err:
        return f"has no readable .npy header ({err})"
    if dtype.hasobject:
        return f"holds Python objects ({dtype}), not numbers"
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    if nbytes > size:
        return (f"declares an array of shape {shape} {dtype} ({_gib(nbytes)}) in "
                f"{_gib(size)}: its header does not match its data")
    return None


def check_zip(data: bytes, where: str, limit: int | None = None) -> None:
    """Check the declared sizes of the zip archive ``data`` before anything is decompressed.

    Parameters
    ----------
    data : bytes
        The archive (an ``.npz``, a skops file).
    where : str
        What it is, for the error (a path, "learner 'l03''s model").
    limit : int or None
        The most its compressed members may unpack to, together (None:
        :data:`MAX_FILE_BYTES`); stored members (NumPy's ``.npz``) are bounded by the file
        itself, which the caller has read.

    Raises
    ------
    ValueError
        Naming ``where``, the member and what it declares. Not a zip archive: nothing is
        raised here (the reader says what it is).
    """
    limit = MAX_FILE_BYTES if limit is None else int(limit)
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        return
    with z:
        infos = z.infolist()
        # stored members hold their bytes in the file already read: only inflation counts
        packed = [i for i in infos if i.compress_type != zipfile.ZIP_STORED]
        total = sum(int(i.file_size) for i in packed)
        if total > limit:
            raise ValueError(f"{where} declares {_gib(total)} uncompressed in {len(packed)} "
                             f"compressed member(s), beyond the limit of {_gib(limit)}; "
                             "nothing was unpacked")
        for info in infos:
            why = _member_problem(z, info, limit)
            if why:
                raise ValueError(f"{where}: member {info.filename!r} {why}; nothing was "
                                 "unpacked")


def message_problem(msg, limit: int | None = None) -> str | None:
    """Why a message cannot be taken as it is (None: it can), from its arrays' declared
    shapes, dtypes and strides only (nothing is read or copied).

    Parameters
    ----------
    msg : mapping of str to value
    limit : int or None
        The most one array may take (None: :data:`MAX_MESSAGE_BYTES`).

    Returns
    -------
    str or None
    """
    limit = MAX_MESSAGE_BYTES if limit is None else int(limit)
    for key, v in msg.items():
        if not isinstance(v, np.ndarray):
            continue
        if v.dtype.hasobject:
            return f"array {key!r} holds Python objects ({v.dtype}), not numbers"
        nbytes = math.prod(v.shape) * v.dtype.itemsize  # exact integers, no overflow
        zero = [a for a, (n, s) in enumerate(zip(v.shape, v.strides)) if s == 0 and n > 1]
        if zero and nbytes > _VIEW_FLOOR:
            return (f"array {key!r} of shape {v.shape} is a zero-stride view (axis {zero[0]} "
                    f"repeats one value; {_gib(nbytes)} once copied), not an array that "
                    "crossed a wire")
        if nbytes > limit:
            return (f"array {key!r} declares shape {v.shape} {v.dtype} ({_gib(nbytes)}), "
                    f"beyond the limit of {_gib(limit)} for one array of a message")
    return None


def statistic_bytes(est, n_features: int) -> tuple[int, str, str] | None:
    """``(bytes, what, fix)`` of the largest statistic estimator ``est`` would exchange on
    ``n_features`` columns, for the Gaussian mixtures whose second moments grow as the square
    of the features (None: no such statistic, or a size not yet chosen)."""
    d = int(n_features)
    cov = getattr(est, "covariance_type", None)
    k = getattr(est, "n_components", None)
    if cov is not None and isinstance(k, int | np.integer):
        per = {"full": int(k) * d * d, "tied": d * d}.get(str(cov))
        if per is None:
            return None
        return (8 * per, f"{int(k)} component(s) x {d} x {d} second moments "
                f"(covariance_type={cov!r})",
                'covariance_type="diag" (or fewer columns: a projection, a selection)')
    return None


def check_memory(est, n_features: int, budget: int | None = None) -> None:
    """Refuse, before the first round, a fit whose statistics would not fit in ``budget``.

    Parameters
    ----------
    est : FederatedEstimator
    n_features : int
    budget : int or None
        Bytes (None: :data:`MEMORY_BUDGET`); the need is :data:`STAT_COPIES` copies of the
        largest statistic.

    Raises
    ------
    ValueError
        With the size, the budget and the fix.
    """
    got = statistic_bytes(est, n_features)
    if got is None:
        return
    nbytes, what, fix = got
    budget = MEMORY_BUDGET if budget is None else int(budget)
    need = STAT_COPIES * nbytes
    if need > budget:
        raise ValueError(
            f"{type(est).__name__}: {what} take {_gib(nbytes)} per copy, {_gib(need)} for the "
            f"{STAT_COPIES} copies a fit holds, beyond the memory budget of {_gib(budget)} "
            f"(fedlatent.engine.protocol.bounds.MEMORY_BUDGET); refused before the first round: "
            f"use {fix}")
