"""PostgreSQL ledger URLs: which targets name one, and the URL as it may be shown.

A ledger URL is a libpq URL (`postgresql://user[:password]@host[:port]/db?...`). Its
password never leaves this backend: `public_url` is what `location()`, the board's
binding and every message carry, without the password in the user part or as a
`password=` parameter; `password_of` is what the store masks in a server's error text.
"""

from __future__ import annotations

import urllib.parse

__all__ = ["INSTALL_HINT", "URL_SCHEMES", "is_postgres_url", "password_of", "public_url"]

URL_SCHEMES = ("postgresql://", "postgres://")
INSTALL_HINT = "pip install 'execkit-runner[postgres]'"


def is_postgres_url(target: object) -> bool:
    """Whether `target` names a PostgreSQL ledger (a `postgresql://` or `postgres://` URL)."""
    return isinstance(target, str) and target.startswith(URL_SCHEMES)


def password_of(url: str) -> str | None:
    parts = urllib.parse.urlsplit(url)
    found = parts.password
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if name == "password":
            found = value
    return found or None


def public_url(url: str) -> str:
    """`url` without its password (in the user part or as a `password=` parameter)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}@{hostport}" if user else hostport
    query = "&".join(
        piece
        for piece in parts.query.split("&")
        if piece and urllib.parse.unquote_plus(piece.split("=", 1)[0]) != "password"
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))
