"""The pair masks' keystream through AES-GCM objects made once per fit (``_crypto.ctr_rows``):
the bytes of ``cryptography``'s AES-256-CTR and of a fresh AES-GCM encryption of zeros,
whatever the length, with no state carried from one exchange's call to the next; a client's
neighbourhood makes each pair's object once and answers by position as by name."""

import os

import numpy as np
import pytest

pytest.importorskip("cryptography")

from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes  # noqa: E402
from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: E402

from fedlatent.engine.secagg import FixedPoint, SecAggConfig, _crypto, setup  # noqa: E402
from fedlatent.engine.secagg.protocol import exchange_label  # noqa: E402
from tolerance import assert_same  # noqa: E402


def ctr_words(key: bytes, nonce: bytes, n: int) -> np.ndarray:
    """``n`` little-endian words of AES-256-CTR from counter block ``nonce || 2``."""
    enc = Cipher(algorithms.AES(key), modes.CTR(nonce + (2).to_bytes(4, "big"))).encryptor()
    return np.frombuffer(enc.update(bytes(8 * n)), "<u8").astype(np.uint64)


def gcm_words(key: bytes, nonce: bytes, n: int) -> np.ndarray:
    """The same from a fresh AES-GCM encryption of zeros, its tag dropped."""
    return np.frombuffer(AESGCM(key).encrypt(nonce, bytes(8 * n), None)[:8 * n], "<u8")


@pytest.mark.parametrize("n", [1, 2, 3, 7, 68, 69, 70, 257])
def test_rows_are_the_aes_ctr_keystream_of_each_key(n):
    keys = [os.urandom(32) for _ in range(4)]
    nonce = os.urandom(12)
    got = _crypto.ctr_rows(_crypto.ctr_streams(keys), n, nonce)
    assert got.dtype == np.uint64 and got.shape == (4, n)
    for row, key in zip(got, keys):
        # exact: the same AES keystream bytes, read as integers
        assert_same(row, ctr_words(key, nonce, n))
        assert_same(row, gcm_words(key, nonce, n))


def test_a_context_carries_nothing_from_one_exchange_to_the_next():
    """One context per pair for the whole fit: interleaved exchanges (other nonces, other
    lengths) give each the rows a fresh context gives."""
    keys = [os.urandom(32) for _ in range(3)]
    kept = _crypto.ctr_streams(keys)
    for n, nonce in [(5, os.urandom(12)), (70, os.urandom(12)), (5, os.urandom(12)),
                     (33, os.urandom(12))]:
        # exact: integers from the same AES keystream
        assert_same(_crypto.ctr_rows(kept, n, nonce),
                    _crypto.ctr_rows(_crypto.ctr_streams(keys), n, nonce))
    assert _crypto.ctr_rows([], 4, os.urandom(12)).shape == (0, 4)
    with pytest.raises(ValueError, match="a 12-byte nonce"):
        _crypto.ctr_rows(kept, 4, b"short")


def test_a_client_makes_each_pairs_context_once_and_masks_by_position_as_by_name(monkeypatch):
    ids = [f"c{i}" for i in range(6)]
    _, clients = setup(ids, SecAggConfig(4, FixedPoint(scale=2.0**20, bound=100.0), slots=3))
    made = []
    real = _crypto.ctr_streams
    monkeypatch.setattr(_crypto, "ctr_streams", lambda keys: made.append(len(keys)) or real(keys))
    c = clients["c2"]
    label = exchange_label(1, "estep")
    first = c._pair_masks(["c0", "c4"], label, 9, 0)
    again = c._pair_masks(["c0", "c1", "c4", "c5"], label, 9, 0)
    assert made == [2, 2]  # c0 and c4 once, then only c1 and c5
    # exact: the same objects, the same keystream
    assert_same(again[[0, 2]], first)
    for row, v in zip(again, ["c0", "c1", "c4", "c5"]):
        assert_same(row, ctr_words(c._pair_block(v)[32:], _pair_nonce(label), 9))
    pos = c._near().at(["c1", "c5"])
    assert pos.tolist() == [1, 5]
    assert_same(c._pair_rows(pos, label, 9, 0), again[[1, 3]])


def _pair_nonce(label: bytes) -> bytes:
    from fedlatent.engine.secagg.protocol import pair_nonce

    return pair_nonce(label, 0)
