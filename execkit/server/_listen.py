"""The listening address of `execkit serve` (loopback only unless asked) and the bounds of
its connections (no uvicorn here, so the CLI checks `--listen` and builds the bounds before
the server's extra is imported)."""

from __future__ import annotations

import ipaddress

import attrs
from attrs.validators import ge, gt, le

from execkit._errors import InvalidInput
from execkit._validate import checked, finite, integer

__all__ = [
    "DEFAULT_HEAD_TIMEOUT_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_LISTEN",
    "DEFAULT_MAX_CONNECTIONS",
    "MAX_CONNECTIONS_LIMIT",
    "ConnectionLimits",
    "parse_listen",
]

DEFAULT_LISTEN = "127.0.0.1:8750"
DEFAULT_MAX_CONNECTIONS = 1024
MAX_CONNECTIONS_LIMIT = 1_000_000
DEFAULT_IDLE_TIMEOUT_S = 5.0
DEFAULT_HEAD_TIMEOUT_S = 10.0
_SECONDS = checked("a finite number of seconds > 0 and <= 3600", finite, gt(0), le(3600))


@attrs.frozen
class ConnectionLimits:
    """How much of the server a client's connections may hold (docs/remote.md, "The
    server"), one value for `serve`, `ServerThread` and the CLI's flags.

    `max_connections` (`--max-connections`): connections served at once; a request on a
    connection beyond them is answered 503 `storage` (and the connection closed), except
    `/healthz` and `/readyz`, which are answered whatever the count. `idle_timeout_s`
    (`--idle-timeout`): a connection with no request under way (none yet, or its last one
    answered) is closed after this long. `head_timeout_s` (`--head-timeout`): a request's
    head (its request line and headers) must be whole this long after its first byte, in
    total: bytes trickling in do not extend it; past it the answer is 408 and the
    connection is closed. InvalidInput for a count or a time out of range."""

    max_connections: int = attrs.field(
        default=DEFAULT_MAX_CONNECTIONS,
        validator=checked(
            f"an integer between 1 and {MAX_CONNECTIONS_LIMIT}",
            integer,
            ge(1),
            le(MAX_CONNECTIONS_LIMIT),
        ),
    )
    idle_timeout_s: float = attrs.field(default=DEFAULT_IDLE_TIMEOUT_S, validator=_SECONDS)
    head_timeout_s: float = attrs.field(default=DEFAULT_HEAD_TIMEOUT_S, validator=_SECONDS)


def parse_listen(text: str, *, allow_non_loopback: bool = False) -> tuple[str, int]:
    """`HOST:PORT` (`[V6]:PORT` for IPv6) as (host, port); InvalidInput for anything else,
    and for an address outside the loopback range unless `allow_non_loopback`."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise InvalidInput(
            f"--listen must be HOST:PORT (e.g. {DEFAULT_LISTEN}), got {text!r}", field="listen"
        )
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise InvalidInput(f"--listen needs a host, got {text!r}", field="listen")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if not allow_non_loopback:
            raise InvalidInput(
                f"--listen {text}: give a loopback address (127.0.0.1, [::1]); a host name "
                "might not be loopback (--allow-non-loopback serves beyond this host)",
                field="listen",
            ) from None
        return host, int(port_text)
    if not address.is_loopback and not allow_non_loopback:
        raise InvalidInput(
            f"--listen {text} is not a loopback address: the API would be reachable from "
            "other hosts, over plain HTTP; put a TLS proxy in front and pass "
            "--allow-non-loopback if that is what you mean",
            field="listen",
        )
    return host, int(port_text)
