"""The model vendors' own fixed error sentences, shared by the adapters whose CLIs pass
them through without the vendor's error type (pi, qwen, copilot, cn, droid, aider, llm).

Each is the whole message, or its fixed beginning, that one vendor API sends for one
error type, so reading it is reading structure: OpenAI's `insufficient_quota` message,
its usage-limit and invalid-key messages; Anthropic's credit-balance message. Matched only
at the start of the message the CLI reports (after any `<status> ` the SDK put in front),
never searched for in free text.
"""

from __future__ import annotations

import re

from execkit.adapterkit import ErrorKind

__all__ = ["sentence_kind", "split_status"]

_SENTENCES = (
    # OpenAI `insufficient_quota` (429): no credit left on the account.
    ("You exceeded your current quota, please check your plan and billing details", "billing"),
    # OpenAI `usage_limit_reached` (429): a plan's usage limit.
    ("The usage limit has been reached", "usage_limit"),
    # OpenAI `invalid_api_key` (401) and its expired-token message.
    ("Incorrect API key provided", "credentials"),
    ("Your authentication token has expired", "credentials"),
    # Anthropic's billing message (400 invalid_request_error or 402 billing_error).
    ("Your credit balance is too low", "billing"),
)
_KINDS = {
    "billing": ErrorKind.BILLING,
    "usage_limit": ErrorKind.USAGE_LIMIT,
    "credentials": ErrorKind.CREDENTIALS,
}
_STATUS = re.compile(r"^(?P<code>[1-5]\d\d)[ :]\s{0,2}")
# Google words a per-minute rate limit like OpenAI's quota message: never billing then.
_PER_MINUTE = re.compile(r"PerMinute|per minute", re.IGNORECASE)


def split_status(message: str) -> tuple[int | None, str]:
    """(`N`, the rest) for a message an SDK rendered as `N message`; else (None, message)."""
    found = _STATUS.match(message)
    if found is None:
        return None, message
    return int(found.group("code")), message[found.end() :]


def sentence_kind(message: str) -> ErrorKind | None:
    """The kind of a vendor's fixed error sentence at the start of `message` (after a
    status the SDK put in front), or None."""
    _, rest = split_status(message.strip())
    rest = rest.lstrip("[").strip()
    for sentence, kind in _SENTENCES:
        if rest.startswith(sentence):
            if kind == "billing" and _PER_MINUTE.search(message):
                return ErrorKind.RATE_LIMITED
            return _KINDS[kind]
    return None
