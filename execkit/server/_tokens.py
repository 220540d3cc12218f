"""Bearer tokens for `execkit serve`: a file of SHA-256 hashes, each bound to an actor and
its roles (docs/remote.md, "Authentication").

The file holds `{"tokens": [{"sha256": HEX, "actor": NAME, "roles": [ROLE, ...]}]}`: the
hash of each token, never the token, so a copy of the file lets nobody in. `add_token`
makes a random token, stores its hash (the file owner-only, rewritten atomically under a
lock file beside it) and returns the token, which is shown once and never again.

The server reads the file at start-up and again whenever it changes (its inode, size or
modification time), so a token added or removed while the server runs takes effect at the
next request. A file that stops being readable or valid fails closed: every request is
refused (`StorageError`, 503) until it is fixed, so a typo in a revocation never leaves the
revoked token working. A tokens file that others can write is refused (`Forbidden`):
whoever can write it can mint themselves a token.

Pure standard library: `execkit serve --add-token` works without the server's extra.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import secrets
import stat
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import attrs

from execkit._errors import Forbidden, InvalidInput, NotFound, StorageError
from execkit._mask import mask_name
from execkit.ledger import KNOWN_ROLES

__all__ = ["Principal", "TokenFile", "add_token", "token_hash"]

_HEX64 = re.compile(r"[0-9a-f]{64}")
_MAX_TOKEN = 512
_MAX_ACTOR = 200
_FILE_MODE = 0o600
_DIR_MODE = 0o700
_TOKEN_PREFIX = "ekt_"
_MAX_CACHED = 1024


@attrs.frozen
class Principal:
    """Who a token stands for: the actor the ledger records, and the roles the token may
    exercise through the server (the ledger's own grants still apply beneath them)."""

    actor: str
    roles: frozenset[str]


def token_hash(token: str) -> str:
    """The SHA-256 (hex) a tokens file stores for `token`."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _check_actor(actor: object, where: str) -> str:
    if not isinstance(actor, str) or not actor.strip() or len(actor) > _MAX_ACTOR:
        raise InvalidInput(
            f"{where}: actor must be a non-empty name of at most {_MAX_ACTOR} characters, "
            f"got {actor!r}",
            field="actor",
        )
    if any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in actor):
        raise InvalidInput(f"{where}: actor must not hold control characters", field="actor")
    # Masked as the ledger masks every actor it stores: the name is written to the tokens
    # file and becomes the actor of every request the token makes.
    return mask_name(actor)


def _check_roles(roles: object, where: str) -> frozenset[str]:
    if not isinstance(roles, list | tuple | frozenset | set):
        raise InvalidInput(f"{where}: roles must be a list of role names", field="roles")
    unknown = sorted(str(role) for role in roles if role not in KNOWN_ROLES)
    if unknown:
        raise InvalidInput(
            f"{where}: unknown role(s) {', '.join(unknown)}; known: "
            f"{', '.join(sorted(KNOWN_ROLES))}",
            field="roles",
        )
    return frozenset(str(role) for role in roles)


def _parse(text: str, where: str) -> dict[str, Principal]:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise InvalidInput(f"{where} is not valid JSON: {exc}", field="tokens") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("tokens"), list):
        raise InvalidInput(
            f'{where} must hold one object {{"tokens": [...]}}', field="tokens"
        ) from None
    found: dict[str, Principal] = {}
    for index, entry in enumerate(doc["tokens"]):
        at = f"{where}: tokens[{index}]"
        if not isinstance(entry, dict) or set(entry) != {"sha256", "actor", "roles"}:
            raise InvalidInput(
                f'{at} must be an object with exactly "sha256", "actor" and "roles"',
                field="tokens",
            )
        digest = entry["sha256"]
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise InvalidInput(f"{at}: sha256 must be 64 lowercase hex digits", field="sha256")
        if digest in found:
            raise InvalidInput(f"{at}: the same token hash is listed twice", field="sha256")
        found[digest] = Principal(
            actor=_check_actor(entry["actor"], at), roles=_check_roles(entry["roles"], at)
        )
    return found


def _refuse_if_others_can_write(path: Path, info: os.stat_result) -> None:
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise Forbidden(
            f"tokens file {path} is writable by others (mode {stat.S_IMODE(info.st_mode):o}): "
            f"whoever can write it can give themselves a token; chmod 600 {path}"
        )


class TokenFile:
    """The tokens file a server authenticates with, re-read when it changes.

    Raises at construction when the file is missing, unreadable, invalid or writable by
    others; afterwards `lookup` raises `StorageError`/`Forbidden` while it is (fail closed).
    Thread-safe.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._where = os.fspath(self.path)  # os.stat on a str: no pathlib on each request
        self._lock = threading.Lock()
        self._seen: tuple[int, int, int, int] | None = None
        self._principals: dict[str, Principal] = {}
        self._digests: dict[str, str] = {}  # token -> its hash, for tokens found
        self._load()

    def _load(self) -> None:
        try:
            info = os.stat(self._where)
        except FileNotFoundError:
            raise NotFound(
                f"no tokens file at {self.path}: create one with `execkit serve --add-token` "
                "(see `execkit serve --help`)"
            ) from None
        except OSError as exc:
            raise StorageError(f"cannot read tokens file {self.path}: {exc}") from exc
        seen = (info.st_ino, info.st_size, info.st_mtime_ns, info.st_mode)
        if seen == self._seen:
            return
        _refuse_if_others_can_write(self.path, info)
        try:
            text = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise StorageError(f"cannot read tokens file {self.path}: {exc}") from exc
        self._principals = _parse(text, str(self.path))
        self._seen = seen

    def lookup(self, token: str) -> Principal | None:
        """The principal `token` stands for, or None for an unknown token. The file is
        checked for a change on every call; a token's hash is computed once per process
        (the first time it is found in the file) and kept in memory, never written."""
        if not token or len(token) > _MAX_TOKEN:
            return None
        # Keyed by the token itself: Python's string hash is keyed per process (SipHash),
        # so the string comparison behind a hit only runs for the token that is there, and
        # timing tells nothing of a stored token. Only found tokens are kept, at most
        # _MAX_CACHED: a stream of wrong guesses cannot grow it.
        digest = self._digests.get(token)
        if digest is None:
            digest = token_hash(token)
        with self._lock:
            try:
                self._load()
            except InvalidInput as exc:  # fail closed, with the reason (no token in it)
                self._seen = None
                self._principals = {}
                raise StorageError(f"the server's tokens file is invalid: {exc.message}") from None
            except (StorageError, Forbidden, NotFound):
                self._seen = None
                self._principals = {}
                raise
            found = self._principals.get(digest)
            if found is not None and token not in self._digests:
                if len(self._digests) >= _MAX_CACHED:
                    self._digests.clear()
                self._digests[token] = digest
        # The dict lookup compares hashes, not tokens: timing tells nothing of a token.
        return found

    def __len__(self) -> int:
        with self._lock:
            return len(self._principals)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    lock_path = path.with_name(path.name + ".lock")
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, _FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def add_token(path: str | os.PathLike[str], actor: str, roles: Iterable[str] = ()) -> str:
    """Make a new random token for `actor` with `roles`, store its hash in the tokens file
    at `path` (created owner-only, with an owner-only folder, if missing) and return it.

    The token is returned once: only its hash is kept. InvalidInput for a bad actor or an
    unknown role, nothing written.
    """
    target = Path(path)
    name = _check_actor(actor, "--actor")
    wanted = _check_roles(list(roles), "--role")
    token = _TOKEN_PREFIX + secrets.token_urlsafe(32)
    if target.is_dir():
        raise InvalidInput(f"{target} is a directory, not a tokens file", field="tokens")
    parent = target.parent
    try:
        if not parent.exists():
            parent.mkdir(parents=True, exist_ok=True)
            os.chmod(parent, _DIR_MODE)
        with _locked(target):
            entries: list[dict[str, Any]] = []
            if target.exists():
                _refuse_if_others_can_write(target, target.stat())
                text = target.read_text(encoding="utf-8")
                current = _parse(text, str(target))
                entries = [
                    {"sha256": digest, "actor": p.actor, "roles": sorted(p.roles)}
                    for digest, p in current.items()
                ]
            entries.append({"sha256": token_hash(token), "actor": name, "roles": sorted(wanted)})
            body = json.dumps({"tokens": entries}, indent=2, sort_keys=True) + "\n"
            temp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    out.write(body)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(temp, target)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(temp)
                raise
    except OSError as exc:
        raise StorageError(f"cannot write tokens file {target}: {exc}") from exc
    return token
