"""Phase 1 and the hand-over to the rest: the literal secrets masked, longest first, then
the pattern phases (trace.py), imported on first use. The front functions (front.py) and the
cut-tail handling (tail.py) both redact a whole text this way, so it sits below both.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence

from execkit._redact.words import REDACTED

__all__ = ["SHORTEST_MATCH", "literal_secrets", "redact_text"]

# No pattern matches fewer characters (`://:p@`): shorter texts only hold literal secrets.
SHORTEST_MATCH = 6

_Redaction = Callable[[str, Sequence[str]], str]


@functools.cache
def _later_phases() -> _Redaction:
    from execkit._redact.trace import later_phases

    return later_phases


def literal_secrets(extra_secrets: Iterable[str]) -> list[str]:
    """Phase 1's secrets, longest first. A "secret" inside the marker itself would re-mask
    its own output forever. Built as the reference builds it, so equal-length secrets come
    in the same order."""
    literal = {s for s in extra_secrets if s and s not in REDACTED}
    return sorted(literal, key=len, reverse=True)


def redact_text(text: str, secrets: Sequence[str]) -> str:
    """`redact(text)`, the secrets as `literal_secrets` gives them."""
    if secrets:
        for secret in secrets:  # phase 1, as the reference does it
            if secret in text:
                text = text.replace(secret, REDACTED)
    elif len(text) < SHORTEST_MATCH:
        return text
    return _later_phases()(text, secrets)
