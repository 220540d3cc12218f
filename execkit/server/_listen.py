"""The listening address of `execkit serve`: loopback only unless asked (no uvicorn here,
so the CLI checks `--listen` before the server's extra is imported)."""

from __future__ import annotations

import ipaddress

from execkit._errors import InvalidInput

__all__ = ["DEFAULT_LISTEN", "parse_listen"]

DEFAULT_LISTEN = "127.0.0.1:8750"


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
