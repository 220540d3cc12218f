"""Named sample credentials, each in the text around it that makes it one, and look-alikes.

Every value is fake: built at import from a fixed seed (a hash chain), so the file holds no
credential-shaped literal for a scanner to flag, and every run sees the same values.
Shapes follow gitleaks `config/gitleaks.toml` and Yelp detect-secrets' plugins (prefixes,
lengths, alphabets); see execkit/_redact/shapes.py.

`SAMPLES` holds every shape execkit masks: those the reference redactor covered
(`covered_before=True`) and those added since. `secret` is what must never survive; the
rest of `text` may (a header name, a URL's host, a PEM header line). `extra_secrets` is
set for a value that only the child's environment marks as secret. `NEGATIVES` are texts
that must come out unchanged. `ADVERSARIAL` texts repeat the anchors of every rule, where a
pattern that backtracks or an engine that tries every position would do quadratic work.
"""

from __future__ import annotations

import base64
import hashlib
import json
import string
from dataclasses import dataclass

__all__ = ["ADVERSARIAL", "NEGATIVES", "SAMPLES", "Sample", "adversarial", "fake", "leaked"]

_ALNUM = string.ascii_letters + string.digits
_UPPER_DIGITS = string.ascii_uppercase + string.digits
_HEX = "0123456789abcdef"
_B64 = _ALNUM + "+/"
_URLSAFE = _ALNUM + "-_"
_LETTERS = string.ascii_letters


def fake(alphabet: str, length: int, label: str) -> str:
    """`length` characters of `alphabet`, the same for the same label on every run."""
    out: list[str] = []
    block = hashlib.sha256(label.encode()).digest()
    while len(out) < length:
        block = hashlib.sha256(block).digest()
        out.extend(alphabet[byte % len(alphabet)] for byte in block)
    return "".join(out[:length])


def _mixed(alphabet: str, length: int, label: str) -> str:
    """Like `fake`, with upper and lower case letters both present (a random key has)."""
    value = fake(alphabet, length, label)
    return "Ab" + value[2:] if value.lower() == value or value.upper() == value else value


def _b64url(obj: object) -> str:
    raw = json.dumps(obj, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _pem(kind: str, label: str, lines: int = 6) -> tuple[str, str]:
    body = (
        "\n".join(fake(_B64, 64, f"{label}-{i}") for i in range(lines))
        + "\n"
        + fake(_B64, 24, f"{label}-end")
        + "=="
    )
    return f"-----BEGIN {kind}-----\n{body}\n-----END {kind}-----", body


def leaked(secret: str, output: str, *, escaped: bool = False, width: int = 8) -> list[str]:
    """The `width`-character pieces of `secret` (of its JSON-escaped form with `escaped`)
    that appear in `output`.

    Eight characters: MIN_ENV_SECRET_LEN, the shortest value execkit treats as a secret,
    and more than a kept neighbour of a corpus secret shares with it by chance (corpus
    values are random, and no sample keeps 8 characters of its own secret on purpose).
    """
    target = json.dumps(secret)[1:-1] if escaped else secret
    if len(target) <= width:
        return [target] if target in output else []
    pieces = {target[i : i + width] for i in range(len(target) - width + 1)}
    return sorted(piece for piece in pieces if piece in output)


@dataclass(frozen=True)
class Sample:
    """One credential: `text` shows it as tools print it; `secret` must never survive."""

    name: str
    text: str
    secret: str
    covered_before: bool
    extra_secrets: tuple[str, ...] = ()


def _samples() -> tuple[Sample, ...]:
    out: list[Sample] = []

    def add(name: str, text: str, secret: str, *, old: bool, extra: tuple[str, ...] = ()) -> None:
        assert secret in text, name
        out.append(Sample(name, text, secret, old, extra))

    # --- shapes the reference redactor already covered
    key = "sk-proj-" + fake(_URLSAFE, 48, "openai")
    add("openai_key", f"using OpenAI key {key} for the run", key, old=True)
    key = "sk-ant-api03-" + fake(_URLSAFE, 93, "anthropic") + "AA"
    add("anthropic_key", f"x-api-key: {key}", key, old=True)
    key = "AIza" + fake(_URLSAFE, 35, "google")
    add(
        "google_api_key",
        f"GET https://maps.example.com/api/geocode?addr=x&key={key}",
        key,
        old=True,
    )
    key = "ghp_" + fake(_ALNUM, 36, "github")
    add("github_token", f"remote: using token {key}", key, old=True)
    key = "github_pat_" + fake(_ALNUM + "_", 82, "github-pat")
    add("github_fine_grained_pat", f"GH auth {key} accepted", key, old=True)
    key = "xoxb-" + fake(string.digits, 12, "sl1") + "-" + fake(string.digits, 13, "sl2")
    key += "-" + fake(_ALNUM, 24, "sl3")
    add("slack_bot_token", f"slack client init {key}", key, old=True)
    token = fake(_ALNUM, 40, "bearer-header")
    add("authorization_bearer", f"> Authorization: Bearer {token}", token, old=True)
    token = base64.b64encode(b"deploy:" + fake(_ALNUM, 18, "basic").encode()).decode()
    add("authorization_basic", f"curl -H 'Authorization: Basic {token}' https://x", token, old=True)
    token = fake(_ALNUM, 32, "bare-bearer")
    add("bearer_token", f"retrying request with bearer {token} after 401", token, old=True)
    value = fake(_ALNUM, 32, "env-line")
    add("env_assignment", f"OPENAI_API_KEY={value}", value, old=True)
    value = fake(_ALNUM, 28, "export")
    add("export_quoted", f'export DB_PASSWORD="{value}"', value, old=True)
    value = fake(_ALNUM + "-", 30, "json-kv")
    add("json_key_value", f'{{"client_secret": "{value}", "model": "x"}}', value, old=True)
    value = fake(_ALNUM, 24, "yaml")
    add("yaml_password", f"  password: {value}", value, old=True)
    value = fake(_ALNUM, 26, "flag")
    add("api_key_flag", f"codex --api-key {value} exec 'fix it'", value, old=True)
    value = fake(_ALNUM, 26, "flag-eq")
    add("token_flag", f"gemini --token={value} -p hi", value, old=True)
    value = fake(_B64, 44, "sas") + "="
    add(
        "azure_shared_access_key",
        "Endpoint=sb://ns.servicebus.windows.net/;SharedAccessKeyName=RootManage"
        f"SharedAccessKey;SharedAccessKey={value}",
        value,
        old=True,
    )
    value = "svc-" + fake(_ALNUM, 24, "env-literal")
    add(
        "env_literal",
        f"connected as {value} (from the environment)",
        value,
        old=True,
        extra=(value,),
    )
    value = fake(_ALNUM, 12, "env-q1") + '"' + fake(_ALNUM, 12, "env-q2")
    add(
        "env_literal_with_quote",
        f"password was {value} (from the environment)",
        value,
        old=True,
        extra=(value,),
    )

    # --- shapes added by the coverage work
    key = "AKIA" + fake(_UPPER_DIGITS, 16, "aws-id")
    add("aws_access_key_id", f"export AWS_ACCESS_KEY_ID={key}", key, old=False)
    key = "ASIA" + fake(_UPPER_DIGITS, 16, "aws-sts")
    add("aws_session_key_id", f"assumed role; credentials {key} expire in 1h", key, old=False)
    key = _mixed(_B64, 40, "aws-secret")
    add("aws_secret_prompt", f"AWS Secret Access Key [None]: {key}", key, old=False)
    key = _mixed(_B64, 40, "aws-secret-cli")
    add("aws_secret_cli", f"aws configure set aws_secret_access_key {key}", key, old=False)
    path = "T" + fake(_UPPER_DIGITS, 8, "sw1") + "/B" + fake(_UPPER_DIGITS, 8, "sw2")
    path += "/" + fake(_ALNUM, 24, "sw3")
    add("slack_webhook", f"POST https://hooks.slack.com/services/{path} -> 200", path, old=False)
    jwt = (
        _b64url({"alg": "HS256", "typ": "JWT"})
        + "."
        + _b64url({"sub": "user-" + fake(string.digits, 6, "jwt-sub"), "iat": 1700000000})
    )
    jwt += "." + fake(_URLSAFE, 43, "jwt-sig")
    add("jwt", f"id token {jwt} issued", jwt, old=False)
    password = fake(_ALNUM, 20, "url-pw")
    add(
        "url_password",
        f"cloning https://deploy:{password}@git.example.com/org/repo.git",
        password,
        old=False,
    )
    password = fake(_ALNUM, 22, "pg")
    add(
        "postgres_url",
        f"DATABASE_URL=postgres://app:{password}@db.internal:5432/app",
        password,
        old=False,
    )
    password = fake(_ALNUM, 18, "pgsql")
    add(
        "postgresql_url",
        f"connect postgresql://reporter:{password}@10.0.0.5/metrics",
        password,
        old=False,
    )
    password = fake(_ALNUM, 16, "mysql")
    add("mysql_url", f"mysql://root:{password}@127.0.0.1:3306/shop", password, old=False)
    password = fake(_ALNUM, 24, "mongo")
    add(
        "mongodb_srv_url",
        f"mongodb+srv://admin:{password}@cluster0.example.mongodb.net/?retryWrites=true",
        password,
        old=False,
    )
    password = fake(_ALNUM, 20, "redis")
    add("redis_url", f"REDIS_URL=redis://:{password}@cache:6379/0", password, old=False)
    password = fake(_ALNUM, 20, "amqp")
    add("amqp_url", f"broker amqp://worker:{password}@rabbit:5672/vhost", password, old=False)
    key = fake(_B64, 86, "azure-storage") + "=="
    add(
        "azure_account_key",
        "DefaultEndpointsProtocol=https;AccountName=acct;"
        f"AccountKey={key};EndpointSuffix=core.windows.net",
        key,
        old=False,
    )
    text, body = _pem("RSA PRIVATE KEY", "pem-rsa")
    add("pem_rsa_private_key", text, body, old=False)
    text, body = _pem("OPENSSH PRIVATE KEY", "pem-openssh", lines=4)
    add("openssh_private_key", text, body, old=False)
    text, body = _pem("PRIVATE KEY", "pem-pkcs8", lines=3)
    add("pkcs8_private_key", f"key file:\n{text}\n(end)", body, old=False)
    key = "sk_live_" + fake(_ALNUM, 24, "stripe-live")
    add("stripe_live_key", f"charge failed for {key} (401)", key, old=False)
    key = "rk_live_" + fake(_ALNUM, 24, "stripe-rk")
    add("stripe_restricted_key", f"stripe client {key} ok", key, old=False)
    key = "sk_test_" + fake(_ALNUM, 24, "stripe-test")
    add("stripe_test_key", f"stripe client {key} ok", key, old=False)
    key = "npm_" + fake(_ALNUM, 36, "npm")
    add("npm_token", f"npm publish using {key}", key, old=False)
    key = "hf_" + fake(_LETTERS, 34, "hf")
    add("huggingface_token", f"huggingface-cli login --add {key}", key, old=False)
    key = "glpat-" + fake(_URLSAFE, 20, "glpat")
    add("gitlab_pat", f"git push with {key} to gitlab", key, old=False)
    key = "SK" + fake(_HEX, 32, "twilio")
    add("twilio_api_key", f"twilio api key {key} created", key, old=False)
    key = "SG." + fake(_URLSAFE, 22, "sg1") + "." + fake(_URLSAFE, 43, "sg2")
    add("sendgrid_key", f"sendgrid {key} rejected", key, old=False)
    value = fake(_HEX, 32, "cookie")
    add("cookie_header", f"> Cookie: session={value}; theme=dark", value, old=False)
    value = fake(_ALNUM, 30, "set-cookie")
    add(
        "set_cookie_header",
        f"< Set-Cookie: sid={value}; Path=/; HttpOnly; Secure",
        value,
        old=False,
    )
    return tuple(out)


SAMPLES: tuple[Sample, ...] = _samples()


def _negatives() -> tuple[str, ...]:
    sha1 = fake(_HEX, 40, "git-sha")
    sha256 = fake(_HEX, 64, "sha256")
    image = base64.b64encode(hashlib.sha512(b"png").digest() * 8).decode()
    blob = base64.b64encode(
        b"".join(hashlib.sha256(bytes([i])).digest() for i in range(40))
    ).decode()
    return (
        f"commit {sha1}",
        f"fix: rotate secret handling ({sha1})",
        f"aws s3 cp ./out s3://bucket/out etag {sha1}",
        f"Digest: sha256:{sha256}",
        f"pulling image@sha256:{sha256.upper()}",
        "request_id=123e4567-e89b-12d3-a456-426614174000 trace=9b2f1c0e-77aa-4e0b-8d2c-2f3b4a5c",
        "tokens used: 1234, max_tokens=4096, token_count=5",
        "usage: {'input_tokens': 1200, 'output_tokens': 88}",
        f'<img src="data:image/png;base64,{image}">',
        f"attachment (base64): {blob}",
        "task-abcdefghijklmnopqrstuvwxyz finished",
        "https://example.com:8443/path/to/thing?q=1&page=2",
        "git@github.com:org/repo.git and ssh://git@host:22/repo and mail to ops@example.com",
        "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIUX\n-----END CERTIFICATE-----",
        "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0D\n-----END PUBLIC KEY-----",
        "npm_config_cache=/tmp/.npm self.hf_model_name = 'bert' SKU-12345 TZ=Asia/Kolkata",
        "cookies enabled: 3, cookie_consent=true",
        "the secret to good tests is real processes; bearer of bad news",
        "Error: 503 Service Unavailable (overloaded)",
        '  File "/usr/lib/python3.11/site-packages/app/main.py", line 42, in <module>',
        "2024-05-01T12:00:00.123Z INFO build finished in 12.3s (node v20.11.1)",
    )


NEGATIVES: tuple[str, ...] = _negatives()


# (head, unit): the text `head + unit * n`, cut to its size (`adversarial`). Each unit
# repeats the anchor of a rule, or what a match of it needs but one character, so that a
# rule that backtracks, or a search started again from each match, has work at every one.
ADVERSARIAL: tuple[tuple[str, str], ...] = (
    *(
        ("", unit)
        for unit in [
            "a", "sk-", "Bearer ", "token", "token:", "token=", "AIza", "ghp_", "xoxb-",
            "://a:", "://:@", "eyJ", "eyJa.", "-----BEGIN PRIVATE KEY-----", "-----BEGIN X",
            "AKIA", "A3TX", "SK", "SG.", "SG.a.", "hf_", "npm_", "glpat-", "k_live_",
            "cookie: ", "aws secret ", "Ab+/", "hooks.slack.com/services/",
            "authorization: ", "--token ", "AccountKey=", '\\"token\\": \\"', 'password=\\"',
            "sk-" + "a" * 15 + " ",
        ]
    ),
    ("api_key=", "x"),
)  # fmt: skip


def adversarial(head: str, unit: str, size: int) -> str:
    """`head` then `unit` repeated, `size` characters in all."""
    return (head + unit * (size // len(unit) + 1))[:size]
