"""The child's environment: which of its values are secrets to mask as literals (phase 1).

A variable whose name says key, token, secret, password or credential holds a value that
no shape may recognise (a database password, a service's own token); `secret_env_values`
hands those values to `redact` as `extra_secrets`, so they are masked wherever they occur.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

__all__ = ["MIN_ENV_SECRET_LEN", "looks_secret_name", "secret_env_values"]

# Values shorter than this are not treated as secrets when collected from an environment:
# masking every "1" or "true" would shred the text without protecting anything.
MIN_ENV_SECRET_LEN = 8

_SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)


def looks_secret_name(name: str) -> bool:
    """True when an environment variable NAME suggests its value is a credential."""
    return _SECRET_NAME.search(name) is not None


def secret_env_values(env: Mapping[str, str]) -> tuple[str, ...]:
    """Values of `env` whose name looks secret and whose value is long enough to matter."""
    # Names first: reading every value of os.environ decodes each one, which costs more
    # than the spawn it guards on a short-lived child.
    names = [name for name in env if _SECRET_NAME.search(name)]
    # A list first, not `tuple(generator)`: CPython 3.11 grows a tuple built from a
    # generator in place, and refuses (SystemError) when another thread has meanwhile
    # taken a reference to it (seen once with spawns finishing on a thread pool).
    values = [value for value in map(env.__getitem__, names) if len(value) >= MIN_ENV_SECRET_LEN]
    return tuple(values)
