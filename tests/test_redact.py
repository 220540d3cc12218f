"""execkit._redact: credentials never reach a stored tail; ordinary text survives."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from execkit._redact import (
    REDACTED,
    looks_secret_name,
    redact,
    redact_argv,
    redact_tail,
    secret_env_values,
)

SECRET_CASES = [
    ("key sk-abcdefghijklmnopqrstuv used", "sk-abcdefghijklmnopqrstuv"),
    ("sk-proj-AbC123_def-456ghiJKLmno", "sk-proj-AbC123_def-456ghiJKLmno"),
    ("x-api-key: sk-ant-api03-AAAAbbbbCCCCdddd-eeee", "sk-ant-api03-AAAAbbbbCCCCdddd-eeee"),
    ("url?key=AIzaSyA1234567890abcdefghijklmnopqrstu", "AIzaSyA1234567890abcdefghijklmnopqrstu"),
    ("token ghp_0123456789abcdefghijABCDEFGHIJ", "ghp_0123456789abcdefghijABCDEFGHIJ"),
    ("github_pat_11ABCDEFG0123456789_abcdefghij", "github_pat_11ABCDEFG0123456789_abcdefghij"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "eyJhbGciOiJIUzI1NiJ9.payload.sig"),
    ("authorization: token abc123def456", "abc123def456"),
    ("curl -H 'Authorization: Basic dXNlcjpwYXNz'", "dXNlcjpwYXNz"),
    ("sent bearer abcdefgh12345678 upstream", "abcdefgh12345678"),
    ("api_key=plainvalue123", "plainvalue123"),
    ('{"api_key": "json-value-999", "model": "x"}', "json-value-999"),
    ("{'apiKey': 'camelValue77'}", "camelValue77"),
    ("OPENAI_API_KEY=whatever-it-is", "whatever-it-is"),
    ("export GITHUB_TOKEN=gho_short", "gho_short"),
    ("ANTHROPIC_AUTH_TOKEN: tok_1234", "tok_1234"),
    ("DB_PASSWORD=hunter2", "hunter2"),
    ("client_secret = s3cr3t-value", "s3cr3t-value"),
    ("codex --api-key mysecretkey123 exec", "mysecretkey123"),
    ("gemini --token=abcdef123456", "abcdef123456"),
]


@pytest.mark.parametrize(("text", "secret"), SECRET_CASES)
def test_credentials_are_masked(text: str, secret: str) -> None:
    masked = redact(text)
    assert secret not in masked
    assert REDACTED in masked


@pytest.mark.parametrize(
    "text",
    [
        "tokens used: 1234, max_tokens=4096, token_count=5",
        "task-abcdefghijklmnopqrstuvwxyz finished",  # `sk-` inside a word
        "Error: 503 Service Unavailable (overloaded)",
        "the secret to good tests is real processes",
        "bearer of bad news",  # too short to be a token
        "keyboard layout: us",
        "",
    ],
)
def test_ordinary_text_is_left_alone(text: str) -> None:
    assert redact(text) == text


def test_json_structure_survives() -> None:
    assert redact('{"api_key": "abc123", "n": 1}') == '{"api_key": "[REDACTED]", "n": 1}'


def test_extra_secrets_are_masked_literally_longest_first() -> None:
    text = "a=hunter2hunter2 b=hunter2hunter2xyz c=a.b*c"
    masked = redact(text, extra_secrets=["hunter2hunter2", "hunter2hunter2xyz", "", "a.b*c"])
    assert masked == "a=[REDACTED] b=[REDACTED] c=[REDACTED]"


def test_secret_env_values_pick_names_that_look_secret_and_long_values() -> None:
    env = {
        "OPENAI_API_KEY": "sk-something-long",
        "GH_TOKEN": "short",
        "MY_SECRET": "longenough",
        "DB_PASSWORD": "p4ssw0rd!",
        "PATH": "/usr/local/bin:/usr/bin",
        "HOME": "/root/verylong",
    }
    assert set(secret_env_values(env)) == {"sk-something-long", "longenough", "p4ssw0rd!"}
    assert looks_secret_name("aws_secret_access_key") and not looks_secret_name("PATH")


def test_redact_argv_masks_the_value_after_a_secret_flag() -> None:
    argv = ["codex", "--api-key", "abc", "--model", "o3", "--token=xyz", "-p", "hi sk-" + "a" * 20]
    assert redact_argv(argv) == (
        "codex",
        "--api-key",
        REDACTED,
        "--model",
        "o3",
        f"--token={REDACTED}",
        "-p",
        f"hi {REDACTED}",
    )


# ------------------------------------------------------------------------------ properties

_KEY_BODY = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-",
    min_size=20,
    max_size=60,
)
_SURROUNDING = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
_PREFIXES = st.sampled_from(["sk-", "sk-ant-", "sk-proj-", "AIza" + "B" * 10])


@given(before=_SURROUNDING, prefix=_PREFIXES, body=_KEY_BODY, after=_SURROUNDING)
def test_any_vendor_key_anywhere_is_masked(before: str, prefix: str, body: str, after: str) -> None:
    key = prefix + body
    assert key not in redact(f"{before} {key} {after}")


@given(
    name=st.sampled_from(["API_KEY", "api_key", "GITHUB_TOKEN", "password", "client_secret"]),
    sep=st.sampled_from(["=", ": ", '": "', " = "]),
    value=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789./+", min_size=1, max_size=40),
)
def test_any_named_value_is_masked(name: str, sep: str, value: str) -> None:
    masked = redact(f"{name}{sep}{value}")
    assert masked == f"{name}{sep}{REDACTED}"


@given(
    text=_SURROUNDING,
    secret=st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=8, max_size=30),
)
def test_extra_secret_never_survives(text: str, secret: str) -> None:
    assert secret not in redact(f"{text}{secret}{text}{secret}", extra_secrets=[secret])


@settings(max_examples=300)
@given(text=st.text(max_size=300))
def test_redaction_is_idempotent(text: str) -> None:
    once = redact(text)
    assert redact(once) == once


def test_patterns_are_linear_on_adversarial_input() -> None:
    # A quadratic pattern needs ~10^12 steps on these 1 MB inputs (hours); linear ones
    # finish in seconds. The generous bound keeps this honest on a loaded machine.
    script = """
import sys
from execkit._redact import redact
n = 1_000_000
for text in (
    "a" * n, "sk-" * (n // 3), "token" * (n // 5), "token:" * (n // 6),
    "Bearer " * (n // 7), "authorization: " * (n // 15), "--token " * (n // 8),
    "api_key=" + "x" * n, "AIza" * (n // 4), "sk-" + "a" * 15 + " " * 1,
):
    redact(text, extra_secrets=["abcdefgh"])
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


# --------------------------------------------------------- a credential sliced by the cut

_CUT_SECRET = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789", min_size=8, max_size=40)
# Disjoint from every secret alphabet and pattern: nothing in here is masked on its own.
_PLAIN = st.text(alphabet=" XYZ.\n", max_size=30)


@given(before=_PLAIN, secret=_CUT_SECRET, after=_PLAIN, data=st.data())
def test_an_env_secret_cut_by_the_tail_leaves_no_part_behind(
    before: str, secret: str, after: str, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(min_value=1, max_value=len(secret) - 1))
    kept = redact_tail(secret[cut:] + after, before + secret[:cut], [secret])
    assert kept == REDACTED + after


@given(before=_PLAIN, body=_KEY_BODY, prefix=_PREFIXES, after=_PLAIN, data=st.data())
def test_a_vendor_key_cut_by_the_tail_leaves_no_part_behind(
    before: str, body: str, prefix: str, after: str, data: st.DataObject
) -> None:
    key = prefix + body
    cut = data.draw(st.integers(min_value=1, max_value=len(key) - 1))
    after = " " + after  # a key runs on through any letter or digit
    assert redact_tail(key[cut:] + after, before + " " + key[:cut]) == REDACTED + after


@given(context=_SURROUNDING, tail=st.text(max_size=200))
def test_a_context_that_ends_its_line_changes_nothing(context: str, tail: str) -> None:
    # Only a credential running across the cut can need the context; none crosses a line.
    assert redact_tail(tail, context + "\n") == redact(tail)


def test_a_named_value_cut_by_the_tail_is_masked() -> None:
    assert redact_tail("9f0e1d2c rest", "GITHUB_TOKEN=a1b2c3") == f"{REDACTED} rest"
    assert redact_tail("123 next line", "line 1\nprocessed ") == "123 next line"
