"""A site's long-term signing key and the consortium roster it pins: authenticated peers.

Each site (a data holder: a Flower SuperNode, or a :class:`~fedlatent.engine.node.client.ClientNode`
in process) holds one long-term Ed25519 key pair (:class:`SiteKeys`, a PEM file written by
``fedlatent site keygen DIR``). The consortium agrees on a **roster**, a JSON file mapping each
site's id (the client id it answers as) to its public key (:class:`Roster`), distributed out of
band and pinned by every site (compare :meth:`Roster.fingerprint` on a call between operators).
With a roster, a site believes only what a rostered site signed:

- secure aggregation: every site signs its key-agreement public keys, bound to the run and the
  set-up round; a peer whose keys are unsigned, unknown to the roster or signed by another key
  aborts the set-up, naming the peer (:mod:`fedlatent.engine.secagg`);
- SEC: a model a site evaluates must be signed by a rostered site for this run, and a per-run
  quota bounds how many distinct models it evaluates (:mod:`fedlatent.models.sec`);
- saved model files and site states carry an Ed25519 signature of their content, verified on
  load against a roster (:mod:`fedlatent.engine.fedem.checkpoint`).

What is signed is a *statement*: a fixed prefix, a purpose (``"secagg-keys"``, ``"sec-model"``,
``"saved-file"``), a JSON context (run, round, signer...) and the payload bytes, so that a
signature made for one purpose, run or round never verifies for another (no replay across
them). Primitives come from ``cryptography`` (``fedlatent[privacy]``), imported on first use;
nothing here is home-made.

Many statements share one purpose and context and differ in their payload (every site's keys
of one set-up, every survivor's consistency statement of one exchange): :func:`statement_head`
builds their common prefix once, ``statement(p, c, payload) == statement_head(p, c) +
payload``, and :meth:`SiteKeys.sign_bytes` / :func:`verify_bytes` sign and verify such bytes.
:func:`verify_bytes` remembers, per process, the (public key, message, signature) triples it
found valid: a pure function of public inputs, so the sites one process holds (the in-process
and simulation runtimes) verify each signature once between them instead of once each; a
triple not remembered is verified by ``cryptography``.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

__all__ = ["AuthenticationError", "KEY_FILE", "PUBLIC_FILE", "ROSTER_FORMAT", "Roster",
           "SiteIdentity", "SiteKeys", "sign", "statement", "statement_head", "verify",
           "verify_bytes"]

#: the file names ``fedlatent site keygen DIR`` writes
KEY_FILE, PUBLIC_FILE = "site-key.pem", "site-key.pub"
#: the ``format`` field of a roster file
ROSTER_FORMAT = "fedlatent-roster/1"
SIGNATURE_BYTES = 64
_PREFIX = b"fedlatent/site-signature/v1\x00"
_MISSING = ("site keys need the 'cryptography' package, which is not installed; install it with: "
            "pip install 'fedlatent[privacy]'")


class AuthenticationError(ValueError):
    """A signature is missing, made by a key the roster does not hold, or does not verify; the
    message names the peer (or file) and what to do."""


def _lib():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:  # pragma: no cover - the extra is installed in CI
        raise ImportError(_MISSING) from exc
    return InvalidSignature, serialization, ed25519


def statement(purpose: str, context: Mapping[str, Any], payload: bytes = b"") -> bytes:
    """The bytes a site signs: prefix, ``purpose``, canonical JSON of ``context``, ``payload``.

    Parameters
    ----------
    purpose : str
        What the signature is for (``"secagg-keys"``, ``"sec-model"``, ``"saved-file"``).
    context : mapping
        JSON-serializable context bound into the signature (signer, run, round...).
    payload : bytes
        The signed content (public keys, a model's bytes, a file's digest).
    """
    return statement_head(purpose, context) + bytes(payload)


def statement_head(purpose: str, context: Mapping[str, Any]) -> bytes:
    """:func:`statement` without its payload: ``statement(purpose, context, payload) ==
    statement_head(purpose, context) + payload``."""
    ctx = json.dumps(dict(context), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return _PREFIX + str(purpose).encode() + b"\x00" + ctx.encode() + b"\x00"


#: (raw public key, message, signature) triples found valid in this process (small messages
#: only), cleared when it holds :data:`_MEMO_SIZE` of them
_VERIFIED: set[tuple[bytes, bytes, bytes]] = set()
_MEMO_SIZE, _MEMO_BYTES = 1 << 18, 1 << 14


def _ed25519_public(raw: bytes):
    """The Ed25519 public key object of 32 raw bytes (parsed once per process)."""
    got = _PUBLIC.get(raw)
    if got is None:
        if len(_PUBLIC) >= _MEMO_SIZE:
            _PUBLIC.clear()
        got = _PUBLIC[raw] = _lib()[2].Ed25519PublicKey.from_public_bytes(raw)
    return got


_PUBLIC: dict[bytes, Any] = {}


def verify_bytes(public_raw: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is the Ed25519 signature of ``message`` by the key whose raw 32
    bytes are ``public_raw`` (a valid triple of at most 16 KB is remembered: see the module
    docstring)."""
    key = (bytes(public_raw), bytes(message), bytes(signature))
    if key in _VERIFIED:
        return True
    if len(key[2]) != SIGNATURE_BYTES or not any(key[2]):
        return False
    invalid = _lib()[0]
    try:
        _ed25519_public(key[0]).verify(key[2], key[1])
    except invalid:
        return False
    if len(key[1]) <= _MEMO_BYTES:
        if len(_VERIFIED) >= _MEMO_SIZE:
            _VERIFIED.clear()
        _VERIFIED.add(key)
    return True


def _public_raw(key) -> bytes:
    _, serialization, _ = _lib()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


class SiteKeys:
    """A site's long-term Ed25519 signing key.

    Parameters
    ----------
    private_key : cryptography Ed25519PrivateKey
        Use :meth:`generate` or :meth:`load` rather than building one.
    """

    def __init__(self, private_key):
        self._key = private_key

    @classmethod
    def generate(cls) -> SiteKeys:
        """A fresh key pair from the operating system's randomness."""
        return cls(_lib()[2].Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: str | os.PathLike, password: bytes | None = None) -> SiteKeys:
        """The key of a PEM file (PKCS#8, as :meth:`save` and ``fedlatent site keygen`` write).

        Raises
        ------
        FileNotFoundError
            No file at ``path``.
        ValueError
            The file is not an Ed25519 private key in PEM (or the password is wrong).
        """
        _, serialization, ed25519 = _lib()
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"site signing key {path} does not exist; create one with "
                                    "'fedlatent site keygen DIR' and name it in the site policy")
        try:
            key = serialization.load_pem_private_key(path.read_bytes(), password=password)
        except (ValueError, TypeError) as err:
            raise ValueError(f"site signing key {path} is not a readable PEM private key "
                             f"({err})") from err
        if not isinstance(key, ed25519.Ed25519PrivateKey):
            raise ValueError(f"site signing key {path} holds a {type(key).__name__}, not an "
                             "Ed25519 key; create one with 'fedlatent site keygen DIR'")
        return cls(key)

    def save(self, path: str | os.PathLike, password: bytes | None = None) -> Path:
        """Write the private key as PEM (PKCS#8; encrypted when ``password`` is given), readable
        by its owner only; refuses to overwrite an existing file."""
        _, serialization, _ = _lib()
        path = Path(path)
        enc = (serialization.BestAvailableEncryption(password) if password
               else serialization.NoEncryption())
        data = self._key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8, enc)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return path

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key."""
        return _public_raw(self._key.public_key())

    @property
    def public_b64(self) -> str:
        """The public key in base64, as a roster lists it."""
        return base64.b64encode(self.public_key).decode()

    def public_pem(self) -> str:
        """The public key as PEM (SubjectPublicKeyInfo)."""
        _, serialization, _ = _lib()
        return self._key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()

    def sign(self, purpose: str, context: Mapping[str, Any], payload: bytes = b"") -> bytes:
        """The 64-byte Ed25519 signature of :func:`statement` ``(purpose, context, payload)``."""
        return self._key.sign(statement(purpose, context, payload))

    def sign_bytes(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of a statement already built
        (:func:`statement_head` + payload)."""
        return self._key.sign(bytes(message))


def _decode_public(site: str, text: Any, where: str):
    """The Ed25519 public key object of a roster entry (base64 of 32 raw bytes, or PEM)."""
    _, serialization, ed25519 = _lib()
    if not isinstance(text, str):
        raise ValueError(f"{where}: the key of site {site!r} is not a string (base64 or PEM)")
    try:
        if "BEGIN" in text:
            key = serialization.load_pem_public_key(text.encode())
            if not isinstance(key, ed25519.Ed25519PublicKey):
                raise ValueError(f"a {type(key).__name__}, not Ed25519")
            return key
        raw = base64.b64decode(text.strip(), validate=True)
        return ed25519.Ed25519PublicKey.from_public_bytes(raw)
    except (ValueError, binascii.Error) as err:
        raise ValueError(f"{where}: the key of site {site!r} is not an Ed25519 public key in "
                         f"base64 (32 bytes) or PEM ({err})") from err


class Roster:
    """The consortium's sites and their public keys, as a site pins them.

    Parameters
    ----------
    keys : mapping of str to (bytes or str)
        Site id -> raw 32-byte public key, its base64, or PEM.
    """

    def __init__(self, keys: Mapping[str, Any], *, where: str = "roster"):
        if not keys:
            raise ValueError(f"{where} lists no site; list every site of the consortium")
        self._keys = {}
        self._raw: dict[str, bytes] = {}  # each site's raw key, once asked
        for site, k in keys.items():
            text = base64.b64encode(k).decode() if isinstance(k, bytes) else k
            self._keys[str(site)] = _decode_public(str(site), text, where)
        raws = [_public_raw(k) for k in self._keys.values()]
        if len(set(raws)) != len(raws):
            raise ValueError(f"{where} lists one public key for two sites; every site has its "
                             "own key")

    @classmethod
    def load(cls, path: str | os.PathLike) -> Roster:
        """Read a roster file: ``{"format": "fedlatent-roster/1", "sites": {id: key}}``."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"roster {path} does not exist; the consortium distributes "
                                    "it, each site names it in its policy")
        try:
            doc = json.loads(path.read_text())
        except ValueError as err:
            raise ValueError(f"roster {path} is not JSON ({err})") from err
        if not isinstance(doc, dict) or doc.get("format") != ROSTER_FORMAT \
                or not isinstance(doc.get("sites"), dict):
            raise ValueError(f"roster {path} must be a JSON object with \"format\": "
                             f"\"{ROSTER_FORMAT}\" and \"sites\": {{site id: public key}}")
        return cls(doc["sites"], where=f"roster {path}")

    def to_json(self) -> str:
        """The roster file's text (keys in base64)."""
        sites = {s: base64.b64encode(_public_raw(self._keys[s])).decode() for s in self.sites}
        return json.dumps({"format": ROSTER_FORMAT, "sites": sites}, indent=1) + "\n"

    @property
    def sites(self) -> tuple[str, ...]:
        """The rostered site ids, sorted."""
        return tuple(sorted(self._keys))

    def __contains__(self, site: object) -> bool:
        return str(site) in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def fingerprint(self) -> str:
        """SHA-256 of the sorted (site, raw key) list: what operators compare out of band."""
        h = hashlib.sha256()
        for s in self.sites:
            h.update(s.encode() + b"\x00" + _public_raw(self._keys[s]))
        return h.hexdigest()

    def verify(self, site: str, signature: bytes, purpose: str, context: Mapping[str, Any],
               payload: bytes = b"", *, what: str = "a message") -> None:
        """Raise :class:`AuthenticationError` unless ``signature`` is ``site``'s rostered key's
        signature of :func:`statement` ``(purpose, context, payload)``."""
        self.verify_message(site, signature, statement(purpose, context, payload), what=what)

    def public_raw(self, site: str) -> bytes | None:
        """The raw 32 bytes of ``site``'s rostered key (None: not rostered)."""
        site = str(site)
        got = self._raw.get(site)
        if got is None:
            key = self._keys.get(site)
            if key is None:
                return None
            got = self._raw[site] = _public_raw(key)
        return got

    def verify_message(self, site: str, signature: bytes, message: bytes, *,
                       what: str = "a message") -> None:
        """:meth:`verify` of a statement already built (:func:`statement_head` + payload),
        through :func:`verify_bytes`."""
        site = str(site)
        raw = self.public_raw(site)
        if raw is None:
            raise AuthenticationError(
                f"{what} claims to come from site {site!r}, which is not in the pinned roster "
                f"({len(self)} sites); a site not in the roster is not trusted")
        sig = bytes(signature)
        if len(sig) != SIGNATURE_BYTES or not any(sig):
            raise AuthenticationError(f"{what} from site {site!r} carries no signature; the "
                                      f"site must sign it with its key (site-key.pem)")
        if not verify_bytes(raw, sig, message):
            raise AuthenticationError(
                f"{what} from site {site!r} does not verify against its rostered key: it was "
                "substituted or altered (or signed for another run); aborting")


def sign(keys: SiteKeys, purpose: str, context: Mapping[str, Any], payload: bytes = b"") -> bytes:
    """``keys.sign(purpose, context, payload)`` (a function, for symmetry with :func:`verify`)."""
    return keys.sign(purpose, context, payload)


def verify(roster: Roster, site: str, signature: bytes, purpose: str,
           context: Mapping[str, Any], payload: bytes = b"", *, what: str = "a message") -> None:
    """``roster.verify(...)``: raise :class:`AuthenticationError` unless the signature holds."""
    roster.verify(site, signature, purpose, context, payload, what=what)


@dataclass(frozen=True)
class SiteIdentity:
    """What a site brings to authenticate itself and its peers.

    Attributes
    ----------
    keys : SiteKeys or None
        The site's signing key: it signs its key-agreement keys, its SEC model, its saved files.
    roster : Roster or None
        The pinned roster: with one, the site accepts only what rostered sites signed. None:
        today's behaviour (an honest-but-curious server is assumed; nothing is verified).
    sec_quota : int or None
        Most distinct SEC models the site evaluates per run; None: one per rostered site.
    site : str or None
        The site's id (the client id it answers as; the roster lists it under this id). The
        client node binds it (:meth:`for_site`).
    """

    keys: SiteKeys | None = None
    roster: Roster | None = None
    sec_quota: int | None = None
    site: str | None = None
    _runs: set = field(default_factory=set, compare=False, repr=False)

    def for_site(self, site: str) -> SiteIdentity:
        """This identity bound to the client id ``site`` (its record of set-up runs shared)."""
        if self.site is not None and self.site != str(site):
            raise ValueError(f"the site identity of {self.site!r} is given to client "
                             f"{str(site)!r}; give each client its own site's key")
        return replace(self, site=str(site))

    @classmethod
    def from_paths(cls, signing_key: str | os.PathLike | None = None,
                   roster: str | os.PathLike | None = None,
                   sec_quota: int | None = None, site: str | None = None) -> SiteIdentity:
        """The identity of a site policy's ``signing-key`` and ``roster`` paths."""
        return cls(None if signing_key is None else SiteKeys.load(signing_key),
                   None if roster is None else Roster.load(roster), sec_quota, site)

    @property
    def quota(self) -> int | None:
        """The SEC quota in force: ``sec_quota``, else the roster's size, else None (no limit)."""
        if self.sec_quota is not None:
            return int(self.sec_quota)
        return None if self.roster is None else len(self.roster)

    def claim_run(self, site: str, run: str, what: str) -> None:
        """Refuse a second key set-up of the same run on this site (a replay of old keys)."""
        key = (str(site), str(run))
        if key in self._runs:
            raise AuthenticationError(f"site {site!r}: {what} for run {run!r} was already done "
                                      "once; a run's keys are set up once (a replay?)")
        self._runs.add(key)
