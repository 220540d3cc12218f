"""The ledger file itself: what a path may be before a connection is opened on it, and
files created owner-only (a ledger, its backups, its folder when execkit makes it).

A ledger holds reasons and audit rows that are nobody else's business, so execkit creates
the file 0600 and a missing folder 0700. An existing file is never re-initialised, an
empty one included (it may be a truncated ledger): only `init` (`execkit db init`) makes an
empty file a ledger. A directory, or a path through a file, is InvalidInput; a path that
cannot be reached or created is a StorageError.

Like ssh with a private key, execkit refuses (StorageError, nothing opened) a ledger that
another user could change under it: anything but a regular file (a FIFO would hang the
open, a device is not a ledger), a file others may write, a folder others may write
(without the sticky bit they can replace the file and own what it says; with it they can
still plant the `-wal`, `-shm` or `-journal` file SQLite would read, so those must be
regular files that others may not write, of the ledger's owner, of this user or of the
ledger's group, when they exist). Group write is left alone: a group sharing one ledger on
one host is a documented setup, and any member may have created the sidecars.
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path

from execkit._errors import InvalidInput, NotFound, StorageError

__all__ = ["create_owner_only", "prepare_file", "refuse_loose_permissions"]

_SIDECARS = ("-wal", "-shm", "-journal")

# Owner-only: a ledger holds reasons and audit rows that are nobody else's business.
_FILE_MODE = 0o600
_DIR_MODE = 0o700


def create_owner_only(path: Path) -> None:
    """Make an empty file at `path` readable and writable by its owner only (and its
    folder, when execkit creates it, enterable by its owner only)."""
    parent = path.parent
    if not parent.exists():
        parent.mkdir(parents=True, exist_ok=True)
        os.chmod(parent, _DIR_MODE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
    os.close(fd)


def prepare_file(path: Path, *, create: bool, init: bool) -> None:
    """Check what is at `path` before the store connects to it, creating an empty
    owner-only file where nothing is when `create` or `init` allows it (see the module
    docstring); NotFound when nothing is there and neither does."""
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    except NotADirectoryError:
        raise InvalidInput(
            f"{path}: a parent of the ledger path is a file, not a folder", field="path"
        ) from None
    except OSError as exc:
        raise StorageError(f"cannot reach ledger database {path}: {exc}") from exc
    if info is None:
        if not (create or init):
            # The fix named: a new user's first `execkit status` lands here.
            raise NotFound(
                f"no ledger database at {path}; `execkit db init --db {shlex.quote(str(path))}` "
                "makes a new one there, or name the one you meant with --db or $EXECKIT_DB"
            )
        try:
            create_owner_only(path)
        except (FileExistsError, NotADirectoryError):
            raise InvalidInput(
                f"{path}: a parent of the ledger path is a file, not a folder", field="path"
            ) from None
        except OSError as exc:
            raise StorageError(f"cannot create ledger database {path}: {exc}") from exc
        return
    if stat.S_ISDIR(info.st_mode):
        raise InvalidInput(f"{path} is a directory, not a ledger file", field="path")
    if not stat.S_ISREG(info.st_mode):
        raise StorageError(
            f"{path} is not a regular file (a FIFO, a device or a socket), not an execkit ledger"
        )
    refuse_loose_permissions(path, info)
    if info.st_size == 0 and not init:
        raise StorageError(
            f"{path} is an empty file, not an execkit ledger (a truncated one?): execkit "
            f"will not silently start a new ledger over it; `execkit db init --db {path}` "
            "makes it a new, empty ledger"
        )


def refuse_loose_permissions(path: Path, info: os.stat_result) -> None:
    """StorageError when another user could change the ledger at `path` (its `stat` is
    `info`): the file or its folder writable by others, or a sidecar SQLite would read that
    is not a regular file of the ledger's owner (see the module docstring)."""
    mode = stat.S_IMODE(info.st_mode)
    if mode & stat.S_IWOTH:
        raise StorageError(
            f"ledger {path} is writable by other users (mode {mode:o}): anyone could add a "
            f"grant or rewrite its history; execkit refuses it (chmod o-w {path})"
        )
    folder = path.parent
    try:
        where = folder.stat()
    except OSError as exc:
        raise StorageError(f"cannot reach the folder of ledger {path}: {exc}") from exc
    folder_mode = stat.S_IMODE(where.st_mode)
    if folder_mode & stat.S_IWOTH and not folder_mode & stat.S_ISVTX:
        raise StorageError(
            f"the folder of ledger {path} is writable by other users (mode {folder_mode:o}): "
            f"anyone could replace the ledger; execkit refuses it (chmod o-w {folder})"
        )
    for suffix in _SIDECARS:
        sidecar = path.with_name(path.name + suffix)
        try:
            side = sidecar.lstat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StorageError(f"cannot reach {sidecar}: {exc}") from exc
        side_mode = stat.S_IMODE(side.st_mode)
        ours = side.st_uid in (info.st_uid, os.geteuid()) or side.st_gid == info.st_gid
        if not stat.S_ISREG(side.st_mode) or not ours or side_mode & stat.S_IWOTH:
            raise StorageError(
                f"{sidecar} is not a regular file of the ledger's owner, user or group that "
                "others may not write: another user could have planted it; execkit refuses "
                "the ledger (remove it once no execkit is running on the ledger)"
            )
