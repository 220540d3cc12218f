"""One text: `redact` and `redact_argv`, the three phases done the cheapest way that gives
the same output.

Phase 1 replaces the literal secrets in the text, longest first. A text too short for any
pattern, or whose gate finds no anchor, is done. Phase 3 is looked for next, in the text as
phase 1 left it: when it finds nothing (almost always), phase 2 runs as plain string
replacements (`engine.reference_rules`); when it finds something, phase 2 runs as a trace
(trace.py) so that phase 3's spans, which are offsets in phase 1's output, can be laid on
top of phase 2's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from execkit._redact.engine import extra_spans, literal_secrets, reference_rules
from execkit._redact.gate import Gate
from execkit._redact.record import REDACTED
from execkit._redact.shapes import SECRET_FLAG_ITEM
from execkit._redact.trace import Trace, mask_more, render

__all__ = ["SHORTEST_MATCH", "redact", "redact_argv", "redact_text"]

# No pattern matches fewer characters (`://:p@`): shorter texts only hold literal secrets.
SHORTEST_MATCH = 6


def redact_text(text: str, secrets: Sequence[str]) -> str:
    """`redact(text)`, the secrets as `engine.literal_secrets` gives them."""
    if secrets:
        for secret in secrets:  # phase 1, as the reference does it
            if secret in text:
                text = text.replace(secret, REDACTED)
    elif len(text) < SHORTEST_MATCH:
        return text
    gate = Gate(text)
    if gate.empty:
        return text
    extra = extra_spans(text, gate, secrets)
    if not extra:
        return reference_rules(text, gate)
    # Phase 3 masks something: phase 2 has to remember where its output came from.
    trace = Trace(text, gate, track_matches=False)
    trace.reference_phases(())
    pieces = mask_more(trace.pieces, [(start, end) for _, _, start, end in extra])
    return render(pieces, text)


def redact(text: str, extra_secrets: Iterable[str] = ()) -> str:
    """`text` with credentials replaced by `[REDACTED]`.

    Masks the literal `extra_secrets` (longest first, so a secret containing another is
    masked whole; empty strings and parts of the marker are ignored), then vendor key
    shapes, then values that follow a secret-sounding name, header or flag, then the
    shapes listed in the package docstring. Idempotent: redacting twice changes nothing
    more.
    """
    return redact_text(text, literal_secrets(extra_secrets))


def redact_argv(argv: Sequence[str], extra_secrets: Iterable[str] = ()) -> tuple[str, ...]:
    """Each argument redacted, and the argument after a bare secret flag masked whole.

    `["--api-key", "abc"]` stores as `["--api-key", "[REDACTED]"]`: the value stands alone,
    so no in-text pattern could see its name.
    """
    secrets = literal_secrets(extra_secrets)
    out: list[str] = []
    mask_next = False
    for item in argv:
        if mask_next and item:
            out.append(REDACTED)
        else:
            out.append(redact_text(item, secrets))
        mask_next = SECRET_FLAG_ITEM.fullmatch(item) is not None
    return tuple(out)
