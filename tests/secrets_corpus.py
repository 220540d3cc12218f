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

__all__ = [
    "ADVERSARIAL",
    "ATTACKS",
    "NEGATIVES",
    "SAMPLES",
    "Sample",
    "adversarial",
    "fake",
    "leaked",
]

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


def _attacks() -> tuple[Sample, ...]:
    """Credentials of the kinds issue #44 found unmasked in every sink, each written as an
    outsider attacking the redactor would write it: the issue's own example of a kind and
    shapes of it (and around it) that no rule was written from. `covered_before` is
    whether the frozen reference masked it (three of the shapes around the kinds)."""
    out: list[Sample] = []

    def add(name: str, text: str, secret: str, *, old: bool = False) -> None:
        # No two samples' secrets share 8 characters (a prefix, a base64 head): a leak of
        # one must not read as a leak of another.
        assert secret in text, name
        out.append(Sample(name, text, secret, covered_before=old))

    def password(label: str, length: int = 14) -> str:
        value = _mixed(_ALNUM, length, label)
        return value if any(c.isdigit() for c in value) else value[:-1] + "7"

    def http_request(*headers: str) -> str:
        # A logged request inside a JSON event: its line breaks are written `\n`.
        head = "GET /v1/me HTTP/1.1\nHost: api.example.com\n"
        return json.dumps({"type": "http", "request": head + "\n".join(headers) + "\n\n"})

    # --- a password glued to its flag, or given to a short flag on a tool's command line
    pw = password("glued-mysql")
    add("mysql_glued_password", f"mysql -uroot -p{pw} -h db.internal shop", pw)
    pw = password("glued-dump", 10) + "!#%" + fake(_ALNUM, 3, "glued-dump-end")
    add("mysqldump_glued_symbols", f"mysqldump -h 10.0.0.5 -u backup -p{pw} shop > s.sql", pw)
    pw = password("glued-maria", 8) + " " + fake(_LETTERS, 6, "glued-maria-2") + "!"
    add("mariadb_glued_quoted", f"mariadb -uadmin -p'{pw}' -e 'show databases'", pw)
    pw = password("glued-dq")
    add("mysql_glued_double_quoted", f'mysql --user=root -p"{pw}" shop', pw)
    pw = password("sshpass-glued")
    add("sshpass_glued", f"sshpass -p{pw} ssh deploy@10.0.0.7 uptime", pw)
    pw = password("sshpass-spaced")
    add("sshpass_spaced", f"sshpass -p '{pw}' scp build.tgz deploy@10.0.0.7:/srv", pw)
    pw = password("7z")
    add("seven_zip_glued", f"7z x backup.7z -p{pw} -o/tmp/restore", pw)
    pw = password("sqlcmd")
    add("sqlcmd_upper_glued", f'sqlcmd -S db.internal -U sa -P{pw} -Q "select 1"', pw)
    pw = password("docker-login")
    add("docker_login_spaced", f"docker login -u ci-bot -p {pw} registry.example.com", pw)
    pw = password("oc-login")
    add("oc_login_glued", f"oc login https://api.example.com:6443 -u developer -p{pw}", pw)
    pw = password("mongosh")
    add("mongosh_spaced", f"mongosh mongodb://db:27017 -u admin -p {pw} --quiet", pw)
    pw = password("redis-cli")
    add("redis_cli_auth", f"redis-cli -h cache.internal -p 6379 -a {pw} ping", pw)
    pw = password("ldap")
    add("ldapsearch_bind", f"ldapsearch -x -D cn=admin,dc=example,dc=com -w {pw} -b dc=x", pw)
    pw = password("pair")
    add("unknown_tool_user_password_pair", f"dbtool -uops -p{pw} --migrate", pw)
    pw = password("keytool")
    add("keytool_storepass", f"keytool -list -keystore app.jks -storepass {pw}", pw)
    pw = password("passphrase")
    add("passphrase_flag_spaced", f"signer --passphrase {pw} --out release.sig", pw)

    # --- `user:password` given to a user flag
    pw = password("curl-u")
    add("curl_user_password", f"curl -u alice:{pw} https://api.example.com/v1/me", pw)
    pw = password("curl-u-glued")
    add("curl_user_password_glued", f"curl -sS -ualice:{pw} https://api.example.com", pw)
    pw = password("curl-user-q", 9) + " " + fake(_ALNUM, 5, "curl-user-q2") + "&!"
    add("curl_user_quoted", f"curl --user 'deploy:{pw}' https://api.example.com", pw)
    pw = password("curl-user-eq")
    add("curl_user_equals", f"curl --user=admin:{pw} -X POST https://api.example.com", pw)
    pw = password("curl-proxy")
    add("curl_proxy_user", f"curl -x http://proxy:3128 -U proxyuser:{pw} https://x.io", pw)
    pw = password("curl-proxy-long")
    add("curl_proxy_user_long", f"curl --proxy-user bob:{pw} https://example.com", pw)
    pw = password("httpie")
    add("httpie_auth", f"http -a carol:{pw} GET https://api.example.com/me", pw)
    pw = fake(string.digits, 10, "curl-digits")
    add("curl_numeric_password", f"curl -u admin:{pw} http://localhost:9200/_health", pw)
    pw = password("smbclient")
    add("smbclient_user_percent", f"smbclient //fs/share -U admin%{pw} -c ls", pw)

    # --- a credential word, a space and a token (any alphabet: hex, one case, base32)
    token = fake(_HEX, 32, "word-api-token")
    add("api_token_space_hex", f"api_token {token}", token)
    token = fake(_HEX, 40, "word-auth-token")
    add("auth_token_space_hex", f"auth token {token}", token)
    token = fake(string.ascii_lowercase + string.digits, 32, "word-access-token")
    add("access_token_space_lower", f"using access token {token} for the upload", token)
    token = fake("ABCDEFGHIJKLMNOPQRSTUVWXYZ234567", 32, "word-client-secret")
    add("client_secret_space_base32", f"client secret {token}", token)
    token = fake(_HEX, 40, "word-refresh-is")
    add("refresh_token_is_hex", f"your refresh token is {token}", token)
    token = fake(_HEX, 16, "word-session-short")
    add("session_token_short_hex", f"session token {token} expires in 1h", token)
    token = fake(_HEX, 32, "word-authtoken")
    add("authtoken_compound_hex", f"AUTHTOKEN {token}", token)
    token = fake(_HEX, 32, "word-escaped")
    add(
        "api_token_after_escaped_newline",
        json.dumps({"log": f"connecting\napi_token {token}\ndone"}),
        token,
    )

    # --- a vendor token inside a longer word
    token = "hvs.CAESI" + fake(_URLSAFE, 90, "k33-vault")
    add("vault_token_in_a_word", f"k33-{token}", token)
    token = "hvb." + fake(_URLSAFE, 64, "glued-vault")
    add("vault_token_glued_to_letters", f"prod{token}", token)
    token = "ghp_" + fake(_ALNUM, 36, "ci-ghp")
    add("github_token_in_a_word", f"ci-{token}", token, old=True)
    token = "npm_" + fake(_ALNUM, 36, "deploy-npm")
    add("npm_token_in_a_word", f"deploy_{token}", token)
    token = "glpat-" + fake(_URLSAFE, 20, "glued-glpat")
    add("gitlab_token_in_a_word", f"k33_{token}", token)
    token = "sk-svcacct-" + fake(_URLSAFE, 48, "glued-openai")
    add("openai_key_after_a_digit", f"build2{token}", token)

    # --- dotted token families: more segments, and members no record names
    token = "dp.st.prd." + fake(_ALNUM, 40, "doppler-config")
    add("doppler_service_token_with_config", f"DOPPLER {token}", token)
    token = "dp.rt." + fake(_ALNUM, 44, "doppler-unknown")
    add("doppler_unlisted_type", f"doppler run with {token}", token)
    token = "sk.eyJ" + fake(_URLSAFE, 70, "mapbox-body") + "." + fake(_URLSAFE, 22, "mapbox-sig")
    add("mapbox_secret_token_signature", f"mapbox {token}", token)
    token = "sl.u." + fake(_URLSAFE, 140, "dropbox-u")
    add("dropbox_dotted_short_token", f"dropbox token {token}", token)
    token = "ya29.c." + fake(_URLSAFE, 120, "google-sa")
    add("google_service_account_access_token", f"gcloud printed {token}", token)
    token = "v4.local." + fake(_URLSAFE, 96, "paseto")
    add("paseto_local_token", f"session {token}", token)

    # --- header lines inside a JSON string whose line breaks are written `\n`
    token = base64.b64encode(b"webhook:" + fake(_ALNUM, 20, "json-basic").encode()).decode()
    add("json_authorization_basic", http_request(f"Authorization: Basic {token}"), token)
    token = fake(_HEX, 40, "json-token")
    add("json_authorization_token", http_request(f"Authorization: Token {token}"), token)
    value = fake(_ALNUM, 32, "json-cookie")
    add("json_cookie", http_request(f"Cookie: session={value}; theme=dark"), value)
    value = fake(_ALNUM, 30, "json-set-cookie")
    add("json_set_cookie", http_request(f"Set-Cookie: sid={value}; HttpOnly"), value)
    token = fake(_ALNUM, 40, "json-crlf")
    add(
        "json_authorization_bearer_crlf",
        json.dumps({"raw": f"POST /x HTTP/1.1\r\nAuthorization: Bearer {token}\r\n"}),
        token,
        old=True,
    )
    token = base64.b64encode(b"proxy:" + fake(_ALNUM, 18, "json-proxy").encode()).decode()
    add(
        "json_proxy_authorization",
        http_request(f"Proxy-Authorization: Basic {token}"),
        token,
        old=True,
    )
    token = "00" + fake(_URLSAFE, 40, "okta-ssws")
    add("authorization_unknown_scheme", f"> Authorization: SSWS {token}", token)
    token = fake(_ALNUM, 36, "json-scheme")
    add("json_authorization_unknown_scheme", http_request(f"Authorization: ApiKey {token}"), token)
    token = fake(_ALNUM, 36, "json-twice")
    add(
        "json_in_json_authorization",
        json.dumps({"body": http_request(f"Authorization: Token {token}")}),
        token,
    )
    return tuple(out)


ATTACKS: tuple[Sample, ...] = _attacks()
SAMPLES: tuple[Sample, ...] = _samples() + ATTACKS


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
        # A kebab-case name running into a key's prefix (`sk-proj-`) is no key: a prefix
        # with `-` or `_` may follow a digit or punctuation inside a word, never a letter.
        "see task-proj-management-dashboard-settings-page-v2 for the layout",
        # Placeholders where a header's credential goes, and command lines whose `-p`,
        # `-u` and `-P` take no password.
        "send Authorization: Bearer TOKEN",
        'curl -H "Authorization: Bearer $GITHUB_TOKEN" https://api.github.com/user',
        "Authorization: Bearer <token> (a token from `execkit serve --add-token`)",
        "docker run -u 1000:1000 -p 8080:80 -v ./data:/data nginx",
        "mkdir -p build/out && gcc -pthread -O2 -o build/out/app main.c",
        "git push -u origin main && ps -u root -p 1234,5678",
        "mysql -u root -p",
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
            # Issue #44's shapes: flags and their values, headers after an escaped newline,
            # one-case tokens after a word, prefixes inside words, dotted families.
            "-u a ", "-uroot -p", "-u x -h y ", "mysql -p", "-p'", "--pass ", "-u a:",
            "-u a:b", "\\nAuthorization: x", "\\nBearer ", "token is ", "key 0a1b2c3d4e5f6a7b",
            "k33-hvs.", "dp.st.a.", "hvs.ab.", "v4.local.", "-storepass ",
        ]
    ),
    ("api_key=", "x"),
)  # fmt: skip


def adversarial(head: str, unit: str, size: int) -> str:
    """`head` then `unit` repeated, `size` characters in all."""
    return (head + unit * (size // len(unit) + 1))[:size]
