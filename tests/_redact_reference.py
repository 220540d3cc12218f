"""FROZEN REFERENCE: `execkit._redact` exactly as it was before the coverage and speed work.

Do not edit this module, and never import it from `execkit`: it is the yardstick the
new redactor is compared against (tests/test_redact.py, benchmarks/bench_redact.py). Its
code is the old module's, copied verbatim (last changed in commit 697a636) apart from
this docstring; the new `redact` and `redact_tail` must give the same output wherever this
one already masked correctly, and may only mask more where a new credential shape is
recognised.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

__all__ = [
    "MIN_ENV_SECRET_LEN",
    "REDACTED",
    "looks_secret_name",
    "redact",
    "redact_argv",
    "redact_tail",
    "secret_env_values",
]

REDACTED = "[REDACTED]"

# Values shorter than this are not treated as secrets when collected from an environment:
# masking every "1" or "true" would shred the text without protecting anything.
MIN_ENV_SECRET_LEN = 8

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)

# Vendor key shapes. The negative look-behind keeps `task-...` or `disk-...` from matching
# the `sk-` prefix.
_VENDOR_KEYS = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"sk-[A-Za-z0-9_\-]{16,}"  # OpenAI sk-..., sk-proj-..., Anthropic sk-ant-...
    r"|AIza[A-Za-z0-9_\-]{30,}"  # Google API keys
    r"|gh[pousr]_[A-Za-z0-9]{20,}"  # GitHub tokens
    r"|github_pat_[A-Za-z0-9_]{20,}"
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}"  # Slack tokens
    r")"
)

# `Authorization: Bearer x`, `Authorization: token x`, `authorization=x`: the credential.
_AUTH_HEADER = re.compile(
    r"(?i)(\bauthorization[\"']?[ \t]{0,8}[:=][ \t]{0,8}[\"']?"
    r"(?:(?:bearer|basic|token|bot)[ \t]{1,8})?)"
    r"[^\s\"',;]+"
)

# A bare `Bearer <token>` anywhere else (curl traces, logged headers).
_BEARER = re.compile(r"(?i)(\bbearer[ \t]{1,8})[A-Za-z0-9\-._~+/]{8,}=*")

# `NAME=value`, `NAME: value`, `"name": "value"` where NAME ends in a secret-sounding word
# (`OPENAI_API_KEY`, `GITHUB_TOKEN`, `client_secret`, `apiKey`, `password`). The name's
# prefix is irrelevant to the match, which is what keeps this linear; requiring the word
# to END the name keeps `token_count=5` and `max_tokens=4096` readable.
_KEY_VALUE = re.compile(
    r"(?i)((?:api[_\-]?key|access[_\-]?key|secret[_\-]?key|private[_\-]?key"
    r"|token|secret|password|passwd|credentials?)"
    r"[\"']?[ \t]{0,8}[:=][ \t]{0,8}[\"']?)"
    r"[^\s\"',;&]+"
)

# `--api-key VALUE` / `--token=VALUE` on a logged command line.
_SECRET_FLAG = re.compile(
    r"(?i)(--?(?:api[_\-]?key|access[_\-]?key|token|secret|password|passwd)(?:[ \t]{1,8}|=))"
    r"[^\s\"',;&]+"
)

_SECRET_FLAG_ITEM = re.compile(
    r"(?i)--?(?:api[_\-]?key|access[_\-]?key|token|secret|password|passwd)"
)

_PREFIXED_PATTERNS: tuple[re.Pattern[str], ...] = (_AUTH_HEADER, _BEARER, _KEY_VALUE, _SECRET_FLAG)


def _mask_value(match: re.Match[str]) -> str:
    return match.group(1) + REDACTED


def looks_secret_name(name: str) -> bool:
    """True when an environment variable NAME suggests its value is a credential."""
    return _SECRET_NAME.search(name) is not None


def secret_env_values(env: Mapping[str, str]) -> tuple[str, ...]:
    """Values of `env` whose name looks secret and whose value is long enough to matter."""
    # Names first: reading every value of os.environ decodes each one, which costs more
    # than the spawn it guards on a short-lived child.
    names = [name for name in env if _SECRET_NAME.search(name)]
    return tuple(value for value in map(env.__getitem__, names) if len(value) >= MIN_ENV_SECRET_LEN)


def redact(text: str, extra_secrets: Iterable[str] = ()) -> str:
    """`text` with credentials replaced by `[REDACTED]`.

    Masks the literal `extra_secrets` (longest first, so a secret containing another is
    masked whole; empty strings and parts of the marker are ignored), then vendor key
    shapes, then values that follow a secret-sounding name, header or flag. Idempotent:
    redacting twice changes nothing more.
    """
    # A "secret" inside the marker itself would re-mask its own output forever.
    literal = {s for s in extra_secrets if s and s not in REDACTED}
    for secret in sorted(literal, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    text = _VENDOR_KEYS.sub(REDACTED, text)
    for pattern in _PREFIXED_PATTERNS:
        text = pattern.sub(_mask_value, text)
    return text


def redact_tail(tail: str, context: str, extra_secrets: Iterable[str] = ()) -> str:
    """`redact(tail)`, where `tail` is what was kept of a longer text and `context` the
    text that came just before it.

    A cut can slice a credential in two: the half inside `tail` no longer looks like one.
    When redacting `context + tail` masks what redacting `tail` alone does not, the
    differing head of `tail` is replaced by `[REDACTED]` and the rest is kept.
    """
    secrets = tuple(extra_secrets)
    alone = redact(tail, secrets)
    if not context:
        return alone
    seen = redact(context + tail, secrets)
    if seen.endswith(alone):
        return alone
    return REDACTED + alone[len(alone) - _common_suffix_len(alone, seen) :]


def _common_suffix_len(a: str, b: str) -> int:
    agree = 0
    for x, y in zip(reversed(a), reversed(b), strict=False):  # the shorter one bounds it
        if x != y:
            break
        agree += 1
    return agree


def redact_argv(argv: Sequence[str], extra_secrets: Iterable[str] = ()) -> tuple[str, ...]:
    """Each argument redacted, and the argument after a bare secret flag masked whole.

    `["--api-key", "abc"]` stores as `["--api-key", "[REDACTED]"]`: the value stands alone,
    so no in-text pattern could see its name.
    """
    secrets = tuple(extra_secrets)
    out: list[str] = []
    mask_next = False
    for item in argv:
        if mask_next and item:
            out.append(REDACTED)
        else:
            out.append(redact(item, secrets))
        mask_next = _SECRET_FLAG_ITEM.fullmatch(item) is not None
    return tuple(out)
