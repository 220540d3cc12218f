"""Synthetic credentials for the provider rules and the shape-free ones, the places they are
printed in, and clean real output that must stay readable.

Every value is fake, built from a fixed seed (secrets_corpus.fake), so this file holds no
credential-shaped literal.

- `SURVIVORS`: the credential shapes of issue #30 that survived every redacted sink,
  written here by hand (not from the rules), each with the fragments that must not survive.
- `rule_sample(rule)`: one sample per record of execkit/_redact/rules.toml: a key of the
  record's prefix, charset and length (random-looking, unlike the record's own example),
  or, for a regex record, its example.
- `CONTEXTS`: where a credential is printed: alone, after a JSON-escaped newline (once and
  twice escaped), after `%3D` and `%20` in URL-encoded text, inside shell quotes.
- `clean_corpus()`: ordinary output: the recorded vendor transcripts (fixtures/recorded),
  git logs, UUIDs, base64 test data, file paths; and this repository's docs/ (prose full
  of flags, headers and placeholders). Masks there are false masks.
"""

from __future__ import annotations

import base64
import hashlib
import json
import string
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from secrets_corpus import fake

from execkit._redact import record, rules

__all__ = ["CONTEXTS", "SURVIVORS", "Survivor", "clean_corpus", "rule_sample"]

ROOT = Path(__file__).resolve().parent.parent

_ALNUM = string.ascii_letters + string.digits
_LOWER = string.ascii_lowercase + string.digits
_UPPER = string.ascii_uppercase + string.digits
_HEX = "0123456789abcdef"
_B64 = _ALNUM + "+/"
_URLSAFE = _ALNUM + "-_"
_ALPHABETS = {
    "alnum": _ALNUM,
    "lower": _LOWER,
    "upper": _UPPER,
    "hex": _HEX,
    "hexany": _HEX + "ABCDEF",
    "urlsafe": _URLSAFE,
    "b64": _B64,
    "digits": string.digits,
}


def _mixed(alphabet: str, length: int, label: str) -> str:
    """`fake`, with both cases and a digit where the alphabet has them (a random key has)."""
    value = fake(alphabet, length, label)
    if length >= 3 and any(c.isupper() for c in alphabet) and any(c.islower() for c in alphabet):
        value = "aB" + value[2:] if value.lower() == value or value.upper() == value else value
    if length >= 3 and any(c.isdigit() for c in alphabet) and not any(c.isdigit() for c in value):
        value = value[:-1] + "7"
    return value


@dataclass(frozen=True)
class Survivor:
    """A credential as a tool prints it, and the fragments of it that must not survive."""

    name: str
    text: str
    fragments: tuple[str, ...]


def _survivor(name: str, before: str, secret: str, after: str = "") -> Survivor:
    return Survivor(name, before + secret + after, (secret,))


def _putty() -> Survivor:
    body = [fake(_B64, 64, f"putty-{i}") for i in range(3)] + [fake(_B64, 20, "putty-end") + "=="]
    mac = fake(_HEX, 64, "putty-mac")
    text = (
        "PuTTY-User-Key-File-3: ssh-ed25519\nEncryption: none\nComment: deploy\n"
        f"Public-Lines: 2\nAAAAC3NzaC1lZDI1NTE5AAAA\nIBk0pS\nPrivate-Lines: {len(body)}\n"
        + "\n".join(body)
        + f"\nPrivate-MAC: {mac}\n"
    )
    return Survivor("putty_private_key", text, (*body, mac))


def _docker_auth() -> Survivor:
    auth = base64.b64encode(f"bob:{fake(_ALNUM, 24, 'docker')}".encode()).decode()
    text = json.dumps({"auths": {"https://index.docker.io/v1/": {"auth": auth}}})
    return Survivor("docker_config_auth", text, (auth,))


def _kubeconfig() -> Survivor:
    key = base64.b64encode(("-----BEGIN EC PRIVATE KEY-----\n" + fake(_B64, 120, "kube")).encode())
    data = key.decode()
    return Survivor(
        "kubeconfig_client_key_data",
        f"users:\n- name: admin\n  user:\n    client-key-data: {data}\n",
        (data,),
    )


def _sas() -> Survivor:
    sig = fake(_B64, 43, "sas").replace("+", "%2B").replace("/", "%2F") + "%3D"
    url = (
        "https://acct.blob.core.windows.net/backups/db.tar?sv=2022-11-02&ss=b&srt=co"
        f"&sp=rl&se=2026-01-01T00:00:00Z&spr=https&sig={sig}"
    )
    return Survivor("azure_sas_sig", f"GET {url} HTTP/1.1", (sig,))


def _netrc() -> Survivor:
    one = fake(_ALNUM, 20, "netrc-1")
    two = fake(_HEX, 32, "netrc-2")
    text = f"machine api.example.com login bob password {one}\nmachine git.example.com\n"
    text += f"  login alice\n  password {two}\n"
    return Survivor("netrc_lines", text, (one, two))


SURVIVORS: tuple[Survivor, ...] = (
    _survivor("groq", "GROQ_KEY=", "gsk_" + _mixed(_ALNUM, 52, "groq")),
    _survivor("xai", "key ", "xai-" + _mixed(_ALNUM, 80, "xai")),
    _survivor("pypi", "password = ", "pypi-AgEIcHlwaS5vcmc" + fake(_URLSAFE, 160, "pypi")),
    _survivor("vault", "VAULT_TOKEN ", "hvs.CAESI" + fake(_URLSAFE, 90, "vault")),
    _survivor("digitalocean", "doctl auth init -t ", "dop_v1_" + fake(_HEX, 64, "do")),
    _survivor("shopify", "X-Shopify-Access-Token ", "shpat_" + fake(_HEX, 32, "shop")),
    _survivor("linear", "linear ", "lin_api_" + _mixed(_ALNUM, 40, "linear")),
    _survivor(
        "telegram_url",
        "POST https://api.telegram.org/bot",
        "7123456789:AA" + fake(_URLSAFE, 33, "tg"),
        "/sendMessage",
    ),
    _survivor("databricks", "host=x token ", "dapi" + fake(_HEX, 32, "dbx")),
    _survivor("atlassian", "jira ", "ATATT3xFfGF0" + fake(_URLSAFE, 170, "atl") + "=" + "A1B2C3D4"),
    _survivor("replicate", "REPLICATE ", "r8_" + _mixed(_ALNUM, 37, "r8")),
    _survivor("perplexity", "pplx ", "pplx-" + _mixed(_ALNUM, 48, "pplx")),
    _survivor("stripe_webhook", "endpoint secret ", "whsec_" + fake(_B64, 32, "whsec")),
    _survivor(
        "slack_app",
        "app token ",
        f"xapp-1-A0{fake(_UPPER, 9, 'xa')}-{fake(string.digits, 13, 'xb')}-" + fake(_HEX, 64, "xc"),
    ),
    _survivor("aws_session_token", "", "IQoJb3JpZ2luX2VjE" + fake(_B64, 300, "sts") + "="),
    _docker_auth(),
    _kubeconfig(),
    _sas(),
    _survivor("mailgun", "api:", "key-" + fake(_HEX, 32, "mg")),
    _putty(),
    _netrc(),
    _survivor("pgpass", "", "db.internal:5432:appdb:app_user:", fake(_ALNUM, 20, "pgpass")),
    _survivor("db_pass", "export DB_PASS=", fake(_ALNUM, 14, "dbpass")),
    _survivor("smtp_auth", "SMTP_AUTH=", _mixed(_ALNUM, 18, "smtp")),
    _survivor("gpg_passphrase", "GPG_PASSPHRASE=", fake(_ALNUM, 24, "gpg")),
)


def _pgpass_fix(survivor: Survivor) -> Survivor:
    # The pgpass sample's secret is the password after the four fields.
    if survivor.name != "pgpass":
        return survivor
    password = survivor.text.rsplit(":", 1)[1]
    return Survivor(survivor.name, survivor.text, (password,))


SURVIVORS = tuple(_pgpass_fix(s) for s in SURVIVORS)


def rule_sample(rule: rules.Rule) -> Survivor:
    """One credential for `rule`, as a line prints it (a keyword rule's keyword first)."""
    if rule.prefix is not None:
        assert rule.charset is not None and rule.length is not None
        secret = rule.prefix + _mixed(_ALPHABETS[rule.charset], rule.length, rule.id)
        return Survivor(rule.id, f"value {secret}", (secret,))
    if rule.regex is None:
        assert rule.keyword is not None and rule.charset is not None and rule.length is not None
        if rule.charset == "uuid":
            secret = str(uuid.UUID(hashlib.md5(rule.id.encode()).hexdigest()))
        else:
            secret = _mixed(_ALPHABETS[rule.charset], rule.length, rule.id)
        return Survivor(rule.id, f"{rule.keyword} = {secret}", (secret,))
    text, masked = record.example_of(rules.shape_of(rule))
    start = masked.index("[REDACTED]")
    secret = text[start : start + len(text) - len(masked) + len("[REDACTED]")]
    return Survivor(rule.id, text, (secret,))


def _json(text: str) -> str:
    return json.dumps({"type": "error", "message": "a\n" + text, "code": 1})


def _json_twice(text: str) -> str:
    return json.dumps({"body": _json(text), "status": 401})


CONTEXTS: dict[str, Callable[[str], str]] = {
    "alone": lambda text: text,
    "json": _json,
    "json_in_json": _json_twice,
    "url_3D": lambda text: f"GET /cb?next=a%3D{text}%26b=1 HTTP/1.1",
    "url_20": lambda text: f"q=%20{text}%20",
    "shell_single": lambda text: f"sh -c 'echo {text}'",
    "shell_double": lambda text: f'env X="{text}" run',
}


def _git_log(count: int) -> str:
    lines: list[str] = []
    for i in range(count):
        sha = hashlib.sha1(f"commit {i}".encode()).hexdigest()
        parent = hashlib.sha1(f"commit {i - 1}".encode()).hexdigest()
        lines += [
            f"commit {sha}",
            f"Merge: {parent[:7]} {sha[:7]}" if i % 7 == 0 else f"parent {parent}",
            f"Author: Dev {i % 13} <dev{i % 13}@example.com>",
            f"Date:   Sat Dec {1 + i % 28} 10:{i % 60:02d}:00 2026 +0000",
            "",
            f"    Fix the key rotation for token cache #{i} ({sha[:12]})",
            f"    Reviewed-on: https://git.example.com/c/{sha[:10]}",
            "",
        ]
    return "\n".join(lines)


def _uuids(count: int) -> str:
    out: list[str] = []
    for i in range(count):
        one = uuid.uuid5(uuid.NAMESPACE_URL, f"run-{i}")
        two = uuid.uuid5(uuid.NAMESPACE_DNS, f"task-{i}")
        out.append(
            json.dumps(
                {"session_id": str(one), "request_id": str(two).upper(), "trace": one.hex},
                separators=(",", ":"),
            )
        )
    return "\n".join(out)


def _base64_data(count: int) -> str:
    out: list[str] = []
    block = b"seed"
    blob = bytearray()
    for i in range(count):
        block = hashlib.sha256(block).digest()
        blob += block
        out.append(
            json.dumps({"name": f"fixture_{i}.bin", "data": base64.b64encode(block * 2).decode()})
        )
    encoded = base64.encodebytes(bytes(blob)).decode()  # MIME lines of 76
    urlsafe = base64.urlsafe_b64encode(bytes(blob)).decode()  # one long line
    return "\n".join(out) + "\n" + encoded + urlsafe + "\n"


def _paths() -> str:
    skip = {".git", ".venv", "node_modules", "__pycache__", ".mypy_cache", ".ruff_cache"}
    found: list[str] = []
    for path in sorted(ROOT.rglob("*")):
        if any(part in skip for part in path.relative_to(ROOT).parts):
            continue
        found.append(str(path))
    return "\n".join(found)


def _recorded() -> str:
    parts: list[str] = []
    for path in sorted((ROOT / "fixtures" / "recorded").rglob("*")):
        if path.is_file():
            parts.append(path.read_text(encoding="utf-8", errors="replace"))
    return "\n".join(parts)


def _docs() -> str:
    return "\n".join(
        path.read_text(encoding="utf-8")
        for path in sorted((ROOT / "docs").rglob("*"))
        if path.is_file() and path.suffix in (".md", ".json")
    )


def clean_corpus() -> dict[str, str]:
    """Ordinary output, by kind: no credential in any of it."""
    return {
        "recorded transcripts": _recorded(),
        "git log": _git_log(2000),
        "uuids": _uuids(3000),
        "base64 data": _base64_data(2000),
        "paths": _paths(),
        "docs": _docs(),
    }
