"""Huge kept tails, one per kind of output that costs the work after the exit differently.

tests/test_exec_tree.py counts that work on them (calls, decoded bytes) and
benchmarks/bench_exec.py times it against the floors below; both build their data here,
deterministically, so the two look at the same bytes.

- `random_bytes`: binary output. Kept as a count, not as text (see `TailBuffer.kept`).
- `log_lines`: plain log text holding the words redaction looks for, and no credential.
- `credential_log`: a log with a credential on every line, each line different (bearer
  headers, AWS keys, URL passwords, JSON passwords): every rule that masks has work.
- `wide_text`: valid UTF-8 that decodes to four bytes a character (an emoji every 100
  bytes) made of every character redaction looks for: every search runs, over the widest
  string the text can be.
"""

from __future__ import annotations

import random
import re
import string

_ALNUM = string.ascii_letters + string.digits
# Every character the redactor's literals and patterns are made of, and more.
_RULE_CHARACTERS = b"abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789:=-_./@\n\\\"'"


def random_bytes(size: int) -> bytes:
    return random.Random(7).randbytes(size)


def log_lines(size: int) -> bytes:
    line = b"2024-05-01T12:00:00Z worker[42] token count 5, Bearer of news, api done (ok)\n"
    return (line * (size // len(line) + 1))[:size]


def credential_log(size: int) -> bytes:
    rng = random.Random(3)

    def token(length: int) -> str:
        return "".join(rng.choices(_ALNUM, k=length))

    shapes = (
        lambda: f"INFO request ok id={token(8)}\n",
        lambda: f"DEBUG Authorization: Bearer {token(30)}\n",
        lambda: f"export AWS_SECRET_ACCESS_KEY={token(40)}\n",
        lambda: f"connecting to postgres://app:{token(12)}@db.internal:5432/app\n",
        lambda: f'  "password": "{token(12)}",\n',
    )
    lines: list[str] = []
    total = 0
    while total < size:
        line = rng.choice(shapes)()
        lines.append(line)
        total += len(line)
    return "".join(lines).encode()[:size]


def wide_text(size: int) -> bytes:
    data = bytearray(random.Random(9).choices(_RULE_CHARACTERS, k=size))
    emoji = "\U0001f680".encode()
    for at in range(0, size - len(emoji), 100):
        data[at : at + len(emoji)] = emoji
    return bytes(data)


_LAST_WORD = re.compile(r"[^ \n]+\n")
_ABSENT = "\0no such word\0"


def search_once(text: str) -> None:
    """The floor for looking at a text at all: one substring search over all of it (for
    a word it does not hold). The redactor's work is a number of such passes."""
    assert text.find(_ABSENT) < 0


def mask_last_words(text: str) -> str:
    """The floor for masking one credential per line: one `re.sub` (done in C, with a
    literal replacement) that masks the last word of every line."""
    return _LAST_WORD.sub("[REDACTED]\n", text)
