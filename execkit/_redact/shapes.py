"""The table of credential shapes: every shape `redact` masks, one entry each.

Adding a shape is one entry in `SHAPES` (record.py says what an entry holds; add a sample
to tests/secrets_corpus.py too). The engine compiles the table (engine.py), and what else
knows about shapes is derived from it: `BOUNDARY_STARTS` and `LINE_CROSSING_STARTS` for
the tail handling, and the list in the package docstring (record.shape_list, checked by
tests/test_redact.py, which also checks every entry against its own pattern and example).
Phase 2 holds the rules of the redactor before the coverage work, in its order; phase 3
the shapes added since, in any order (their masks are merged).

Formats were taken as facts (prefixes, lengths, alphabets; no code) from two well-kept
secret scanners: gitleaks `config/gitleaks.toml` (rules aws-access-token,
slack-webhook-url, jwt, private-key, stripe-access-token, npm-access-token,
huggingface-access-token, gitlab-pat, gitlab-pat-routable, gitlab-runner-authentication-
token, gitlab-deploy-token, gitlab-ptt, twilio-api-key, sendgrid-api-token,
curl-auth-user, generic-api-key) and Yelp detect-secrets `detect_secrets/plugins/`
(aws.py, aws_secret_access_key.py, basic_auth.py, azure_storage_key.py, jwt.py,
private_key.py, slack.py, stripe.py, twilio.py, sendgrid.py, npm.py). Lengths are kept
loose where the vendors' are not stable (Stripe, npm, Hugging Face: at least 10/30/30).
"""

from __future__ import annotations

import re

from execkit._redact.record import (
    Masked,
    Nearby,
    Phase,
    Search,
    Shape,
    exact,
    folded,
    opening_literal,
)
from execkit._redact.rules import provider_shapes
from execkit._redact.words import FLAG_NAMES, NAME_STARTS, NAMES

__all__ = [
    "BOUNDARY_STARTS",
    "LINE_CROSSING_STARTS",
    "NAME_WORDS",
    "PROVIDER_SHAPES",
    "SHAPES",
    "TABLE",
]

# --- what the entries share

NAME_WORDS = folded(*(word for word, _ in NAME_STARTS))
_ASSIGN = exact(":", "=")

# After a name, quotes escaped with a backslash (`{\"api_key\": \"v\"}`, `KEY=\"v\"`):
# either the name's closing quote is escaped, or the value's opening one is.
_ESCAPED_SEP = (
    r"(?:\\[\"'][ \t]{0,8}[:=][ \t]{0,8}(?:\\[\"'])?"
    r"|[\"']?[ \t]{0,8}[:=][ \t]{0,8}\\[\"'])"
)
_STRIPE_AFTER_R_OR_S = r"k_(?:live|test|prod)_(?<![A-Za-z0-9].{8})[A-Za-z0-9]{10,}+"
_PEM_LINE = r"[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----"
_PEM_BODY = r"[A-Za-z0-9+/=\\:,.\[\]]"
# The wording that makes a bare 40-character token an AWS secret key.
_AWS_WORDS = ("aws", "secret", "akia", "asia")

# Secret-named values, shape-free (phase 3). After the name: a quote (escaped or not),
# blanks, `:`, `=` or `=>`, blanks, a quote. A quoted value runs to its closing quote
# (spaces and all), an unquoted one to the first blank, quote, bracket or separator; a
# backslash always ends it, so a mask never eats half of an escape (`\"` stays whole).
_NAME_SEP = r"(?:\\{0,3}[\"'])?[ \t]{0,8}(?:=>|[:=])[ \t]{0,8}(?:\\{0,3}[\"'])?"
_BARE = r"[^\s\"'`,;&\\<>{}()\[\]|]"


def _word_start(word: str) -> str:
    """`word` where a name starts: not after a letter, a digit or `_`, unless that one ends
    an escape (`\\n`, `\\r`, `\\t`: a header line inside a JSON string). The look-behinds
    come after the literal, so the engine skips ahead to it."""
    return rf"{word}(?:(?<!\w{word})|(?<=\\[nrt]{word}))"


# An `Authorization` header's separator (its quotes escaped or not), and a scheme's word.
_AUTH_SEP = r"(?:\\{0,3}[\"'])?[ \t]{0,8}[:=][ \t]{0,8}(?:\\{0,3}[\"'])?"
_SCHEME = r"(?:[a-z][a-z0-9_.\-]{0,31}+[ \t]{1,8}+(?=[^\s\"'`,;\\]))"


# A command line's value after a flag: in single quotes (to the closing one, blanks and
# all), in double quotes (escaped or not: `-p\"v\"` inside a JSON string), or bare (to a
# blank, a quote, a backslash or a shell operator; never another flag, nor a port's
# number). Four characters at least, two inside quotes: a shorter one protects nothing
# worth the false masks.
_ARG = r"[^\s\"'`\\;|&<>(){}]"  # a character of a bare value
_FLAG_VALUE = (
    r"(?:'[^'\r\n]{2,128}+'|\\{0,3}\"[^\"\\\r\n]{2,128}+\\{0,3}\""
    rf"|(?![-'\"\\])(?![0-9]{{1,5}}+(?!{_ARG})){_ARG}{{4,128}}+)"
)
# A value whose opening quote, if any, ends the pattern's group 1 (read by a look-behind).
_QUOTED_VALUE = (
    r"(?:(?<=')[^'\r\n]{2,128}+|(?<=\")[^\"\\\r\n]{2,128}+"
    rf"|(?<![\"'])(?!-){_ARG}{{4,128}}+)"
)
# A command line's word that is no flag (a user's name, an option's value).
_WORD = r"(?![-\"'\\])[^\s\"'\\]{1,64}+"
# Where a command-line flag starts: at the start, after a blank, a quote or `=`.
_FLAG_START = r"-(?<![^\s\"'=]-)"


def _tool_password_flag(flag: str, words: tuple[str, ...], example: str) -> Shape:
    """A password given to `-flag` (glued, `-pS3cret`, or after a blank) on a line that
    names one of `words` (the tools whose `-flag` takes a password) before it."""
    return Shape(
        f"password_flag_{flag.lower()}{'_upper' if flag.isupper() else ''}",
        f"a password after `-{flag}` (glued or not) on a line naming "
        + ", ".join(f"`{word}`" for word in words),
        Phase.ADDED,
        rf"(?:(?<=[\s\"'=]-{flag})|(?<=[\s\"']-{flag}[ \t])){_FLAG_VALUE}",
        anchors=(folded(*words),),
        boundary=True,
        nearby=Nearby(words, window=120, longest=136, both_cases=False),
        example=example,
    )


def _value(least: int, *, digit: bool = False, base64: bool = False) -> str:
    """A secret-named value of at least `least` characters; with `digit` (a weak name:
    `*_key`, `sig`), one that holds a digit or `+/=`; with `base64` too (`auth`), or one of
    at least 12 base64 characters (not the name of an environment variable, say)."""
    guard = ""
    if digit:
        wide = r"|[a-z0-9+/=]{12}" if base64 else ""
        guard = rf"(?=[^\s\"'\\]{{0,255}}[0-9+/=]{wide})"
    return (
        rf"{guard}(?:(?<=\")[^\"\\\r\n]{{{least},256}}+|(?<=')[^'\\\r\n]{{{least},256}}+"
        rf"|(?<![\"'])(?![\[{{(<]){_BARE}{{{least},}}+)"
    )


def _named(word: str, name: str, after: str, value: str, example: str) -> Shape:
    """One secret word's rule: `word` (the literal its pattern opens with) and `after` (what
    may follow it and must come before it), then the separator and the value. (One pass a
    word, not an alternation: each masks after its own group 1.)"""
    return Shape(
        name,
        f'values named `...{word}` in any syntax (`KEY=`, `"key":`, `key: `, `=>`)',
        Phase.ADDED,
        f"({word}{after}{_NAME_SEP}){value}",
        anchors=(folded(word),),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        search=Search.LEAD,
        boundary=True,
        example=example,
    )


# A credential word before a long random token on its line (phase 3, `nearby`).
_CREDENTIAL_WORDS = (
    *("key", "token", "secret", "passw", "auth", "credential", "sig", "pwd"),
    # Names written as one word, where the credential word does not start the name.
    *("apikey", "apitoken", "accesstoken", "accesskey", "clientsecret", "sessiontoken"),
    "refreshtoken",
)
_URL_SECRET_PARAMS = (
    "sig|signature|token|access_token|refresh_token|id_token|key|apikey|api_key|secret"
    "|client_secret|password|passwd|pwd|pass|auth|x-amz-signature|x-amz-security-token"
    "|x-amz-credential|x-goog-signature|x-goog-credential"
)
# `password` at the start of a line: of the text, after a newline or a JSON-escaped one,
# indented by nothing, a tab, or 1, 2 or 4 spaces (each a fixed-width look-behind).
_LINE_START_PASSWORD = (
    "(?:(?<![^\\n]password)"
    + "".join(
        f"|(?<={start}{indent}password)"
        for start in ("\\n", "\\\\n")
        for indent in ("", "\\t", " ", "  ", "    ", "\\\\t")
        if not (start == "\\n" and indent == "")
    )
    + ")"
)


def _url_param(separator: str, name: str, example: str) -> Shape:
    """A secret query parameter after `separator` (`?`, `&`, or their URL encodings): its
    value, to the next parameter, fragment, blank or quote."""
    return Shape(
        name,
        f"secret query parameters of a URL after `{separator}` (`sig=`, `token=`, ...)",
        Phase.ADDED,
        rf"({re.escape(separator)}(?:{_URL_SECRET_PARAMS})(?:=|%3d))"
        r"(?:[^&#%;\s\"'<>\\]|%(?!26|23)[0-9a-f]{2})++",
        anchors=(folded(separator), folded("=", "%3d")),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        search=Search.LEAD,
        example=example,
    )


# A newline in a PuTTY key: as written, or JSON-escaped once or twice.
_PPK_NEWLINE = r"(?:\r?\n|(?:\\{1,3}r)?\\{1,3}n)"
_LINE_END = r"(?=[ \t]*+(?:\r?\n|\\[rn]|$))"

# --- the table: phase 2 in the reference's order, then phase 3 (order free: its masks
# are merged)

SHAPES: tuple[Shape, ...] = (
    # Phase 2: the rules of the redactor before the coverage work (tests/_redact_reference.py
    # holds its code), rewritten so the engine can skip ahead: the literal first, the look-
    # behind that used to precede it after it, and the case-insensitive ones folded.
    Shape(
        "openai_key",
        "OpenAI and Anthropic keys (`sk-`, `sk-proj-`, `sk-ant-`)",
        Phase.REFERENCE,
        r"sk-(?<![A-Za-z0-9]sk-)[A-Za-z0-9_\-]{16,}",  # not `task-...` or `disk-...`
        anchors=(exact("sk-"),),
        boundary=True,
        alternation="vendor_key",
        example="key «sk-proj-{urlsafe:24}» used",
    ),
    Shape(
        "google_api_key",
        "Google API keys (`AIza`)",
        Phase.REFERENCE,
        r"AIza(?<![A-Za-z0-9]AIza)[A-Za-z0-9_\-]{30,}",
        anchors=(exact("AIza"),),
        boundary=True,
        alternation="vendor_key",
        example="GET /geocode?addr=x&key=«AIza{urlsafe:35}»",
    ),
    Shape(
        "github_token",
        "GitHub tokens (`ghp_`, `gho_`, `ghu_`, `ghs_`, `ghr_`)",
        Phase.REFERENCE,
        r"gh[pousr]_(?<![A-Za-z0-9]gh[pousr]_)[A-Za-z0-9]{20,}",
        anchors=(exact("ghp_", "gho_", "ghu_", "ghs_", "ghr_"),),
        boundary=True,
        alternation="vendor_key",
        example="remote: using token «ghp_{alnum:36}»",
    ),
    Shape(
        "github_fine_grained_pat",
        "GitHub fine-grained tokens (`github_pat_`)",
        Phase.REFERENCE,
        r"github_pat_(?<![A-Za-z0-9]github_pat_)[A-Za-z0-9_]{20,}",
        anchors=(exact("github_pat_"),),
        boundary=True,
        alternation="vendor_key",
        example="GH auth «github_pat_{alnum:82}» accepted",
    ),
    Shape(
        "slack_token",
        "Slack tokens (`xoxa-`, `xoxb-`, `xoxp-`, `xoxr-`, `xoxs-`)",
        Phase.REFERENCE,
        r"xox[abprs]-(?<![A-Za-z0-9]xox[abprs]-)[A-Za-z0-9\-]{10,}",
        anchors=(exact("xox"),),
        boundary=True,
        alternation="vendor_key",
        example="slack client init «xoxb-{digits:12}-{digits:13}-{alnum:24}»",
    ),
    Shape(
        "authorization",
        "`Authorization:` and `authorization=` values, after `Bearer`/`Basic`/`token`/`Bot`",
        Phase.REFERENCE,
        r"(authorization(?<!\wauthorization)[\"']?[ \t]{0,8}[:=][ \t]{0,8}[\"']?"
        r"(?:(?:bearer|basic|token|bot)[ \t]{1,8})?)"
        r"[^\s\"',;]+",
        anchors=(folded("authorization"),),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        boundary=True,
        placeholders=True,
        example="curl -H 'Authorization: Basic «{b64:24}»' https://x",
    ),
    Shape(
        "bearer",
        "a bare `Bearer <token>` (curl traces, logged headers)",
        Phase.REFERENCE,
        r"(bearer(?<!\wbearer)[ \t]{1,8})[A-Za-z0-9\-._~+/]{8,}=*",
        anchors=(folded("bearer"),),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        boundary=True,
        placeholders=True,
        example="retrying request with bearer «{alnum:32}» after 401",
    ),
    Shape(
        "key_value",
        '`NAME=value`, `NAME: value`, `"name": "value"` for a secret-sounding NAME',
        Phase.REFERENCE,
        rf"({NAMES}[\"']?[ \t]{{0,8}}[:=][ \t]{{0,8}}[\"']?)[^\s\"',;&]+",
        anchors=(NAME_WORDS, _ASSIGN),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        search=Search.NAMED,
        example='{"client_secret": "«{alnum:30}»", "model": "x"}',
    ),
    Shape(
        "secret_flag",
        "`--api-key VALUE`, `--token=VALUE` on a logged command line",
        Phase.REFERENCE,
        rf"({FLAG_NAMES}(?:[ \t]{{1,8}}|=))[^\s\"',;&]+",
        anchors=(exact("-"), folded("key", "token", "secret", "passw")),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        example="codex --api-key «{alnum:26}» exec 'fix it'",
    ),
    # Phase 3: the shapes added since.
    Shape(
        "private_key",
        "PEM and OpenSSH private key blocks: the body and the END line",
        Phase.ADDED,
        # The body (base64 lines, `Proc-Type:`/`DEK-Info:` headers, `\n` when JSON-escaped,
        # markers an earlier rule left) and the END line are masked. A block without its
        # END line is masked up to the next `-----` or the end of the text. Whitespace
        # counts only when more of the body follows it (so masking is idempotent).
        rf"(-----BEGIN{_PEM_LINE})"
        rf"(?:{_PEM_BODY}++|-(?!----)|\s++(?={_PEM_BODY}|-))*+"
        rf"(?:-----END{_PEM_LINE})?",
        anchors=(exact("-----BEGIN"), exact("PRIVATE KEY")),
        masked=Masked.AFTER_GROUP_1,
        search=Search.LEAD,
        crosses_lines=True,  # the one shape that does
        example=(
            "key file:\n-----BEGIN RSA PRIVATE KEY-----«\n{b64:64}\n{b64:64}\n{b64:22}==\n"
            "-----END RSA PRIVATE KEY-----»\n(end)"
        ),
    ),
    Shape(
        "escaped_authorization",
        "`Authorization` headers whose quotes are backslash-escaped (JSON in a JSON string)",
        Phase.ADDED,
        rf"(authorization(?<!\wauthorization){_ESCAPED_SEP}"
        r"(?:(?:bearer|basic|token|bot)[ \t]{1,8})?)"
        r"[^\s\"',;\\]+",
        anchors=(exact("\\"), folded("authorization"), _ASSIGN),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        boundary=True,
        placeholders=True,
        example='{"headers": "{\\"Authorization\\": \\"Bearer «{alnum:32}»\\"}"}',
    ),
    Shape(
        "escaped_key_value",
        "secret-named values whose quotes are backslash-escaped (JSON in a JSON string)",
        Phase.ADDED,
        rf"({NAMES}{_ESCAPED_SEP})[^\s\"',;&\\]+",
        anchors=(exact("\\"), NAME_WORDS, _ASSIGN),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        search=Search.NAMED,
        example='{"content": "{\\"api_key\\": \\"«{alnum:24}»\\"}"}',
    ),
    Shape(
        "url_password",
        "the password of `scheme://user:password@host` (URLs, database connection strings)",
        Phase.ADDED,
        # The user part may be empty: redis://:p@h.
        r"://([^\s:/@?#\[\]\"'<>]{0,128}+):([^\s/?#\"'<>]{1,256})@",
        anchors=(exact("@"), exact("://")),
        masked=Masked.GROUP_2,
        search=Search.LEAD,
        example="DATABASE_URL=postgres://app:«{alnum:22}»@db.internal:5432/app",
    ),
    Shape(
        "slack_webhook",
        "Slack webhook URLs (`hooks.slack.com/services/...`)",
        Phase.ADDED,
        r"(hooks\.slack\.com/(?:services|workflows|triggers)/)[a-z0-9_+/\-]{8,}+",
        anchors=(folded("hooks.slack.com"),),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        search=Search.LEAD,
        example="POST https://hooks.slack.com/services/«T{upper:8}/B{upper:8}/{alnum:24}» ok",
    ),
    Shape(
        "jwt",
        "JSON Web Tokens (`eyJ...` `.eyJ...` `.signature`)",
        Phase.ADDED,
        r"eyJ(?<![A-Za-z0-9_\-]eyJ)[A-Za-z0-9_\-]{10,}+={0,2}+"
        r"\.eyJ[A-Za-z0-9_\-]{10,}+={0,2}+\.[A-Za-z0-9_\-]*+={0,2}+",
        anchors=(exact("."), exact("eyJ")),
        search=Search.LEAD,
        boundary=True,
        example="id token «eyJ{urlsafe:20}.eyJ{urlsafe:40}.{urlsafe:43}» issued",
    ),
    Shape(
        "aws_secret_key",
        "AWS secret keys: 40 base64 characters on a line that says aws or secret before them",
        Phase.ADDED,
        # Both cases of letters (`nearby`): a hex digest never qualifies.
        r"(?<![A-Za-z0-9/+=])[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=])",
        anchors=(folded(*_AWS_WORDS),),  # the wording, in the fold; the token in the text
        boundary=True,
        nearby=Nearby(_AWS_WORDS, window=80, longest=40),
        example="AWS Secret Access Key [None]: «{b64:40}»",
    ),
    Shape(
        "aws_access_key_id",
        "AWS access key IDs (`AKIA`, `ASIA`, `ABIA`, `ACCA`, `A3T`)",
        Phase.ADDED,
        r"(?:A3T[A-Z0-9]|AKIA|ASIA|ABIA|ACCA)(?<![A-Za-z0-9]....)[A-Z0-9]{16}(?![A-Za-z0-9])",
        anchors=(exact("AKIA", "ASIA", "ABIA", "ACCA", "A3T"),),
        search=Search.LEAD,  # every shape opens with "A": one search for it, then a few tries
        boundary=True,
        example="export AWS_ACCESS_KEY_ID=«AKIA{upper:16}»",
    ),
    Shape(
        "azure_key",
        "Azure `AccountKey=`, `SharedAccessKey=`, `SharedAccessSignature=` values",
        Phase.ADDED,
        rf"((?:{_word_start('accountkey')}|{_word_start('sharedaccesskey')}"
        rf"|{_word_start('sharedaccesssignature')})[ \t]{{0,8}}=[ \t]{{0,8}})"
        r"[^\s;\"'<>]+",
        anchors=(exact("="), folded("accountkey", "sharedaccess")),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        boundary=True,
        example="AccountName=acct;AccountKey=«{b64:86}==»;EndpointSuffix=core.windows.net",
    ),
    Shape(
        "stripe_restricted_key",
        "Stripe restricted keys (`rk_live_`, `rk_test_`, `rk_prod_`)",
        Phase.ADDED,
        f"r{_STRIPE_AFTER_R_OR_S}",
        anchors=(exact("k_live_", "k_test_", "k_prod_"),),
        boundary=True,
        alternation="stripe",
        example="stripe client «rk_live_{alnum:24}» ok",
    ),
    Shape(
        "stripe_secret_key",
        "Stripe secret keys (`sk_live_`, `sk_test_`, `sk_prod_`)",
        Phase.ADDED,
        f"s{_STRIPE_AFTER_R_OR_S}",
        anchors=(exact("k_live_", "k_test_", "k_prod_"),),
        boundary=True,
        alternation="stripe",
        example="charge failed for «sk_live_{alnum:24}» (401)",
    ),
    Shape(
        "npm_token",
        "npm tokens (`npm_`)",
        Phase.ADDED,
        r"npm_(?<![A-Za-z0-9_]npm_)[A-Za-z0-9]{30,}+",
        anchors=(exact("npm_"),),
        search=Search.LEAD,
        boundary=True,
        example="npm publish using «npm_{alnum:36}»",
    ),
    Shape(
        "huggingface_token",
        "Hugging Face tokens (`hf_`)",
        Phase.ADDED,
        r"hf_(?<![A-Za-z0-9_]hf_)[A-Za-z0-9]{30,}+",
        anchors=(exact("hf_"),),
        search=Search.LEAD,
        boundary=True,
        example="huggingface-cli login --add «hf_{letters:34}»",
    ),
    Shape(
        "gitlab_token",
        "GitLab tokens (`glpat-`, `glrt-`, `gldt-`, `glptt-`)",
        Phase.ADDED,
        r"(?:glpat-(?<![A-Za-z0-9]glpat-)|glptt-(?<![A-Za-z0-9]glptt-)"
        r"|gl[dr]t-(?<![A-Za-z0-9]gl[dr]t-))[A-Za-z0-9_\-]{20,}+(?:\.[A-Za-z0-9]{2,}+)?+",
        anchors=(exact("glpat-", "glptt-", "gldt-", "glrt-"),),
        search=Search.LEAD,  # `re` searches for the shapes' common "gl" once
        boundary=True,
        example="git push with «glpat-{urlsafe:20}» to gitlab",
    ),
    Shape(
        "twilio_api_key",
        "Twilio API keys (`SK` and 32 hex digits)",
        Phase.ADDED,
        r"SK(?<![A-Za-z0-9]SK)[0-9a-fA-F]{32}(?![A-Za-z0-9])",
        anchors=(exact("SK"),),
        search=Search.LEAD,
        boundary=True,
        example="twilio api key «SK{hex:32}» created",
    ),
    Shape(
        "sendgrid_key",
        "SendGrid keys (`SG.x.y`)",
        Phase.ADDED,
        r"SG\.(?<![A-Za-z0-9]SG\.)[A-Za-z0-9_\-]{16,}+\.[A-Za-z0-9_\-]{16,}+",
        anchors=(exact("SG."),),
        search=Search.LEAD,
        boundary=True,
        example="sendgrid «SG.{urlsafe:22}.{urlsafe:43}» rejected",
    ),
    Shape(
        "cookie",
        "`Cookie:` and `Set-Cookie:` values, to the end of the line",
        Phase.ADDED,
        rf"((?:{_word_start('set-cookie')}|{_word_start('cookie')})(?:\\?[\"'])?"
        r"[ \t]{0,8}[:=][ \t]{0,8}(?:\\?[\"'])?)[^\r\n\"\\]+",
        anchors=(folded("cookie"), _ASSIGN),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        boundary=True,
        example="> Cookie: «session={hex:32}; theme=dark»\n< HTTP/1.1 200",
    ),
    Shape(
        "authorization_header",
        "`Authorization:` values after a scheme phase 2 does not know (`SSWS`, `ApiKey`), and "
        "after any at a line's start inside a JSON string (`\\nAuthorization: Basic ...`)",
        Phase.ADDED,
        rf"(authorization(?:(?<=\\[nrt]authorization){_AUTH_SEP}{_SCHEME}?"
        rf"|(?<!\wauthorization){_AUTH_SEP}(?!(?:bearer|basic|token|bot)[ \t]){_SCHEME}))"
        r"[^\s\"'`,;\\]++",
        anchors=(folded("authorization"), _ASSIGN),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        search=Search.LEAD,
        boundary=True,
        placeholders=True,
        example='{"request": "GET / HTTP/1.1\\nAuthorization: SSWS «{urlsafe:42}»\\n"}',
    ),
    Shape(
        "escaped_line_bearer",
        "a `Bearer <token>` at a line's start inside a JSON string (`\\nBearer ...`)",
        Phase.ADDED,
        r"(bearer(?<=\\[nrt]bearer)[ \t]{1,8}+)[a-z0-9\-._~+/]{8,}+=*+",
        anchors=(folded("bearer"),),
        masked=Masked.AFTER_GROUP_1,
        folded=True,
        search=Search.LEAD,
        boundary=True,
        placeholders=True,
        example='{"log": "retrying\\nBearer «{alnum:32}»\\n"}',
    ),
    # Shape-free rules: what no provider list names.
    _named(
        "pass",
        "secret_name_pass",
        r"(?:(?<![a-z]pass)|(?<=\\[nrt]pass))(?:word|wd|phrase)?",
        _value(6),
        "export DB_PASS=«{alnum:14}»",
    ),
    _named(
        "pwd",
        "secret_name_pwd",
        r"(?:(?<=[_.;\"' \t-]pwd)|(?<=\\[nrt]pwd))(?!=/)",
        _value(6),
        "Server=db;User Id=app;Pwd=«{alnum:14}»;",
    ),
    _named(
        "auth",
        "secret_name_auth",
        r"(?:(?<![a-z]auth)|(?<=\\[nrt]auth))",
        _value(8, digit=True, base64=True),
        '{"auths": {"registry.example.com": {"auth": "«{b64:24}»"}}}',
    ),
    _named(
        "key",
        "secret_name_key",
        r"(?<=[a-z0-9][_.-]key)(?:[_-]data)?",
        _value(8, digit=True),
        "    client-key-data: «{b64:64}»",
    ),
    _named(
        "sig",
        "secret_name_sig",
        r"(?:(?<![a-z]sig)|(?<=\\[nrt]sig))(?:nature)?",
        _value(8, digit=True),
        "webhook signature=«{hex:64}»",
    ),
    _named(
        "dsn",
        "secret_name_dsn",
        r"(?:(?<![a-z]dsn)|(?<=\\[nrt]dsn))",
        _value(8),
        "SENTRY_DSN=«https://{hex:32}@o1.ingest.sentry.io/42»",
    ),
    # One pass per separator, each opening with it: `re` then skips ahead to each.
    *(
        _url_param(separator, name, example)
        for separator, name, example in (
            ("?", "url_secret_param", "GET /files?sig=«{urlsafe:43}» HTTP/1.1"),
            (
                "&",
                "url_secret_param_amp",
                "https://acct.blob.core.windows.net/c/b?sv=2022-11-02&sp=r&sig=«{b64:43}%3D»",
            ),
            ("%3f", "url_secret_param_encoded", "next=%2Fcb%3Ftoken%3D«{urlsafe:32}»"),
            ("%26", "url_secret_param_encoded_amp", "next=%2Fcb%3Fa%3D1%26key%3D«{urlsafe:32}»"),
        )
    ),
    Shape(
        "netrc_line",
        "`.netrc` lines: `machine HOST login USER password VALUE`",
        Phase.ADDED,
        r"(machine[ \t]++[^\s]++(?:[ \t]++(?:login|account|port)[ \t]++[^\s]++){0,4}+"
        r"[ \t]++password[ \t]++)[^\s\"'\\]++",
        anchors=(exact("machine"), exact("password")),
        masked=Masked.AFTER_GROUP_1,
        search=Search.LEAD,
        example="machine api.example.com login bob password «{alnum:16}»",
    ),
    Shape(
        "netrc_password_line",
        "a `.netrc` line of its own: `password VALUE` (indented or not, JSON-escaped or not)",
        Phase.ADDED,
        rf"(password{_LINE_START_PASSWORD}[ \t]++)[^\s\"'\\]++{_LINE_END}",
        anchors=(exact("password"),),
        masked=Masked.AFTER_GROUP_1,
        search=Search.LEAD,
        boundary=True,
        example="machine example.com\n  login bob\n  password «{alnum:16}»\n",
    ),
    Shape(
        "pgpass_line",
        "`.pgpass` lines: `host:port:database:user:password`",
        Phase.ADDED,
        r":(?<=[A-Za-z0-9.\-_\]*]:)(?:[0-9]{1,5}|\*)"
        r"(?::(?:\*|[^\s:A-Za-z\"'\\]*+[A-Za-z][^\s:\"'\\]*+)){2}"
        r":([^\s:\"'\\]{4,}+)(?=\s|\\|[\"']|$)",
        anchors=(exact(":"),),
        masked=Masked.GROUP_1,
        search=Search.LEAD,
        boundary=True,
        example="db.internal:5432:app:app_user:«{alnum:20}»",
    ),
    Shape(
        "putty_private_key",
        "PuTTY private keys: the `Private-Lines` body and its `Private-MAC`",
        Phase.ADDED,
        rf"(Private-Lines:[ \t]*+[0-9]++)(?:{_PPK_NEWLINE}[A-Za-z0-9+/=]++(?![-:]))++"
        rf"(?:{_PPK_NEWLINE}Private-(?:MAC|Hash):[ \t]*+[0-9a-fA-F]++)?+",
        anchors=(exact("Private-Lines:"),),
        masked=Masked.AFTER_GROUP_1,
        search=Search.LEAD,
        crosses_lines=True,
        example=(
            "Public-Lines: 2\nAAAA\nBBBB\nPrivate-Lines: 2«\n{b64:64}\n{b64:20}==\n"
            "Private-MAC: {hex:64}»\n"
        ),
    ),
    Shape(
        "credential_word_token",
        "a random token (a digit, distinct characters; both cases, or hex/base32 in one) "
        "right after a credential word",
        Phase.ADDED,
        r"(?:(?<![A-Za-z0-9+/_\-])|(?<=\\[nrt]))(?!/)[A-Za-z0-9+/_\-]{16,200}+={0,2}+"
        r"(?![A-Za-z0-9+/_=\-])",
        anchors=(folded(*_CREDENTIAL_WORDS),),
        boundary=True,
        nearby=Nearby(
            _CREDENTIAL_WORDS,
            window=48,
            longest=202,
            digit=True,
            distinct=True,
            adjacent=True,
            one_case=True,
        ),
        example="auth token «{hex:40}» (rotate it)",
    ),
    # Passwords and user:password pairs on a command line (a logged command, an argv).
    Shape(
        "password_flag_after_user",
        "a password after `-p` (glued or not) following `-u USER` or `--user USER`",
        Phase.ADDED,
        rf"({_FLAG_START}(?:u[ \t]{{0,8}}+|-user(?:=|[ \t]{{1,8}}+)){_WORD}"
        # Options between the two (not `-p...`; `-P 3306` is one), each maybe with a value.
        r"(?:[ \t]{1,8}+-{1,2}[A-Za-oq-z][^\s\"'\\]{0,64}+"
        rf"(?:[ \t]{{1,8}}+{_WORD})?+){{0,4}}+"
        # `-p VALUE` (a blank between) unless VALUE is a port or a list of numbers.
        r"[ \t]{1,8}+-p(?:[ \t]{1,8}+(?![0-9\[][0-9.:,\[\]]{0,48}+"
        r"(?:/[a-z]{3,4}+)?+(?![^\s\"'\\])))?+)" + _FLAG_VALUE,
        anchors=(exact("-u"), exact("-p")),
        masked=Masked.AFTER_GROUP_1,
        search=Search.LEAD,
        boundary=True,
        example="dbtool -uops -p«{alnum:14}» --migrate",
    ),
    _tool_password_flag(
        "p",
        ("mysql", "mariadb", "sshpass", "login", "mongo", "twine"),
        "sshpass -p«{alnum:14}» ssh deploy@host",
    ),
    _tool_password_flag("P", ("sqlcmd", "bcp", "osql", "zip"), "sqlcmd -U sa -P«{alnum:14}»"),
    Shape(
        # Not a `nearby` word: `7z` is in random text every few KiB, where a pattern that
        # opens with it fails in C but a word's search costs Python calls.
        "seven_zip_password",
        "7-Zip's password, glued to its `-p` (`7z x a.7z -pS3cret`)",
        Phase.ADDED,
        r"(7z(?<![A-Za-z0-9]7z)[ar]?(?:[ \t]++(?!-p)[^\s;|&]{1,256}+){0,16}+[ \t]++-p)"
        + _FLAG_VALUE,
        anchors=(exact("7z"), exact("-p")),
        masked=Masked.AFTER_GROUP_1,
        search=Search.LEAD,
        boundary=True,
        example="7z x backup.7z -p«{alnum:14}» -o/tmp/restore",
    ),
    _tool_password_flag("a", ("redis",), "redis-cli -h cache -a «{alnum:14}» ping"),
    _tool_password_flag("w", ("ldap",), "ldapsearch -D cn=admin -w «{alnum:14}» -b dc=x"),
    Shape(
        "pass_flag",
        "`--pass`, `--passphrase`, `--pw`, `-storepass`, `-keypass`... and their value",
        Phase.ADDED,
        rf"({_FLAG_START}-?(?:(?:src|dest)?(?:store|key)?pass(?:phrase|in|out)?|pwd?)"
        r"(?:=|[ \t]{1,8}+)(?:\\{0,3}[\"'])?)"
        # Not a count (`ffmpeg -pass 2`).
        rf"(?![0-9]{{1,2}}+(?!{_ARG})){_QUOTED_VALUE}",
        anchors=(exact("-pass", "-pw", "storepass", "keypass"),),
        masked=Masked.AFTER_GROUP_1,
        search=Search.LEAD,
        boundary=True,
        example="keytool -list -keystore app.jks -storepass «{alnum:14}»",
    ),
    Shape(
        "user_password_flag",
        "`user:password` after `-u`, `-U`, `-a`, `-A`, `--user`, `--proxy-user`, `--auth` "
        "(curl, httpie; `user%password` for smbclient)",
        Phase.ADDED,
        # `-u` may be glued to its value (`-ualice:pw`); `-U`, `-a`, `-A` take a blank.
        rf"({_FLAG_START}(?:u[ \t]{{0,8}}+|[UaA][ \t]{{1,8}}+|-(?:user|proxy-user|auth)"
        r"(?:=|[ \t]{1,8}+))"
        r"(?:\\{0,3}[\"'])?)"
        r"(?:(?<=')(?=[^':\s\\]{0,64}+[:%][^'\s])[^'\r\n]{4,300}+"
        r"|(?<=\")(?=[^\":\s\\]{0,64}+[:%][^\"\s\\])[^\"\\\r\n]{4,300}+"
        # Not a user and group by number (`docker run -u 1000:1000`), nor a URL.
        rf"|(?<![\"'])(?![0-9]{{1,10}}+:[0-9]{{1,10}}+(?!{_ARG}))"
        r"(?=[^\s:%\"'\\/@]{0,64}+[:%](?!//)[^\s\"'\\])[^\s\"'`\\]{4,300}+)",
        anchors=(exact("-u", "-U", "-a", "-A"), exact(":", "%")),
        masked=Masked.AFTER_GROUP_1,
        search=Search.LEAD,
        boundary=True,
        example="curl -u «alice:{alnum:14}» https://api.example.com",
    ),
)

# The provider rules (rules.toml), after the table: each a phase 3 shape.
PROVIDER_SHAPES: tuple[Shape, ...] = provider_shapes()
TABLE = SHAPES
SHAPES = TABLE + PROVIDER_SHAPES


# What a cut can make match at the very start of a tail that did not match after the text
# before the cut: the phase 2 rules that look at the character before them, by the literal
# they open with, in the fold. (Phase 3 masks across a cut are handled by masking the
# tail's head, whatever starts them.)
BOUNDARY_STARTS: tuple[str, ...] = tuple(
    opening_literal(shape.pattern).lower()
    for shape in SHAPES
    if shape.phase is Phase.REFERENCE and shape.boundary
)

# The literals that open a match that may run over a newline (as written).
LINE_CROSSING_STARTS: tuple[str, ...] = tuple(
    opening_literal(shape.pattern) for shape in SHAPES if shape.crosses_lines
)
