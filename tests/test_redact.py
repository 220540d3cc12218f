"""execkit._redact: credentials never reach a stored tail; ordinary text survives.

Beyond the examples: every shape of tests/secrets_corpus.py is masked wherever it is
printed; the anchor pre-check is exact over all of Unicode; the output equals the frozen
reference (tests/_redact_reference.py) wherever that one masked correctly, and is the
reference output with more spans masked where a new shape occurs; a cut never lets a
credential grow back; each entry of the table of shapes says truly what its pattern does;
redaction is linear in the size of the text, held by counts (no test here is timed).
Every test runs under both engines (the compiled anchor scan and the pure-Python gate).
"""

from __future__ import annotations

import ast
import gc
import importlib
import itertools
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any
from unittest import mock

import _redact_reference as reference
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from secrets_corpus import (
    ADVERSARIAL,
    ATTACKS,
    NEGATIVES,
    SAMPLES,
    Sample,
    adversarial,
    leaked,
)

import execkit._redact as _redact_package
from execkit._redact import (
    REDACTED,
    engine,
    env,
    front,
    gate,
    looks_secret_name,
    record,
    redact,
    redact_argv,
    redact_tail,
    secret_env_values,
    shapes,
    tail,
    trace,
    words,
)
from execkit._redact.front import SHORTEST_MATCH


@pytest.fixture(autouse=True, scope="module", params=["hyperscan", "python"])
def redaction_engine(request: pytest.FixtureRequest) -> Iterator[str]:
    """Every test here runs under both engines: the compiled one (the `fast` extra, part
    of the `test` extra: `use_engine` fails, never skips, where it does not load) and the
    pure-Python one. Module-scoped, so Hypothesis sees no function-scoped fixture."""
    _redact_package.use_engine(request.param)
    yield request.param
    _redact_package.use_engine(None)


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


# ================================================================ the corpus: every shape

SAMPLE_IDS = [sample.name for sample in SAMPLES]
# Where a credential gets printed: alone, inside a line, at the start or the end of a line.
# (JSON-escaped inside a JSON string has its own test below.)
PLACEMENTS = {
    "alone": "{}",
    "in_text": "step 3 of 7: {} (retrying)\nnext line",
    "line_start": "{}\nmore output follows",
    "line_end": "output before it\n{}",
}


def placed(sample: Sample, placement: str) -> str:
    return PLACEMENTS[placement].replace("{}", sample.text)


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_every_sample_is_masked_wherever_it_is_printed(sample: Sample, placement: str) -> None:
    masked = redact(placed(sample, placement), sample.extra_secrets)
    assert not leaked(sample.secret, masked), masked
    assert REDACTED in masked


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_every_sample_is_masked_json_escaped(sample: Sample) -> None:
    event = json.dumps({"type": "tool_result", "content": f"ran it:\n{sample.text}\ndone"})
    masked = redact(event, sample.extra_secrets)
    assert not leaked(sample.secret, masked, escaped=True), masked
    # The JSON structure survives wherever the reference kept it. (`KEY=\"v\"` escaped
    # loses its backslash to the reference rule, whose value may start with one: masking
    # only ever more than the reference cannot give it back.)
    try:
        json.loads(reference.redact(event, sample.extra_secrets))
    except ValueError:
        return
    assert json.loads(masked)["type"] == "tool_result"


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_every_sample_survives_every_tail_cut(sample: Sample) -> None:
    text = placed(sample, "in_text")
    for cut in range(len(text) + 1):
        kept = redact_tail(text[cut:], text[:cut], sample.extra_secrets)
        assert not leaked(sample.secret, kept), (cut, kept)


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_the_corpus_says_truly_which_shapes_are_new(sample: Sample) -> None:
    # A shape marked as covered before is masked by the frozen reference; a new one is not.
    by_reference = reference.redact(sample.text, sample.extra_secrets)
    assert (not leaked(sample.secret, by_reference)) is sample.covered_before, by_reference


@pytest.mark.parametrize("sample", SAMPLES, ids=SAMPLE_IDS)
def test_a_masked_sample_stays_as_it_is(sample: Sample) -> None:
    once = redact(placed(sample, "in_text"), sample.extra_secrets)
    assert redact(once, sample.extra_secrets) == once


# Issue #44's kinds (secrets_corpus.ATTACKS), where more layers of quoting hide them than
# the placements above: a JSON string inside a JSON string, a CRLF request line.
ATTACK_CONTEXTS = {
    "json_in_json": lambda t: json.dumps({"body": json.dumps({"message": "a\n" + t})}),
    "crlf_json": lambda t: json.dumps({"raw": "POST / HTTP/1.1\r\n" + t + "\r\n"}),
    "log_line": lambda t: f"2026-01-02T03:04:05Z step 3: {t} (retrying)",
}


@pytest.mark.parametrize("context", list(ATTACK_CONTEXTS))
@pytest.mark.parametrize("sample", ATTACKS, ids=[sample.name for sample in ATTACKS])
def test_no_attack_survives_any_quoting(sample: Sample, context: str) -> None:
    text = ATTACK_CONTEXTS[context](sample.text)
    masked = redact(text)
    assert not leaked(sample.secret, masked), masked
    assert not leaked(sample.secret, masked, escaped=True), masked
    assert not leaked(json.dumps(sample.secret)[1:-1], masked, escaped=True), masked
    if context != "log_line":
        json.loads(masked)  # masks keep the JSON a JSON


# The attacks that are command lines: a flag and its value.
_COMMAND_LINES = [sample for sample in ATTACKS if " -" in sample.text and "{" not in sample.text]


@pytest.mark.parametrize("sample", _COMMAND_LINES, ids=[s.name for s in _COMMAND_LINES])
def test_no_attack_survives_as_an_argv(sample: Sample) -> None:
    # The same command line as the argv a process is started with: each argument alone
    # may look like nothing (`-pS3cret`, `bob:S3cret`), the command line before it says.
    argv = shlex.split(sample.text)
    stored = redact_argv(argv)
    assert not leaked(sample.secret, " ".join(stored)), stored


def test_a_placeholder_where_a_header_credential_goes_is_kept() -> None:
    # The server's 401 help text, and how documentation writes a header's credential.
    kept = [
        "unauthenticated: send Authorization: Bearer TOKEN",
        "curl -H 'Authorization: Bearer $GITHUB_TOKEN' https://api.github.com",
        'curl -H "Authorization: token ${API_KEY}" https://x.io',
        "Authorization: Bearer <token>",
        "set header Authorization: Bearer YOUR_API_KEY).",
        "Authorization: Basic xxxxxxxx",
        '{"msg": "retry\\nAuthorization: Bearer TOKEN\\n"}',
        '{"headers": "{\\"Authorization\\": \\"Bearer YOUR_TOKEN\\"}"}',
        "carries `Authorization: Bearer TOKEN`. The tokens file",
    ]
    for text in kept:
        assert redact(text) == text
        assert redact_tail(text[9:], text[:9]) == text[9:]
    # A value that is a credential is masked however it is written.
    masked = [
        ("Authorization: Bearer TOKEN9x8Y7z6W5v", "TOKEN9x8Y7z6W5v"),  # digits: a key
        ("Authorization: Bearer $ecretPassw0rd", "$ecretPassw0rd"),  # mixed case
        ("Authorization: Bearer MyApiKey", "MyApiKey"),  # not a placeholder's capitals
        ("Bearer abcdefgh12345678", "abcdefgh12345678"),
    ]
    for text, secret in masked:
        assert secret not in redact(text), text


@pytest.mark.parametrize("text", NEGATIVES)
def test_look_alikes_are_left_alone(text: str) -> None:
    assert redact(text) == text
    for cut in range(0, len(text) + 1, 7):
        assert redact_tail(text[cut:], text[:cut]) == text[cut:]


def test_the_corpus_holds_every_shape_asked_for() -> None:
    names = {sample.name for sample in SAMPLES}
    asked = {
        "aws_access_key_id", "aws_secret_prompt", "slack_webhook", "jwt", "url_password",
        "pem_rsa_private_key", "openssh_private_key", "postgres_url", "postgresql_url",
        "mysql_url", "mongodb_srv_url", "redis_url", "amqp_url", "azure_account_key",
        "azure_shared_access_key", "stripe_live_key", "stripe_restricted_key",
        "stripe_test_key", "npm_token", "huggingface_token", "gitlab_pat", "twilio_api_key",
        "sendgrid_key", "cookie_header", "set_cookie_header", "openai_key", "anthropic_key",
        "google_api_key", "github_token", "github_fine_grained_pat", "slack_bot_token",
        "authorization_bearer", "bearer_token", "env_assignment", "api_key_flag",
        "env_literal",
    }  # fmt: skip
    assert asked <= names, sorted(asked - names)
    assert len({sample.secret for sample in SAMPLES}) == len(SAMPLES)
    # No two secrets share 8 characters (`leaked`'s piece): a leak of one sample must not
    # read as a leak of another in the sink tests.
    seen: dict[str, str] = {}
    for sample in SAMPLES:
        for at in range(max(1, len(sample.secret) - 7)):
            piece = sample.secret[at : at + 8]
            assert seen.setdefault(piece, sample.name) == sample.name, (piece, sample.name)


# ================================================================ the anchor pre-check

ALL_CODE_POINTS = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
ALL_PASSES = engine.REFERENCE_PASSES + engine.EXTRA_PASSES
# Text full of anchor letters and their look-alikes (KELVIN SIGN, long s, dotted and
# dotless i).
_LOOKALIKE_TEXT = st.text(
    alphabet=st.sampled_from(
        [*"aeiksotnrcpwdybhzlKISTAEBP-_:=./@\\ \n'\"", "\u212a", "\u017f", "\u0130", "\u0131"]
    ),
    max_size=80,
)


def folded_anchor_chars() -> set[str]:
    chars = {
        char
        for step in ALL_PASSES
        for group in step.anchors
        for literal, folded in group
        if folded
        for char in literal
    }
    return chars | {char.upper() for char in chars}


def look_alikes(char: str) -> list[str]:
    """Every code point a case-insensitive `re` pattern matches to `char`."""
    pattern = re.compile(re.escape(char), re.IGNORECASE)
    return [match.group() for match in pattern.finditer(ALL_CODE_POINTS)]


def test_the_fold_maps_every_case_insensitive_look_alike_to_its_anchor_letter() -> None:
    # For every character of every case-insensitive anchor, scan all of Unicode for what
    # IGNORECASE matches to it: each such code point must fold to the anchor's character.
    tested: dict[str, list[str]] = {}
    for char in sorted(folded_anchor_chars()):
        alikes = look_alikes(char)
        assert char in alikes
        for alike in alikes:
            assert gate.fold(alike) == char.lower(), (char, hex(ord(alike)))
            # ... and inside a text too: the fold of a text is the fold of its characters.
            assert gate.fold(f"\u03a3x{alike}\u0130") == f"σx{char.lower()}i"
        tested[char] = alikes
    # The scan really reaches the characters that lower() alone gets wrong.
    assert "\u212a" in tested["k"] and "\u017f" in tested["s"]
    assert {"\u0130", "\u0131"} <= set(tested["i"])


def test_the_fold_table_is_exactly_what_lower_misses() -> None:
    # Over all of Unicode: the code points IGNORECASE pairs with an ASCII letter but that
    # lower() does not turn into it are exactly the table's; digits and the punctuation
    # of anchors pair with themselves only.
    missed = {
        (alike, letter)
        for letter in "abcdefghijklmnopqrstuvwxyz"
        for alike in look_alikes(letter)
        if alike.lower() != letter
    }
    assert missed == set(gate.FOLD_FIXES)
    for char in "0123456789-_.:/@\\=+ ":
        assert look_alikes(char) == [char]


def test_a_lowered_pattern_on_the_fold_matches_what_ignorecase_matches() -> None:
    # Why folded passes equal the reference's IGNORECASE patterns, checked over all of
    # Unicode: the fold keeps every length (so offsets carry over), keeps what is a word
    # character, whitespace or a newline, and each character class of the folded sources
    # matches, case-sensitive on the fold, exactly where it matches with IGNORECASE on the
    # text. (Letters: test_the_fold_table_is_exactly_what_lower_misses.)
    low = gate.fold(ALL_CODE_POINTS)
    assert len(low) == len(ALL_CODE_POINTS)

    def where(pattern: str, text: str, flags: int = 0) -> list[int]:
        return [m.start() for m in re.finditer(pattern, text, flags)]

    for category in (r"\w", r"\s", r"\n", "."):
        assert where(category, ALL_CODE_POINTS) == where(category, low), category
    classes = {
        found
        for step in ALL_PASSES
        if step.folded
        for found in re.findall(r"\[(?:\\.|[^\]\\])*\]", step.source)
    }
    assert len(classes) > 10
    for char_class in sorted(classes):
        on_text = where(char_class, ALL_CODE_POINTS, re.IGNORECASE)
        assert on_text == where(char_class, low), char_class
    for letter in "abcdefghijklmnopqrstuvwxyz":
        assert where(letter, ALL_CODE_POINTS, re.IGNORECASE) == where(letter, low), letter


def _reference_mask(match: re.Match[str]) -> str:
    """The reference's mask (`_mask_value`), but for the one place the redactor masks less
    since issue #44: a header rule's value that is a placeholder (`Bearer TOKEN`,
    engine.is_placeholder) is kept."""
    if match.re in (reference._AUTH_HEADER, reference._BEARER) and _placeholder(match):
        return match.group()
    return match.group(1) + REDACTED


def _placeholder(match: re.Match[str]) -> bool:
    """Whether a header rule's match masks a placeholder (what the engine reads)."""
    return engine._placeholder_at(match.string, match.end(1), match.end())


def reference_redact(text: str, extras: tuple[str, ...] = ()) -> str:
    """`reference.redact`, a placeholder kept (`_reference_mask`)."""
    with mock.patch.object(reference, "_mask_value", _reference_mask):
        return reference.redact(text, extras)


def reference_redact_tail(tail: str, context: str, extras: tuple[str, ...] = ()) -> str:
    """`reference.redact_tail`, a placeholder kept (`_reference_mask`)."""
    with mock.patch.object(reference, "_mask_value", _reference_mask):
        return reference.redact_tail(tail, context, extras)


def test_the_reference_keeps_what_the_redactor_keeps_and_no_more() -> None:
    help_text = "unauthenticated: send Authorization: Bearer TOKEN"
    assert reference.redact(help_text).endswith("Bearer [REDACTED]")  # the frozen one
    assert reference_redact(help_text) == help_text == redact(help_text)
    key = "Authorization: Bearer AbC123dEf456GhI789"
    assert reference_redact(key) == reference.redact(key) == redact(key) != key


_REFERENCE_PATTERNS = {
    "vendor_key": reference._VENDOR_KEYS,
    "authorization": reference._AUTH_HEADER,
    "bearer": reference._BEARER,
    "key_value": reference._KEY_VALUE,
    "secret_flag": reference._SECRET_FLAG,
}


@settings(max_examples=1000, deadline=None)
@given(
    parts=st.lists(
        st.one_of(
            _LOOKALIKE_TEXT,
            st.text(max_size=20),
            st.sampled_from(
                [s.text for s in SAMPLES]
                + ["sk-", "AIza", "ghp_", "xoxb-", "token", "secret", "key", ": ", "=", "_"]
                + ["api", "private", "access", "passw", "credential", "s ", "\t", '"']
                + ["Authorization: ", "Bearer ", "TOKEN", "$API_KEY", "<token>", "YOUR_KEY"]
            ),
        ),
        max_size=8,
    )
)
def test_each_reference_rule_matches_as_it_did(parts: list[str]) -> None:
    # The rewritten reference rules (literal first; lowered, on the fold; `key_value`
    # tried only where a name can start) find the very matches the old patterns find,
    # but for a header rule's placeholder value, which they keep (`_reference_mask`).
    text = "".join(parts)
    low = gate.fold(text)
    for step in engine.REFERENCE_PASSES:
        pattern = _REFERENCE_PATTERNS[step.name]
        keeps = step.placeholders
        old = [m.span() for m in pattern.finditer(text) if not (keeps and _placeholder(m))]
        new = [(start, end) for start, end, _, _ in engine.find_spans(step, text, low)]
        assert new == old, step.name
        matches = step.pattern.finditer(low if step.folded else text)
        assert new == [
            m.span()
            for m in matches
            if not (keeps and engine._placeholder_at(text, m.end(1), m.end()))
        ]


def test_each_look_alike_of_an_anchor_still_opens_its_pass() -> None:
    # Take each sample a case-insensitive pass masks and swap each anchor character in it
    # for each of its look-alikes: wherever the pattern still matches, the gate must open.
    alikes = {char: look_alikes(char) for char in folded_anchor_chars()}
    exercised = 0
    for step in ALL_PASSES:
        folded = [literal for group in step.anchors for literal, f in group if f]
        for sample in SAMPLES:
            text = sample.text
            if not folded or not engine.find_spans(step, text, gate.fold(text)):
                continue
            low = gate.fold(text)
            for literal in folded:
                at = low.find(literal)
                if at < 0:
                    continue
                for offset, char in enumerate(literal):
                    for alike in alikes.get(char, []) + alikes.get(char.upper(), []):
                        variant = text[: at + offset] + alike + text[at + offset + 1 :]
                        if engine.find_spans(step, variant, gate.fold(variant)):
                            exercised += 1
                            assert gate.Gate(variant).opens(step), (step.name, variant)
                            big = variant + " " * (gate.EAGER_CHARS + 1)  # the lazy gate
                            assert gate.Gate(big).opens(step), (step.name, variant)
    assert exercised > 100


def test_anchor_kinds_follow_where_the_pattern_runs() -> None:
    # A folded pass runs on the fold (a lowered, case-sensitive source) and looks for its
    # anchors there; any other pass runs on the text, case-sensitive, anchors as written.
    outside_classes = re.compile(r"\\.|\[(?:\\.|[^\]\\])*\]")
    for step in ALL_PASSES:
        assert not step.pattern.flags & re.IGNORECASE, step.name
        kinds = {
            f for group in step.anchors for literal, f in group if re.search("[a-zA-Z]", literal)
        }
        if step.folded:
            assert kinds <= {True}, step.name
            # No upper-case letter outside a class: the fold has none, it would never match.
            assert not re.search("[A-Z]", outside_classes.sub("", step.source)), step.name
        elif step.nearby is not None:  # the fold holds its wording, the text its key
            assert kinds == {True}, step.name
        else:
            assert kinds <= {False}, step.name


def test_no_anchor_hides_in_the_marker() -> None:
    # Masking never creates an anchor, so one look at the text serves every pass.
    for step in ALL_PASSES:
        for group in step.anchors:
            for literal, folded in group:
                assert "[" not in literal and "]" not in literal
                marker = gate.fold(REDACTED) if folded else REDACTED
                assert literal not in marker, literal


def test_a_token_after_a_credential_word_is_as_long_as_its_finder_asks() -> None:
    # The finder of words with a token after them looks ahead for as many characters as
    # the shape's pattern needs at least (engine.ADJACENT_TOKEN).
    parser: Any = importlib.import_module("re._parser")
    (shape,) = [shape for shape in shapes.SHAPES if shape.name == "credential_word_token"]
    assert parser.parse(shape.pattern).getwidth()[0] == engine.ADJACENT_TOKEN
    assert f"{{{engine.ADJACENT_TOKEN}}}" in engine._adjacent_finder(("key",)).pattern


def test_no_pattern_matches_fewer_characters_than_the_length_short_cut() -> None:
    # A `nearby` shape's match follows one of its words on the line: the text holds both.
    parser: Any = importlib.import_module("re._parser")
    for step in ALL_PASSES:
        word = min(map(len, step.nearby.words)) if step.nearby is not None else 0
        assert parser.parse(step.source).getwidth()[0] + word >= SHORTEST_MATCH, step.name


def _redact_ungated(text: str, extras: tuple[str, ...] = ()) -> str:
    with (
        mock.patch.object(gate.Gate, "opens", lambda self, step: True),
        mock.patch.object(gate.Gate, "empty", property(lambda self: False)),
    ):
        return redact(text, extras)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(
        st.one_of(_LOOKALIKE_TEXT, st.sampled_from([s.text for s in SAMPLES])), max_size=4
    ),
    swaps=st.lists(st.integers(min_value=0, max_value=10_000), max_size=6),
    alike=st.sampled_from(["\u212a", "\u017f", "\u0130", "\u0131"]),
)
def test_the_gate_never_changes_the_output(parts: list[str], swaps: list[int], alike: str) -> None:
    text = " ".join(parts)
    for swap in swaps:  # look-alikes dropped into the samples' own words
        if text:
            at = swap % len(text)
            text = text[:at] + alike + text[at + 1 :]
    assert redact(text) == _redact_ungated(text)
    big = text + "\n" * (gate.EAGER_CHARS + 1)  # the gate that looks lazily
    assert redact(big) == _redact_ungated(big)


# ================================================================ against the frozen reference


def masks_at_least(new: str, old: str) -> bool:
    """True when `new` is `old` with more spans masked.

    Precisely: split `new` at its markers into the literal runs L0, L1, ..., Lk. Then `old`
    must read L0 G1 L1 G2 ... Gk Lk, where every gap Gi is non-empty and every marker of
    `old` lies inside a gap. So everything `new` keeps, `old` keeps too, in the same order
    and places, and each of `old`'s masks is inside one of `new`'s (`new`'s marker may
    cover more, and merge several). Runs are placed leftmost first, which finds such a
    reading whenever one exists.
    """
    runs = new.split(REDACTED)
    if len(runs) == 1:
        return new == old
    marks = [match.span() for match in re.finditer(re.escape(REDACTED), old)]

    def clear(start: int, end: int) -> bool:
        if start == end:
            return not any(a < start < b for a, b in marks)
        return not any(start < b and a < end for a, b in marks)

    first, *middle, last = runs
    if not old.startswith(first) or not clear(0, len(first)):
        return False
    position = len(first)
    for run in middle:
        at = old.find(run, position + 1)
        while at >= 0 and not clear(at, at + len(run)):
            at = old.find(run, at + 1)
        if at < 0:
            return False
        position = at + len(run)
    end = len(old) - len(last)
    return end > position and old.endswith(last) and clear(end, len(old))


def test_the_superset_check_means_what_it_says() -> None:
    m = REDACTED
    assert masks_at_least("a b", "a b")
    assert masks_at_least(f"a {m}", f"a {m}")
    assert masks_at_least(f"a {m}", "a secret")
    assert masks_at_least(f"{m} c", f"{m} {m} c")  # one marker over two
    assert masks_at_least(f"k={m}", f"k={m}/tail")
    assert masks_at_least(f"{m}{m}", f"{m}x")
    assert not masks_at_least("a secret", f"a {m}")  # keeps what the old one masked
    assert not masks_at_least(f"b {m}", f"a {m}")  # changed what it kept
    assert not masks_at_least(f"a {m} x y", f"a {m} x")  # added text
    assert not masks_at_least(f"{m}{m}", m)  # a marker cannot be split in two
    assert not masks_at_least(f"x{m}y", "xy")  # a marker must stand for something


def adds_nothing(text: str, extras: tuple[str, ...] = ()) -> bool:
    """True when no shape added since the reference masks anything in `text`."""
    secrets = front.literal_secrets(extras)
    traced = trace.Trace(text)
    traced.reference_phases(secrets)
    return not traced.extra_masks(secrets)


_OLD_SAMPLES = [s for s in SAMPLES if s.covered_before]
_ANY_TEXT = st.text(alphabet=st.characters(codec="utf-8"), max_size=30)
_LOG_TEXT = st.text(alphabet=st.sampled_from(list("abc xyz:=/'\"-_.@\n\t0129")), max_size=30)
_GLUE = st.sampled_from(["", " ", "\n", "=", ": ", '"', "\\", "-----"])
_Case = tuple[str, tuple[str, ...]]


def corpus_texts(samples: list[Sample]) -> st.SearchStrategy[_Case]:
    """Texts mixing corpus samples, log-like and arbitrary text; with the samples' extras."""
    part: st.SearchStrategy[_Case] = st.one_of(
        st.sampled_from(samples).map(lambda s: (s.text, s.extra_secrets)),
        st.sampled_from(NEGATIVES).map(lambda t: (t, ())),  # placeholders among them
        _ANY_TEXT.map(lambda t: (t, ())),
        _LOG_TEXT.map(lambda t: (t, ())),
        _GLUE.map(lambda t: (t, ())),
    )

    def join(parts: list[_Case]) -> _Case:
        return "".join(text for text, _ in parts), tuple(x for _, e in parts for x in e)

    return st.lists(part, max_size=7).map(join)


def _escapes_kept(text: str) -> str:
    """`text` read modulo the one place the redactor now masks less than the reference:
    the backslash of an escaped quote right after a mask, which the reference masked
    (breaking the line's JSON) and the redactor keeps (engine.keep_escapes); and the
    backslash before a mask, which the redactor now masks with it."""
    return (
        text.replace(REDACTED + '\\"', REDACTED + '"')
        .replace(REDACTED + "\\'", REDACTED + "'")
        .replace("\\" + REDACTED, REDACTED)
    )


def _redact_kept(text: str, extras: tuple[str, ...]) -> str:
    return _escapes_kept(redact(text, extras))


def check_against_reference(text: str, extras: tuple[str, ...], data: st.DataObject) -> None:
    """New ⊇ reference always; new == reference when no added shape masks anything (in
    the text, or for a tail in context + tail). Also after a cut, with any context. Both
    read modulo `_escapes_kept`: masks never break an escape; and the reference keeps a
    header's placeholder as the redactor does (`_reference_mask`)."""
    new, old = _redact_kept(text, extras), _escapes_kept(reference_redact(text, extras))
    assert masks_at_least(new, old), (text, new, old)
    if adds_nothing(text, extras):
        assert new == old
    cut = data.draw(st.integers(min_value=0, max_value=len(text)), label="cut")
    start = data.draw(st.integers(min_value=0, max_value=cut), label="context start")
    tail, context = text[cut:], text[start:cut]
    new = _escapes_kept(redact_tail(tail, context, extras))
    old = _escapes_kept(reference_redact_tail(tail, context, extras))
    # Or at least what the reference masks of the whole text, in the tail: where a cut
    # falls inside a header's name (`x-a|pi-key: sk-ant-…`), the reference masked the tail
    # from its start (the name's rest with the value), the redactor only the value, as it
    # does for the text uncut; the name is no secret.
    whole = _escapes_kept(reference_redact(context + tail, extras))
    in_tail = whole[len(context) :] if whole.startswith(context) else None
    assert masks_at_least(new, old) or (in_tail is not None and masks_at_least(new, in_tail)), (
        tail,
        context,
        new,
        old,
    )
    if adds_nothing(context + tail, extras):
        assert new in (old, in_tail), (tail, context)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=corpus_texts(_OLD_SAMPLES), data=st.data())
def test_the_reference_shapes_come_out_exactly_as_before(case: _Case, data: st.DataObject) -> None:
    check_against_reference(*case, data)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=corpus_texts(list(SAMPLES)), data=st.data())
def test_new_shapes_only_ever_mask_more(case: _Case, data: st.DataObject) -> None:
    check_against_reference(*case, data)


@settings(max_examples=500, deadline=None)
@given(
    text=st.text(max_size=120),
    secret=st.text(alphabet="abcdefghij0123456789\n", min_size=8, max_size=20),
    data=st.data(),
)
def test_literal_secrets_come_out_as_before(text: str, secret: str, data: st.DataObject) -> None:
    # The literal phase and its interplay with the cut, a newline inside a secret included.
    at = data.draw(st.integers(min_value=0, max_value=len(text)))
    check_against_reference(text[:at] + secret + text[at:], (secret,), data)


# A text longer than this takes the lazy gate, the one-by-one searches for alternatives,
# and each lead pass's own search: the padding puts every case on those paths too.
_LONG_PAD = "\n" * (gate.EAGER_CHARS + 1)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=corpus_texts(list(SAMPLES)), data=st.data())
def test_a_long_text_comes_out_as_the_reference_and_as_a_short_one(
    case: _Case, data: st.DataObject
) -> None:
    # No rule matches across a blank line's worth of newlines at either end of a text, so
    # padding changes nothing but which way the redactor goes about it.
    text, extras = case
    if any("\n" in extra for extra in extras):
        return  # a literal secret may hold a newline: then padding is not neutral
    long = _LONG_PAD + text + _LONG_PAD
    assert redact(long, extras) == _LONG_PAD + redact(text, extras) + _LONG_PAD
    check_against_reference(long, extras, data)


_ALTERNATIVE_PARTS = st.lists(
    st.sampled_from(
        [
            *("sk-", "sk_", "rk_", "live_", "test_", "AIza", "ghp_", "gho_", "github_pat_"),
            *("gh", "xoxb-", "xox", "_", "-", " ", "\n", "a", "Z9", "abcdefghijklmnop"),
        ]
    ),
    max_size=24,
)


@settings(max_examples=1500, deadline=None)
@given(parts=_ALTERNATIVE_PARTS)
def test_alternatives_searched_one_by_one_find_what_the_alternation_finds(
    parts: list[str],
) -> None:
    # Prefixes that run into each other, keys inside keys, a match that hides the start of
    # another: the one-by-one searches must take the same matches, in the same order.
    text = "".join(parts)
    with_alternatives = [step for step in ALL_PASSES if step.alternative_sources]
    assert {step.name for step in with_alternatives} >= {"vendor_key", "stripe"}
    for step in with_alternatives:
        expected = [m.span() for m in step.pattern.finditer(text)]
        found = [m.span() for m in engine.alternation_matches(step.alternatives, text)]
        assert found == expected, step.name


def test_a_key_inside_a_longer_key_is_not_matched_again() -> None:
    # The Slack shape on its own finds a token inside the OpenAI key's body; the pass's
    # pattern does not, and neither do the one-by-one searches.
    text = "sk-" + "a" * 10 + "-xoxb-" + "c" * 12
    step = next(step for step in ALL_PASSES if step.name == "vendor_key")
    slack = next(pattern for pattern in step.alternatives if pattern.pattern.startswith("xox"))
    assert slack.search(text) is not None
    assert [m.span() for m in step.pattern.finditer(text)] == [(0, len(text))]
    found = [m.span() for m in engine.alternation_matches(step.alternatives, text)]
    assert found == [(0, len(text))]


def test_the_fold_of_a_long_text_is_the_fold_of_the_whole() -> None:
    # Folded a piece at a time, with the look-alikes just before, on and after each cut
    # between pieces: the same characters as replacing them and lowering the whole text.
    # (Greek capital sigma, the one letter whose lowering looks at its neighbours, is left
    # out: either of its lower cases is a word character and no anchor.)
    piece = gate.FOLD_PIECE
    alphabet = [chr(c) for c in range(0x20, 0x3000) if chr(c) != "\u03a3"]
    chars = [alphabet[(i * 7919) % len(alphabet)] for i in range(3 * piece + 17)]
    for cut in (piece, 2 * piece):
        chars[cut - 1 : cut + 2] = ["\u0130", "\u212a", "\u017f"]
    chars[-1] = "\u0131"
    text = "".join(chars)
    whole = text
    for char, letter in gate.FOLD_FIXES:
        whole = whole.replace(char, letter)
    assert gate.fold(text) == whole.lower()


@settings(max_examples=300, deadline=None)
@given(case=corpus_texts(list(SAMPLES)))
def test_a_context_ending_a_line_gives_the_lone_redaction(case: _Case) -> None:
    text, extras = case
    assert redact_tail(text, "any thing\n", extras) == redact(text, extras)


# ================================================================ cuts


_FILLER = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)


@settings(max_examples=1500, deadline=None)
@given(
    sample=st.sampled_from(SAMPLES),
    before=_FILLER,
    after=_FILLER,
    gap=st.sampled_from([" ", "\n", " \n"]),
    data=st.data(),
)
def test_a_cut_never_lets_a_secret_grow_back(
    sample: Sample, before: str, after: str, gap: str, data: st.DataObject
) -> None:
    text = before + gap + sample.text + gap + after
    cut = data.draw(st.integers(min_value=0, max_value=len(text)), label="cut")
    # However much context the buffer kept, as long as it reaches back to the sample.
    start = data.draw(st.integers(min_value=0, max_value=min(cut, len(before))), label="start")
    kept = redact_tail(text[cut:], text[start:cut], sample.extra_secrets)
    assert not leaked(sample.secret, kept), (cut, kept)


def test_a_secret_across_the_cut_is_masked_from_the_start_of_the_tail() -> None:
    key = "AKIA" + "Q" * 15 + "7"
    text = f"line one\nexport AWS_ACCESS_KEY_ID={key} done\nlast line\n"
    cut = text.index(key) + 6
    assert redact_tail(text[cut:], text[:cut]) == f"{REDACTED} done\nlast line\n"


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=corpus_texts(list(SAMPLES)))
def test_a_named_pattern_scanned_whole_finds_what_its_starts_find(case: _Case) -> None:
    # Where names are dense the named patterns scan the whole fold instead of trying each
    # start: the two ways must take the same matches.
    low = gate.fold(case[0])
    named = [step for step in ALL_PASSES if step.named]
    assert {step.name for step in named} == {"key_value", "escaped_key_value"}
    for step in named:
        tried = engine.matches_from(step.pattern, low, gate.name_starts(low))
        assert [m.span() for m in step.pattern.finditer(low)] == [m.span() for m in tried]


def test_a_long_text_dense_with_credentials_is_redacted_as_its_lines() -> None:
    # The dense ways (a named pattern scanning the whole fold, masks laid into a long
    # trace) on a text past every size threshold give what redacting each line alone
    # gives: no rule matches across a newline but a private key block, left out here.
    lines = [
        sample.text.replace("\n", " ") + "\n"
        for sample in SAMPLES
        if not sample.extra_secrets and "PRIVATE KEY" not in sample.text
    ]
    # Named values, often enough that the text is dense with names whatever else the
    # corpus holds.
    lines += ["api_key=abc", "token: x y", '"password": "p4ss"', "no secret here"] * 16
    lines = [line if line.endswith("\n") else line + "\n" for line in lines]
    text_lines = lines * (5 * engine.DENSE_SAMPLE // len("".join(lines)) + 1)
    text = "".join(text_lines)
    assert engine.names_dense(gate.fold(text))
    expected = "".join(redact(line) for line in lines) * (len(text_lines) // len(lines))
    assert redact(text) == expected
    assert redact_tail(text, "some context\nbefore the cut ") == expected
    cut = len(lines[0]) // 2
    assert redact_tail(text[cut:], text[:cut]).endswith(expected[len(redact(lines[0])) :])


def test_a_cut_tail_is_redacted_once() -> None:
    # Only context + the tail's first line is traced (no match can run past its newline);
    # when a match runs across the cut, that first line alone is redacted again (what the
    # old rule compares). The rest of the tail is redacted once, on its own.
    lines = "".join(f"line {i}: all is well\n" for i in range(3000))
    lengths: list[int] = []
    original_init = trace.Trace.__init__

    def counting(self: trace.Trace, text: str, given: gate.Gate | None = None) -> None:
        lengths.append(len(text))
        original_init(self, text, given)

    key = "sk-" + "a" * 30
    context, tail = f"head\npassword={key[:10]}", key[10:] + " rest\n" + lines
    with mock.patch.object(trace.Trace, "__init__", counting):
        assert redact_tail(lines, "head\nmore\n") == lines
        assert lengths == [len("head\nmore\n") + len("line 0: all is well\n")]
        lengths.clear()
        kept = redact_tail(tail, context)
        first_line = len(key) - 10 + len(" rest\n")
        assert lengths == [len(context) + first_line, first_line]
        lengths.clear()
        # A first line that is most of the tail is traced with the rest, once, rather
        # than redacted three times over.
        one_line = "x=1 " * 5000 + "\nlast\n"
        assert redact_tail(one_line, "head\n") == one_line
        assert lengths == [len("head\n") + len(one_line)]
    assert kept == REDACTED + " rest\n" + lines == reference.redact_tail(tail, context)


# ================================================================ the table of shapes

SHAPE_IDS = [shape.name for shape in shapes.SHAPES]


def test_the_package_docstring_lists_the_table() -> None:
    # The list is written by record.shape_list; paste its output when a shape changes.
    # The provider rules (rules.toml) are listed in docs/formats.md's terms, not here.
    listed = record.shape_list(shapes.TABLE)
    assert listed in (_redact_package.__doc__ or ""), f"the docstring should list:\n{listed}"
    assert listed.count("\n- `") + 1 == len(shapes.TABLE)
    assert shapes.SHAPES == shapes.TABLE + shapes.PROVIDER_SHAPES


def test_the_table_names_each_shape_once_and_compiles_to_the_passes() -> None:
    names = [shape.name for shape in shapes.SHAPES]
    assert len(set(names)) == len(names)
    passed = [shape.name for step in ALL_PASSES for shape in step.shapes]
    assert passed == names  # phase 2 first, then phase 3, each in table order
    assert [step.name for step in engine.REFERENCE_PASSES] == list(_REFERENCE_PATTERNS)
    by_name = {step.name: step for step in ALL_PASSES}
    assert len(by_name["vendor_key"].alternative_sources) == 5
    assert len(by_name["stripe"].alternative_sources) == 2
    for step in ALL_PASSES:
        assert step.source == "|".join(shape.pattern for shape in step.shapes)


@pytest.mark.parametrize("shape", shapes.SHAPES, ids=SHAPE_IDS)
def test_each_example_is_masked_where_it_is_marked(shape: record.Shape) -> None:
    # `redact` gives the example with its «» span masked, and the shape on its own masks
    # exactly that span (so the example shows what this shape does, not a neighbour's).
    text, expected = record.example_of(shape)
    assert redact(text) == expected
    assert redact_tail(text, "context\n") == expected
    start = expected.index(REDACTED)
    end = start + len(text) - len(expected) + len(REDACTED)
    alone = engine.Pass([shape])
    masked = [(a, b) for _, _, a, b in engine.find_spans(alone, text, gate.fold(text))]
    assert masked == [(start, end)], (masked, text[start:end])


def test_derived_facts_come_from_the_table() -> None:
    # What the tail handling knows of the shapes is derived, and means what it says: a
    # boundary rule of phase 2 matches only from its opening literal on.
    assert shapes.BOUNDARY_STARTS == (
        "sk-", "aiza", "gh", "github_pat_", "xox", "authorization", "bearer",
    )  # fmt: skip
    assert shapes.LINE_CROSSING_STARTS == ("-----BEGIN", "Private-Lines")
    texts = [sample.text for sample in SAMPLES] + [record.example_of(s)[0] for s in shapes.SHAPES]
    checked = 0
    for shape in shapes.SHAPES:
        if shape.phase is not record.Phase.REFERENCE or not shape.boundary:
            continue
        opening = record.opening_literal(shape.pattern).lower()
        assert opening, shape.name
        for text in texts:
            for match in re.finditer(shape.pattern, gate.fold(text) if shape.folded else text):
                checked += 1
                assert gate.fold(match.group()).startswith(opening), (shape.name, match)
    assert checked >= 10


_parser: Any = importlib.import_module("re._parser")
_constants: Any = importlib.import_module("re._constants")
_OP = _constants  # opcodes: LITERAL, IN, BRANCH, SUBPATTERN, MAX_REPEAT...
_REPEATS = {_OP.MAX_REPEAT, _OP.MIN_REPEAT, _OP.POSSESSIVE_REPEAT}
_CATEGORIES = {
    _OP.CATEGORY_DIGIT: r"\d", _OP.CATEGORY_NOT_DIGIT: r"\D", _OP.CATEGORY_SPACE: r"\s",
    _OP.CATEGORY_NOT_SPACE: r"\S", _OP.CATEGORY_WORD: r"\w", _OP.CATEGORY_NOT_WORD: r"\W",
}  # fmt: skip


def _accepts(op: Any, arg: Any, char: str) -> bool:
    """Whether one consuming node of a parsed pattern matches `char`."""
    if op is _OP.LITERAL:
        return bool(chr(arg) == char)
    if op is _OP.NOT_LITERAL:
        return bool(chr(arg) != char)
    if op is _OP.ANY:
        return char != "\n"
    assert op is _OP.IN, op
    negate = bool(arg) and arg[0][0] is _OP.NEGATE
    found = False
    for item_op, item in arg[1:] if negate else arg:
        if item_op is _OP.LITERAL:
            found = found or chr(item) == char
        elif item_op is _OP.RANGE:
            found = found or item[0] <= ord(char) <= item[1]
        else:
            assert item_op is _OP.CATEGORY, item_op
            found = found or re.fullmatch(_CATEGORIES[item], char) is not None
    return found is not negate


def _consumers(items: Any) -> Any:
    """Every consuming node of a parsed pattern (look-arounds left out: they consume none)."""
    for op, arg in items:
        if op in (_OP.LITERAL, _OP.NOT_LITERAL, _OP.ANY, _OP.IN):
            yield op, arg
        elif op is _OP.SUBPATTERN:
            yield from _consumers(arg[3])
        elif op is _OP.BRANCH:
            for branch in arg[1]:
                yield from _consumers(branch)
        elif op in _REPEATS:
            yield from _consumers(arg[2])
        elif op is _OP.ATOMIC_GROUP:
            yield from _consumers(arg)
        else:
            assert op in (_OP.ASSERT, _OP.ASSERT_NOT, _OP.AT), op


def _opens_looking_behind(items: Any) -> bool | None:
    """True when the pattern looks behind before it repeats anything: at its start, or
    after a fixed opening (literals, classes, groups and alternations of those); None
    when the items are such an opening and no more."""
    for op, arg in items:
        if op in (_OP.LITERAL, _OP.NOT_LITERAL, _OP.ANY, _OP.IN):
            continue
        if op in (_OP.ASSERT_NOT, _OP.ASSERT) and arg[0] == -1:
            return True  # a look-behind, negative or (an escape before a prefix) positive
        if op is _OP.SUBPATTERN:
            found = _opens_looking_behind(arg[3])
        elif op is _OP.BRANCH:
            each = {_opens_looking_behind(branch) for branch in arg[1]}
            found = each.pop() if len(each) == 1 else False
        else:
            return False
        if found is not None:
            return found
    return None


@pytest.mark.parametrize("shape", shapes.SHAPES, ids=SHAPE_IDS)
def test_each_shape_says_truly_how_it_starts_and_ends(shape: record.Shape) -> None:
    parsed = _parser.parse(shape.pattern)
    # `boundary`: the pattern looks at the character before the match.
    assert bool(_opens_looking_behind(parsed)) is shape.boundary
    # `crosses_lines`: some part of a match can be a newline (what `redact_tail` relies on
    # to trace only the first line after a cut).
    crosses = any(_accepts(op, arg, "\n") for op, arg in _consumers(parsed))
    assert crosses is shape.crosses_lines
    if shape.nearby is not None:  # the search after a word stops at the longest match
        assert parsed.getwidth()[1] == shape.nearby.longest


def test_an_alternation_is_one_pass_of_adjacent_alike_shapes() -> None:
    by_name = {shape.name: shape for shape in shapes.SHAPES}
    openai, github = by_name["openai_key"], by_name["github_token"]
    (joined,) = engine.compile_passes([openai, github])
    assert joined.name == "vendor_key" and joined.lead
    assert joined.source == f"{openai.pattern}|{github.pattern}"
    assert joined.alternative_leads == ("sk-", "gh")
    assert joined.anchors == ((("sk-", False), *github.anchors[0]),)
    with pytest.raises(ValueError, match="not adjacent"):
        engine.compile_passes([openai, by_name["bearer"], github])
    with pytest.raises(ValueError, match="differs in folded"):
        engine.compile_passes([openai, attrs.evolve(github, folded=True)])
    alone = attrs.evolve(openai, alternation=None)
    with pytest.raises(ValueError, match="share a name"):
        engine.compile_passes([alone, by_name["bearer"], alone])


def test_the_table_is_loaded_on_the_first_text_a_rule_could_match() -> None:
    # Start-up time: a run that redacts only short words (`execkit run -- true`) never
    # pays for the table, its passes or the attrs classes behind them.
    probe = """
import json, sys
import execkit._redact as r
def loaded():
    return sorted(m for m in sys.modules if m.startswith("execkit._redact.") or m == "attrs")
before = loaded()
r.redact_argv(["true"]); r.redact("ok"); r.redact_tail("", ""); r.secret_env_values({})
words = loaded()
r.redact("a longer line")
print(json.dumps([before, words, loaded()]))
"""
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    before, after_words, after_line = json.loads(done.stdout)
    light = [
        "execkit._redact.env",
        "execkit._redact.front",
        "execkit._redact.scan",
        "execkit._redact.text",
        "execkit._redact.words",
    ]
    assert before == after_words == light
    assert {"attrs", "execkit._redact.shapes", "execkit._redact.engine"} <= set(after_line)


def test_each_file_of_the_package_imports_only_those_above_it() -> None:
    # The order of the package docstring's list; imports inside a function (front.py's,
    # on first use) and for type checking only are left out.
    doc = _redact_package.__doc__ or ""
    order = re.findall(r"^- (\w+)\.py: ", doc, re.MULTILINE)
    root = Path(_redact_package.__file__).resolve().parent
    assert sorted(order) == sorted(p.stem for p in root.glob("*.py") if p.stem != "__init__")
    for rank, name in enumerate(order):
        tree = ast.parse((root / f"{name}.py").read_text(encoding="utf-8"))
        for node in tree.body:  # module level only: `if TYPE_CHECKING:` is an ast.If
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "execkit._redact."
            ):
                imported = (node.module or "").rpartition(".")[2]
                assert order.index(imported) < rank, f"{name}.py imports {imported}.py"


# ================================================================ linear time
#
# Nothing here is timed (benchmarks/bench_redact.py times the same texts). Linear time is
# held by counts: no compiled pattern can backtrack over its own repeats (each match
# attempt is linear), and on texts that repeat every rule's anchors the calls the engine
# makes grow at most in proportion to the text (no search started again from every match
# or position). tests/test_exec_tree.py bounds the whole post-exit work in decodes.


def _compiled_patterns() -> dict[str, re.Pattern[str]]:
    """Every pattern the package compiles, by where it comes from."""
    found: dict[str, re.Pattern[str]] = {}
    for step in ALL_PASSES:
        found[step.name] = step.pattern
        for index, alternative in enumerate(step.alternatives):
            found[f"{step.name}[{index}]"] = alternative
        if step.nearby is not None:
            for index, finder in enumerate(engine._word_finders(step.nearby.words)):
                found[f"{step.name} words[{index}]"] = finder
            found[f"{step.name} wording"] = engine._wording(step.nearby.words, step.nearby.adjacent)
            if step.nearby.adjacent:
                found[f"{step.name} adjacent"] = engine._adjacent_finder(step.nearby.words)
    for index, (finder, _) in enumerate(gate._name_finders()):
        found[f"name finder[{index}]"] = finder
    found["secret flag item"] = words.SECRET_FLAG_ITEM
    found["secret name"] = env._SECRET_NAME
    found["word character"] = tail._WORD_CHAR
    return found


def _is_unbounded(op: Any, arg: Any) -> bool:
    return op in (_OP.MAX_REPEAT, _OP.MIN_REPEAT) and arg[1] == _OP.MAXREPEAT


def _one_character(items: Any) -> tuple[Any, Any] | None:
    """The node of a repeat's body when it is one character (a literal or a class)."""
    if len(items) == 1 and items[0][0] in (_OP.LITERAL, _OP.NOT_LITERAL, _OP.ANY, _OP.IN):
        return items[0]  # type: ignore[no-any-return]
    return None


# What two runs side by side are checked to share: ASCII, the Latin supplements, and the
# look-alikes the fold deals with.
_PROBE = [chr(c) for c in range(0x300)] + ["\u0130", "\u0131", "\u017f", "\u212a", "\u2028"]


def _backtracking_risks(items: Any, inside: str = "") -> list[str]:
    """Why `re` could backtrack over the repeats of a parsed pattern without bound:

    - an unbounded greedy or lazy repeat inside another (`(a+)*`), unless a possessive
      repeat or an atomic group lies between (it is never backtracked into);
    - an unbounded greedy or lazy run of one character directly followed (look-arounds
      aside) by an unbounded run of one character that can match one of the same
      characters (`a+a*`, `\\w+\\d+`): the two can trade characters.
    """
    risks: list[str] = []
    consuming = [(op, arg) for op, arg in items if op not in (_OP.ASSERT, _OP.ASSERT_NOT, _OP.AT)]
    for (op, arg), (next_op, next_arg) in itertools.pairwise(consuming):
        if _is_unbounded(op, arg) and next_op in _REPEATS and next_arg[1] == _OP.MAXREPEAT:
            first, second = _one_character(arg[2]), _one_character(next_arg[2])
            if first is not None and second is not None:
                shared = [c for c in _PROBE if _accepts(*first, c) and _accepts(*second, c)]
                if shared:
                    risks.append(f"adjacent runs share {shared[:5]}")
    for op, arg in items:
        if op in (_OP.MAX_REPEAT, _OP.MIN_REPEAT):
            unbounded = arg[1] == _OP.MAXREPEAT
            if unbounded and inside:
                risks.append(f"an unbounded repeat inside {inside}")
            risks += _backtracking_risks(arg[2], inside or ("an unbounded repeat" * unbounded))
        elif op is _OP.POSSESSIVE_REPEAT:
            risks += _backtracking_risks(arg[2])
        elif op is _OP.ATOMIC_GROUP:
            risks += _backtracking_risks(arg)
        elif op is _OP.SUBPATTERN:
            risks += _backtracking_risks(arg[3], inside)
        elif op is _OP.BRANCH:
            for branch in arg[1]:
                risks += _backtracking_risks(branch, inside)
        elif op in (_OP.ASSERT, _OP.ASSERT_NOT):
            risks += _backtracking_risks(arg[1], inside)
    return risks


def test_no_pattern_can_backtrack_over_its_own_repeats() -> None:
    patterns = _compiled_patterns()
    assert len(patterns) >= 35
    risky = {
        name: risks
        for name, pattern in patterns.items()
        if (risks := _backtracking_risks(_parser.parse(pattern.pattern, pattern.flags)))
    }
    assert not risky, risky


def test_the_backtracking_check_finds_what_it_looks_for() -> None:
    def risks(source: str) -> list[str]:
        return _backtracking_risks(_parser.parse(source))

    assert risks(r"(?:a+)*b") and risks(r"(x[ab]+)+") and risks(r"\w+\d+") and risks(r"a*a*")
    assert risks(r"(?:(?:a|b)+c)*d") and risks(r"[a-z]+(?=x)[a-c]+")
    assert not risks(r"(?:a++)*b") and not risks(r"(?:a+)*+b") and not risks(r"(?>a+)*")
    assert not risks(r"[a-z]+=*") and not risks(r"a{0,8}a+") and not risks(r"(?:ab{1,3})+")


TraceFunction = Callable[[FrameType, str, Any], "TraceFunction | None"]


def _calls(run: Callable[[], object]) -> int:
    """How many functions `run` calls (Python and C; a resumed generator counts) and how
    many lines of Python it runs: the engine's own work, in steps."""
    count = 0

    def profile(_frame: FrameType, event: str, _arg: object) -> None:
        nonlocal count
        if event == "c_call":
            count += 1

    def trace_lines(_frame: FrameType, _event: str, _arg: object) -> TraceFunction:
        nonlocal count
        count += 1  # a call, a line or a return of Python code
        return trace_lines

    tracing, profiling = sys.gettrace(), sys.getprofile()  # a coverage tool's, say
    # No collection meanwhile: the finalizers of what earlier tests left would count.
    collecting = gc.isenabled()
    gc.disable()
    sys.setprofile(profile)
    sys.settrace(trace_lines)
    try:
        run()
    finally:
        sys.settrace(tracing)
        sys.setprofile(profiling)
        if collecting:
            gc.enable()
    return count


def _redactions(text: str) -> list[Callable[[], object]]:
    return [
        lambda: redact(text, extra_secrets=["abcdefgh"]),
        lambda: redact_tail(text[100:], text[:100], ["abcdefgh"]),
    ]


def _calls_per_size(head: str, unit: str, sizes: tuple[int, ...]) -> list[list[int]]:
    """Per redaction (`redact`, `redact_tail`), the calls it makes at each size. Each text
    is redacted once before its calls are counted: patterns compiled and caches filled,
    what every later text finds (a memory that the tests before this one filled, and that
    starts again on the counted run, would count as the text's work)."""
    by_size: list[list[int]] = []
    for size in sizes:
        runs = _redactions(adversarial(head, unit, size))
        for warm_up in runs:
            warm_up()
        by_size.append([_calls(run) for run in runs])
    return [list(calls) for calls in zip(*by_size, strict=True)]


# Past the eager gate's size; and, for the named rules, past the dense-names threshold.
_SIZES = (1 << 12, 1 << 13, 1 << 14)
_DENSE_SIZES = (1 << 18, 1 << 19, 1 << 20)
_NAMED_UNITS = {"token:", "token=", '\\"token\\": \\"', "x"}


@pytest.mark.parametrize(
    ("head", "unit", "sizes"),
    [pytest.param(head, unit, _SIZES, id=repr(head + unit)) for head, unit in ADVERSARIAL]
    + [
        pytest.param(head, unit, _DENSE_SIZES, id=f"dense {head + unit!r}")
        for head, unit in ADVERSARIAL
        if unit in _NAMED_UNITS
    ],
)
def test_the_engine_makes_calls_in_proportion_to_the_text(
    head: str, unit: str, sizes: tuple[int, ...]
) -> None:
    # Doubling the text at most doubles the calls (a few fixed ones aside): a pass that
    # searched again from every match, or tried every position, would more than double
    # them. Most of these texts cost the same calls whatever their size.
    for calls in _calls_per_size(head, unit, sizes):
        for smaller, larger in itertools.pairwise(calls):
            assert larger <= 2 * smaller + 64, calls


def test_a_short_text_is_redacted_once_per_process_and_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Server answers and listing lines repeat short strings (keys, states, ids): each is
    traced once, later calls take the remembered result, and a secret is still masked."""
    from execkit._redact import front

    traced: list[str] = []
    real = front.redact_text

    def counting(text: str, secrets: Any) -> str:
        traced.append(text)
        return real(text, secrets)

    monkeypatch.setattr(front, "redact_text", counting)
    front._redact_short.cache_clear()
    key = "sk-proj-" + "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"
    texts = ["schema_version", "ledger_id", f"token {key}", "x" * front._SHORT]
    for _ in range(50):
        out = [redact(t) for t in texts]
    assert traced == texts  # once each, whatever the number of calls
    assert key not in out[2] and out[0] == "schema_version"
    redact("y" * (front._SHORT + 1))
    redact("y" * (front._SHORT + 1))
    assert len(traced) == len(texts) + 2  # a long text is never remembered


def test_each_plain_text_is_its_own_redaction_so_mask_text_may_skip_the_redactor() -> None:
    """`_mask.PLAIN_TEXTS` are returned by `mask_text` without the redactor: each must be
    what the redactor makes of it (phases 2 and 3 themselves, under this engine, not the
    front's cache of short texts), and the dispatcher's title prefix is one of them (the
    ledger masks it at every dashboard read)."""
    from execkit._mask import PLAIN_TEXTS, mask_text
    from execkit._redact.trace import later_phases
    from execkit.dispatch._board import TASK_TITLE_PREFIX

    assert TASK_TITLE_PREFIX in PLAIN_TEXTS
    for text in PLAIN_TEXTS:
        assert later_phases(text, ()) == text
        assert front.redact_text(text, ()) == text
        assert mask_text(text) == text
