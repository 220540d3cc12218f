"""The ledger file itself: what a path may be before a connection is opened on it, and
files created owner-only (a ledger, its backups, its folder when execkit makes it).

A ledger holds reasons and audit rows that are nobody else's business, so execkit creates
the file 0600 and a missing folder 0700. An existing file is never re-initialised, an
empty one included (it may be a truncated ledger): only `init` (`execkit db init`) makes an
empty file a ledger. A directory, or a path through a file, is InvalidInput; a path that
cannot be reached or created is a StorageError.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from execkit._errors import InvalidInput, NotFound, StorageError

__all__ = ["create_owner_only", "prepare_file"]

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
            raise NotFound(f"no ledger database at {path}")
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
    if info.st_size == 0 and not init:
        raise StorageError(
            f"{path} is an empty file, not an execkit ledger (a truncated one?): execkit "
            f"will not silently start a new ledger over it; `execkit db init --db {path}` "
            "makes it a new, empty ledger"
        )
