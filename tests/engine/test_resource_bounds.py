"""Resource bounds before allocation (issue 22, item 4): each bomb of the issue is refused from
its declared sizes, with the process's peak memory under 50 MB above its baseline.

The bombs: a 0.4 MB ``model.npz`` (sha256 recomputed) whose member inflates to 430 MB; a SEC
learner's skops file holding a 400 MB array in 0.4 MB; a zero-stride 40,000 x 40,000 reply in
an in-process fit; a 20,000-column full-covariance mixture (2.98 GiB per copy of its second
moments). Each is measured by the peak resident memory it adds (Linux: VmHWM, reset through
/proc/self/clear_refs to the resident size just before it; elsewhere ru_maxrss). The two whose
unchecked allocation takes gigabytes (the reply, the mixture) run in a fresh subprocess whose
address space is capped 2 GiB above its size, so that on code without the checks they fail at
once instead of taking the machine's memory; the files are loaded in this process.
"""

import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pytest

import fedlatent as fl

MB = 2**20
HERE = Path(__file__).resolve().parent


# ---- building bombs without allocating them -------------------------------------------------
def _gf2_times(mat, vec):
    out, i = 0, 0
    while vec:
        if vec & 1:
            out ^= mat[i]
        vec, i = vec >> 1, i + 1
    return out


def _crc32_combine(crc1, crc2, len2):
    """zlib's ``crc32_combine``: the CRC-32 of ``a + b`` from those of ``a`` and ``b``."""
    odd = [0xEDB88320] + [1 << n for n in range(31)]  # one zero bit
    even = [_gf2_times(odd, v) for v in odd]
    odd = [_gf2_times(even, v) for v in even]
    while len2:
        even = [_gf2_times(odd, v) for v in odd]
        if len2 & 1:
            crc1 = _gf2_times(even, crc1)
        len2 >>= 1
        if not len2:
            break
        odd = [_gf2_times(even, v) for v in even]
        if len2 & 1:
            crc1 = _gf2_times(odd, crc1)
        len2 >>= 1
    return crc1 ^ crc2


def _crc32_zeros(n):
    """CRC-32 of ``n`` zero bytes, by doubling (never holding them)."""
    out, block, size = zlib.crc32(b""), zlib.crc32(bytes(1)), 1
    while n:
        if n & 1:
            out = _crc32_combine(out, block, size)
        block, size, n = _crc32_combine(block, block, size), 2 * size, n >> 1
    return out


def _deflated_npy(shape, nbytes):
    """``(compressed, crc32, size)`` of a .npy file of zeros with ``shape`` (float64): the
    deflate stream of 1 MB zero blocks repeats once the window is all zeros, so it is built
    from three compressed blocks, never from the array."""
    from numpy.lib import format as npy

    head = io.BytesIO()
    npy.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False, "shape": shape})
    head = head.getvalue()
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    chunk = bytes(MB)
    first = c.compress(head) + c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    again = c.compress(chunk) + c.flush(zlib.Z_FULL_FLUSH)
    blocks = nbytes // MB
    rest = c.compress(bytes(nbytes - blocks * MB)) + c.flush()
    crc = _crc32_combine(zlib.crc32(head), _crc32_zeros(nbytes), nbytes)
    return first + again * (blocks - 1) + rest, crc, len(head) + nbytes


def _zip(members):
    """A zip archive by hand: ``members`` maps a name to raw bytes (stored) or to a
    precompressed ``(deflated, crc32, size)``."""
    out, central = io.BytesIO(), []
    for name, m in members.items():
        raw = isinstance(m, bytes)
        data, crc, size = (m, zlib.crc32(m), len(m)) if raw else m
        method, off, fn = 0 if raw else 8, out.tell(), name.encode()
        fields = (20, 0, method, 0, 0x21, crc, len(data), size, len(fn), 0)
        out.write(b"PK\x03\x04" + struct.pack("<2H3H3L2H", *fields) + fn + data)
        central.append(b"PK\x01\x02" + struct.pack("<3H3H3L5H2L", 20, 20, 0, method, 0, 0x21,
                                                   crc, len(data), size, len(fn), 0, 0, 0, 0,
                                                   0, off) + fn)
    start = out.tell()
    for c in central:
        out.write(c)
    end = out.tell()
    out.write(b"PK\x05\x06" + struct.pack("<4H2LH", 0, 0, len(central), len(central),
                                         end - start, start, 0))
    return out.getvalue()


def npz_bomb(tmp_path):
    """A fitted model saved, then its ``means_`` member replaced by 430 MB of zeros deflated
    to 0.4 MB, the .json's sha256 recomputed."""
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays({f"c{i}": rng.normal(size=(30, 2)) for i in range(3)})
    est = fl.FederatedGaussianMixture(2, max_rounds=2, verbose=False, random_state=0).fit(fd)
    path = tmp_path / "model"
    est.save(path)
    npz = path.with_name("model.npz")
    with zipfile.ZipFile(npz) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members["means_.npy"] = _deflated_npy((430 * MB // 8,), 430 * MB)
    data = _zip(members)
    npz.write_bytes(data)
    js = path.with_name("model.json")
    meta = json.loads(js.read_text())
    meta["npz_sha256"] = hashlib.sha256(data).hexdigest()
    js.write_text(json.dumps(meta))
    return path, len(data)


def skops_bomb(tmp_path):
    """A learner's fitted linear model as skops bytes, one array replaced by 400 MB of zeros
    deflated to 0.4 MB."""
    pytest.importorskip("skops")
    from sklearn.linear_model import LinearRegression

    from fedlatent.models.sec.serialize import dumps_model

    rng = np.random.default_rng(0)
    est = LinearRegression().fit(rng.normal(size=(20, 3)), rng.normal(size=20))
    data = dumps_model(est).tobytes()
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        members = {n: z.read(n) for n in z.namelist()}
    name = next(n for n in members if n.endswith(".npy"))
    members[name] = _deflated_npy((400 * MB // 8,), 400 * MB)
    bomb = _zip(members)
    (tmp_path / "model.skops").write_bytes(bomb)
    return tmp_path / "model.skops", len(bomb), name


# ---- the child: every bomb, its outcome and the peak memory it cost --------------------------
def _rss():
    """Resident bytes now, the peak reset to it (Linux: /proc; elsewhere the peak so far, an
    upper bound)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # the peak resident size (VmHWM) back to the current one
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return _peak()


def _peak():
    """The peak resident bytes (Linux: VmHWM, which clear_refs resets; else ru_maxrss)."""
    import resource

    try:
        with open("/proc/self/status") as f:
            return next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))
    except (OSError, StopIteration):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, else KiB


def _cap_address_space(extra):
    """Cap the address space ``extra`` bytes above its current size (Linux)."""
    import resource

    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + extra, resource.getrlimit(
            resource.RLIMIT_AS)[1]))
    except (OSError, ValueError):
        pass


def _zero_stride_fit():
    rng = np.random.default_rng(1)
    fd = fl.FederatedDataset.from_arrays({f"c{i}": rng.normal(size=(30, 2)) for i in range(3)})
    rt = fl.InProcessRuntime(fd, batched=False)
    node = rt.nodes["c1"]
    honest = node._estep

    def bomb(msg):
        reply = honest(msg)
        if int(msg["round"]) >= 2:
            reply["delta/sxx"] = np.broadcast_to(np.float64(0.0), (40_000, 40_000))
        return reply

    node._estep = bomb
    est = fl.FederatedGaussianMixture(2, max_rounds=3, tol=0.0, verbose=False, random_state=0)
    est.fit(fd, runtime=rt)
    return "; ".join(str(e) for e in est.history_.to_frame()["errors"] if e)


def measure(run):
    """``{"error", "result", "peak_mb"}`` of ``run()``: its exception (type and text) or
    result, and the peak resident memory it added (MB)."""
    base = _rss()
    try:
        got = {"error": None, "result": str(run())}
    except Exception as err:  # noqa: BLE001 - asserted by the caller
        got = {"error": type(err).__name__, "result": str(err)}
    got["peak_mb"] = (_peak() - base) / MB
    return got


def _gmm_20000():
    rng = np.random.default_rng(0)
    fd = fl.FederatedDataset.from_arrays({f"c{i}": rng.normal(size=(3, 20_000))
                                          for i in range(2)})
    fl.FederatedGaussianMixture(1, verbose=False).fit(fd)


def child():
    """The bombs whose unchecked allocation would take gigabytes, in this fresh process with
    its address space capped; print one JSON line of outcomes."""
    est = fl.FederatedGaussianMixture(  # warm the imports (4-row clients: rules aside)
        2, max_rounds=2, verbose=False,
        federation=fl.Federation(disclosure=fl.DisclosurePolicy.off())).fit(
        fl.FederatedDataset.from_arrays({"a": np.eye(4, 2) + 1.0, "b": np.eye(4, 2)}))
    est.history_.to_frame()  # and the table's allocator, which reserves address space
    _cap_address_space(2 << 30)
    print(json.dumps({"stride": measure(_zero_stride_fit), "gmm": measure(_gmm_20000)}))


@pytest.fixture(scope="module")
def outcomes():
    code = (f"import sys; sys.path[:0] = [{str(HERE)!r}, {str(HERE.parent)!r}]; "
            "from test_resource_bounds import child; child()")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MPLBACKEND": "Agg"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_model_npz_that_inflates_to_430_mb_is_refused_before_unpacking(tmp_path):
    path, size = npz_bomb(tmp_path)
    assert size < 0.6 * MB  # a small file...
    got = measure(lambda: fl.FederatedGaussianMixture.load(path))
    assert got["error"] == "ValueError"
    assert "member 'means_.npy' inflates" in got["result"]
    assert "a compression bomb, not data; nothing was unpacked" in got["result"]
    assert got["peak_mb"] < 50


def test_a_skops_file_holding_a_400_mb_array_is_refused_before_loading(tmp_path):
    from fedlatent.models.sec.serialize import loads_model

    path, size, _ = skops_bomb(tmp_path)
    assert size < 0.6 * MB
    got = measure(lambda: loads_model(path.read_bytes(), source="learner 'l1''s model"))
    assert got["error"] == "UntrustedModelError"
    assert got["result"].startswith("learner 'l1''s model is not a valid skops file")
    assert "inflates" in got["result"]
    assert got["peak_mb"] < 50


def test_a_zero_stride_reply_is_refused_before_it_is_copied(outcomes):
    got = outcomes["stride"]
    assert got["error"] is None  # the fit goes on without the bomb
    assert "reply refused before it was copied: array 'delta/sxx' of shape (40000, 40000) " \
        "is a zero-stride view" in got["result"]
    assert got["peak_mb"] < 50


def test_a_20000_column_full_covariance_mixture_is_refused_up_front(outcomes):
    got = outcomes["gmm"]
    assert got["error"] == "ValueError"
    assert got["result"].startswith(
        "FederatedGaussianMixture: 1 component(s) x 20000 x 20000 second moments "
        "(covariance_type='full') take 2.98 GiB per copy")
    assert 'use covariance_type="diag"' in got["result"]
    assert got["peak_mb"] < 50


# ---- the checks themselves, in process ------------------------------------------------------
def test_the_crc_of_zeros_is_zlibs():
    for n in (0, 1, 5, 1000, 3 * MB + 7):
        assert _crc32_zeros(n) == zlib.crc32(bytes(n))
    assert _crc32_combine(zlib.crc32(b"ab"), zlib.crc32(bytes(9)), 9) == zlib.crc32(
        b"ab" + bytes(9))


def test_zip_check_reads_npy_headers_and_refuses_a_header_larger_than_its_data():
    from fedlatent.engine.protocol.bounds import check_zip

    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"descr": "<f8", "fortran_order": False,
                                                "shape": (10**6,)})
    data = _zip({"a.npy": head.getvalue() + bytes(80)})
    with pytest.raises(ValueError, match=r"^x.npz: member 'a.npy' declares an array of shape "
                       r"\(1000000,\) float64 \(7.63 MB\) in 0.000\d+ MB: its header does not "
                       r"match its data; nothing was unpacked$"):
        check_zip(data, "x.npz")
    obj = io.BytesIO()
    np.lib.format.write_array_header_1_0(obj, {"descr": "|O", "fortran_order": False,
                                               "shape": (1,)})
    with pytest.raises(ValueError, match=r"member 'o.npy' holds Python objects \(object\)"):
        check_zip(_zip({"o.npy": obj.getvalue() + bytes(8)}), "x.npz")
    deflated = (zlib.compress(bytes(2 * MB), 9)[2:-4], zlib.crc32(bytes(2 * MB)), 2 * MB)
    with pytest.raises(ValueError, match=r"^x.npz declares 2 MB uncompressed in 1 compressed "
                       r"member\(s\), beyond the limit of 1 MB"):
        check_zip(_zip({"b.bin": deflated}), "x.npz", limit=MB)
    check_zip(_zip({"b.bin": bytes(2 * MB)}), "x.npz", limit=MB)  # stored: the file holds it


def test_message_check_refuses_oversized_and_object_arrays_and_keeps_small_views():
    from fedlatent.engine.protocol.bounds import message_problem

    view = np.lib.stride_tricks.as_strided(np.zeros(1), shape=(2**20, 2**10), strides=(0, 0))
    assert message_problem({"delta/x": view}) == (
        "array 'delta/x' of shape (1048576, 1024) is a zero-stride view (axis 0 repeats one "
        "value; 8 GiB once copied), not an array that crossed a wire")
    assert message_problem({"n": 1.0, "delta/x": np.zeros(1000)}, limit=4096) == (
        "array 'delta/x' declares shape (1000,) float64 (0.00763 MB), beyond the limit of "
        "0.00391 MB for one array of a message")
    assert message_problem({"o": np.array([None])}).startswith("array 'o' holds Python objects")
    assert message_problem({"v": np.broadcast_to(1.0, (3, 3)), "n": 3, "s": "x"}) is None
