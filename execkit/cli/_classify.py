"""`execkit classify [FILE|-] [--json]`: class a failure transcript as work or upstream.

Only the tail of the input is kept (the classifier reads the last `TAIL_CHARS` characters),
so a huge file or pipe costs bounded memory. Bytes are decoded as UTF-8 with replacement:
any input classifies, none raises.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, BinaryIO

from execkit._classify import TAIL_CHARS, classify_text
from execkit._errors import ExecKitError, InvalidInput, NotFound
from execkit.cli._output import emit, print_json, safe_text

# A UTF-8 character is at most 4 bytes, so this many bytes always hold TAIL_CHARS characters.
_TAIL_BYTES = 4 * TAIL_CHARS
_CHUNK_BYTES = 64 * 1024


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `execkit classify`."""
    parser = sub.add_parser(
        "classify",
        help="class a failure text: upstream (uncharged) or work (charged)",
        description=(
            "Read a failure transcript and print its class and reason. Text alone is never "
            "environment: that class needs the spawn errno, which only `execkit run` sees."
        ),
    )
    parser.add_argument(
        "file",
        nargs="?",
        default="-",
        metavar="FILE",
        help="the transcript to read; '-' or nothing reads stdin",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help='print one object {"class": ..., "reason": ..., "evidence": ...}',
    )
    parser.set_defaults(handler=_handle)


def _handle(args: argparse.Namespace) -> int:
    verdict = classify_text(_read_tail(args.file))
    if args.json:
        print_json(verdict.to_dict())
    else:
        # The reason and evidence quote the transcript: escape its control characters.
        lines = [f"{verdict.failure_class.value}: {safe_text(verdict.reason)}"]
        if verdict.evidence:
            lines.append(f"evidence: {safe_text(verdict.evidence)}")
        emit("\n".join(lines))
    return 0


def _read_tail(path: str) -> str:
    """The last `_TAIL_BYTES` of FILE (or stdin for '-'), decoded UTF-8 with replacement."""
    if path == "-":
        return _stream_tail(sys.stdin.buffer).decode("utf-8", errors="replace")
    try:
        with open(path, "rb") as stream:
            size = os.fstat(stream.fileno()).st_size
            if size > _TAIL_BYTES:
                stream.seek(size - _TAIL_BYTES)
            data = _stream_tail(stream)
    except FileNotFoundError:
        raise NotFound(f"FILE not found: {path}") from None
    except IsADirectoryError:
        raise InvalidInput(
            f"FILE must be a file or '-', got the directory {path}", field="FILE"
        ) from None
    except OSError as exc:
        raise ExecKitError(f"cannot read FILE {path}: {exc.strerror or exc}") from None
    return data.decode("utf-8", errors="replace")


def _stream_tail(stream: BinaryIO) -> bytes:
    # A pipe cannot seek: read it through, keeping only the last _TAIL_BYTES.
    tail = bytearray()
    while chunk := stream.read(_CHUNK_BYTES):
        tail += chunk
        if len(tail) > 2 * _TAIL_BYTES:
            del tail[:-_TAIL_BYTES]
    return bytes(tail[-_TAIL_BYTES:])
