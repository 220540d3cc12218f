"""The words redaction writes and looks for, shared by the rules and the front functions.

The marker every mask becomes, the secret-sounding names that a named rule's value follows,
and the flags whose value is a secret (a logged command line, and `redact_argv`'s item
after a bare flag). Nothing here builds the table of shapes, so the front functions can
use these without loading it (front.py).
"""

from __future__ import annotations

import re

__all__ = ["FLAG_NAMES", "NAMES", "NAME_STARTS", "REDACTED", "SECRET_FLAG_ITEM"]

REDACTED = "[REDACTED]"

# `NAME=value`, `NAME: value`, `"name": "value"` where NAME ends in a secret-sounding word
# (`OPENAI_API_KEY`, `GITHUB_TOKEN`, `client_secret`, `apiKey`, `password`). The name's
# prefix is irrelevant to the match, which is what keeps this linear; requiring the word
# to END the name keeps `token_count=5` and `max_tokens=4096` readable.
NAMES = (
    r"(?:a(?:pi[_\-]?key|ccess[_\-]?key)|s(?:ecret[_\-]?key|ecret)|p(?:rivate[_\-]?key"
    r"|ass(?:word|wd))|token|credentials?)"
)  # the reference's alternatives, in its order, sharing their first letters
# Where a name can start, from each word of it (`api_key` holds `key` 4 characters in,
# `apikey` 3, `access_key` 7...; the other words start the name). A Search.NAMED shape's
# matches all start at one of these.
NAME_STARTS = (
    ("key", (3, 4, 6, 7, 8)),
    ("token", (0,)),
    ("secret", (0,)),
    ("passw", (0,)),
    ("credential", (0,)),
)

# The flags whose value is a secret: `--api-key VALUE`, `--token=VALUE`, and in an argv
# the item after a bare flag (SECRET_FLAG_ITEM).
FLAG_NAMES = r"--?(?:api[_\-]?key|access[_\-]?key|token|secret|password|passwd)"
SECRET_FLAG_ITEM = re.compile(f"(?i){FLAG_NAMES}")
