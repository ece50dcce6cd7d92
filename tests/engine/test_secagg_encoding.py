"""Secure aggregation's building blocks: fixed-point ring encoding, Shamir sharing, the optional
extra's guard, the AEAD from ``cryptography``."""

import subprocess
import sys

import numpy as np
import pytest

from fedlatent.engine.secagg import (
    FixedPoint,
    SecAggClient,
    SecAggConfig,
    SecAggServer,
    _crypto,
    shamir,
)
from fedlatent.engine.secagg.encoding import Layout


def test_ring_sum_decodes_to_the_float_sum_within_n_over_scale():
    rng = np.random.default_rng(3)
    fp = FixedPoint(scale=2.0**16, bound=50.0)
    xs = [{"a": rng.uniform(-50, 50, size=(3, 4)), "b": rng.normal(size=5)} for _ in range(9)]
    total = {k: np.zeros_like(xs[0][k], dtype=np.uint64) for k in xs[0]}
    for x in xs:
        for k, v in fp.encode(x, client="c").items():
            total[k] += v  # uint64 wrap-around is the ring addition
    got = fp.decode(total)
    for k in xs[0]:
        exact = sum(x[k] for x in xs)
        assert np.max(np.abs(got[k] - exact)) <= 9 / (2 * fp.scale)
        # and exactly the sum of the rounded integers: no other error
        ints = sum(np.rint(x[k] * fp.scale) for x in xs)
        np.testing.assert_array_equal(got[k] * fp.scale, ints)
    assert np.any(got["a"] < 0)  # negative sums come back through two's complement


def test_layout_flattens_in_sorted_name_order_and_back():
    arrays = {"z": np.arange(2.0), "a": np.arange(6.0).reshape(2, 3)}
    lay = Layout.of(arrays)
    assert lay.names == ("a", "z") and lay.size == 8
    np.testing.assert_array_equal(lay.flatten(arrays, np.float64), [0, 1, 2, 3, 4, 5, 0, 1])
    back = lay.unflatten(lay.flatten(arrays, np.float64))
    np.testing.assert_array_equal(back["a"], arrays["a"])


def test_capacity_error_names_the_field_and_the_fix():
    fp = FixedPoint(scale=2.0**20, bound={"n": 1e3, "sxx": 1e12})
    fp.check_capacity(8)  # 1e12 * 2^20 * 8 = 8.4e18 < 2^63
    with pytest.raises(ValueError, match=r"field 'sxx': bound 1e\+12 x scale 1.04858e\+06 x 9 "
                       r"clients .* reaches 2\^63 .* lower the scale or that field's bound"):
        fp.check_capacity(9)


def test_encode_refuses_values_beyond_the_bound_and_non_finite_naming_client_and_field():
    fp = FixedPoint(scale=2.0**10, bound={"n": 10.0})
    with pytest.raises(ValueError, match=r"client 'c7': field 'n' has \|value\| 12.5 beyond the "
                       r"declared bound 10; raise the bound for 'n'"):
        fp.encode({"n": np.array([1.0, -12.5])}, client="c7")
    with pytest.raises(ValueError, match=r"client 'c7': field 'n' has 1 non-finite values"):
        fp.encode({"n": np.array([np.nan, 1.0])}, client="c7")
    with pytest.raises(ValueError, match=r"field 'sx' has no declared bound; add 'sx'"):
        fp.encode({"sx": np.zeros(2)}, client="c7")


def test_shamir_any_threshold_shares_rebuild_the_secret_and_fewer_cannot():
    secret = bytes(range(32))
    shares = shamir.share(secret, list(range(1, 8)), threshold=4)
    for pick in ([1, 2, 3, 4], [7, 5, 3, 1], [2, 4, 6, 7, 3]):
        assert shamir.reconstruct({x: shares[x] for x in pick}, 4) == secret
    with pytest.raises(ValueError, match="3 shares cannot reconstruct a secret shared with "
                       "threshold 4"):
        shamir.reconstruct({x: shares[x] for x in (1, 2, 3)}, 4)
    # t - 1 shares interpolated as if the threshold were 3 give something else
    wrong = sum(w * shares[x] for w, x in zip(shamir.lagrange_at_zero([1, 2, 3]), [1, 2, 3]))
    assert wrong % shamir.PRIME != int.from_bytes(secret, "big")
    # two sharings of the same secret use fresh random coefficients
    assert shamir.share(secret, [1, 2], 2) != shamir.share(secret, [1, 2], 2)


def probably_prime(p: int, rounds: int = 40) -> bool:
    """Miller-Rabin with fixed bases (error < 4^-40 for a composite)."""
    d, r = p - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in range(2, 2 + rounds):
        x = pow(a, d, p)
        if x in (1, p - 1):
            continue
        for _ in range(r - 1):
            x = pow(x, 2, p)
            if x == p - 1:
                break
        else:
            return False
    return True


def test_shamir_field_is_prime_and_holds_every_32_byte_secret():
    assert probably_prime(shamir.PRIME) and shamir.PRIME > 2**256
    assert not probably_prime(shamir.PRIME - 2)  # composite (PRIME is the next prime above 2^256)
    top = b"\xff" * 32
    assert shamir.reconstruct(shamir.share(top, [1, 2, 3], 2), 2) == top
    y = shamir.PRIME - 1
    assert shamir.int_from_share(shamir.share_to_bytes(y)) == y
    with pytest.raises(ValueError, match="not a field element"):
        shamir.int_from_share(shamir.share_to_bytes(shamir.PRIME))


def test_aead_refuses_a_wrong_key_or_wrong_associated_data():
    key, other = _crypto.random_bytes(), _crypto.random_bytes()
    sealed = _crypto.aead_seal(key, b"share bytes", b"from a to b")
    assert _crypto.aead_open(key, sealed, b"from a to b") == b"share bytes"
    with pytest.raises(ValueError, match="authentication failed"):
        _crypto.aead_open(other, sealed, b"from a to b")
    with pytest.raises(ValueError, match="authentication failed"):
        _crypto.aead_open(key, sealed, b"from b to a")


def test_prg_is_a_deterministic_keystream_of_uint64_words():
    key = _crypto.random_bytes()
    a, b = _crypto.prg_uint64(key, 1000), _crypto.prg_uint64(key, 1000)
    np.testing.assert_array_equal(a, b)
    assert a.dtype == np.uint64 and a.shape == (1000,)
    np.testing.assert_array_equal(_crypto.prg_uint64(key, 10), a[:10])  # a prefix
    # top bits of a keystream are balanced: 64,000 fair bits
    bits = np.unpackbits(a.view(np.uint8)).mean()
    assert abs(bits - 0.5) < 0.01


def test_missing_extra_gives_one_line_naming_the_install(monkeypatch):
    for name in [m for m in sys.modules if m == "cryptography" or m.startswith("cryptography.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "cryptography", None)
    monkeypatch.setattr(_crypto, "_LIB", None)  # forget the modules loaded by earlier tests
    config = SecAggConfig(threshold=2, encoding=FixedPoint(scale=2.0**10))
    msg = (r"^secure aggregation needs the 'cryptography' package, .* "
           r"pip install 'fedlatent\[privacy\]'$")
    with pytest.raises(ImportError, match=msg):
        SecAggClient("a", config)
    with pytest.raises(ImportError, match=msg):
        SecAggServer(config)


def test_fedlatent_imports_without_the_privacy_extra():
    code = ("import sys; sys.modules['cryptography'] = None; import fedlatent, "
            "fedlatent.engine.secagg; print('cryptography' in sys.modules and "
            "sys.modules['cryptography'] is not None)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_capacity_error_with_one_bound_for_every_field():
    with pytest.raises(ValueError, match=r"^every field: bound 1e\+06 x scale 1.09951e\+12 x 9 "):
        FixedPoint(scale=2.0**40, bound=1e6).check_capacity(9)
