r"""Mask credentials before text is stored or printed.

`redact(text)` replaces every credential it recognises with `[REDACTED]`; `redact_tail`
does the same for the kept tail of a longer output, looking at the text just before the
cut; `redact_argv` does it per argument, a flag and its value with the command line
before them in view. A false positive loses a little debugging text, a false negative
leaks a credential, so redaction errs towards masking.

What is recognised, in three phases over the text:

1. The literal `extra_secrets` (values of the child's secret-named environment variables,
   `secret_env_values`), longest first.
2. The reference rules, run one after another over the output of the one before, with
   the output of the code before the coverage work (tests/_redact_reference.py holds it,
   and tests/test_redact.py checks the two agree): vendor key shapes, `Authorization:`
   headers, `Bearer` tokens, values after secret-sounding names and flags. One change:
   a header's placeholder (`Bearer TOKEN`) is kept, where the reference masked it.
3. The shapes added since, each matched against the text as phase 1 left it (so no
   earlier masking can hide one) and masked on top of phase 2's output, and the
   JSON-escaped form of each literal secret. So the output is always the reference output
   with more spans masked, and exactly the reference output wherever phase 3 finds nothing
   (a header's placeholder aside).

The shapes of phases 2 and 3 written here, in the order of their table, `shapes.TABLE`
(written by `record.shape_list`; tests/test_redact.py checks this list is the table's).
After them, phase 3 holds one shape per provider key format of `rules.toml` (454 records,
364 providers; rules.py reads and checks them, docs/formats.md describes a record):

- `openai_key` (phase 2, masks the match): OpenAI and Anthropic keys (`sk-`, `sk-proj-`,
  `sk-ant-`)
- `google_api_key` (phase 2, masks the match): Google API keys (`AIza`)
- `github_token` (phase 2, masks the match): GitHub tokens (`ghp_`, `gho_`, `ghu_`, `ghs_`,
  `ghr_`)
- `github_fine_grained_pat` (phase 2, masks the match): GitHub fine-grained tokens
  (`github_pat_`)
- `slack_token` (phase 2, masks the match): Slack tokens (`xoxa-`, `xoxb-`, `xoxp-`,
  `xoxr-`, `xoxs-`)
- `authorization` (phase 2, masks after group 1): `Authorization:` and `authorization=`
  values, after `Bearer`/`Basic`/`token`/`Bot`
- `bearer` (phase 2, masks after group 1): a bare `Bearer <token>` (curl traces, logged
  headers)
- `key_value` (phase 2, masks after group 1): `NAME=value`, `NAME: value`, `"name": "value"`
  for a secret-sounding NAME
- `secret_flag` (phase 2, masks after group 1): `--api-key VALUE`, `--token=VALUE` on a
  logged command line
- `private_key` (phase 3, masks after group 1): PEM and OpenSSH private key blocks: the body
  and the END line
- `escaped_authorization` (phase 3, masks after group 1): `Authorization` headers whose
  quotes are backslash-escaped (JSON in a JSON string)
- `escaped_key_value` (phase 3, masks after group 1): secret-named values whose quotes are
  backslash-escaped (JSON in a JSON string)
- `url_password` (phase 3, masks group 2): the password of `scheme://user:password@host`
  (URLs, database connection strings)
- `slack_webhook` (phase 3, masks after group 1): Slack webhook URLs
  (`hooks.slack.com/services/...`)
- `jwt` (phase 3, masks the match): JSON Web Tokens (`eyJ...` `.eyJ...` `.signature`)
- `aws_secret_key` (phase 3, masks the match): AWS secret keys: 40 base64 characters on a
  line that says aws or secret before them
- `aws_access_key_id` (phase 3, masks the match): AWS access key IDs (`AKIA`, `ASIA`,
  `ABIA`, `ACCA`, `A3T`)
- `azure_key` (phase 3, masks after group 1): Azure `AccountKey=`, `SharedAccessKey=`,
  `SharedAccessSignature=` values
- `stripe_restricted_key` (phase 3, masks the match): Stripe restricted keys (`rk_live_`,
  `rk_test_`, `rk_prod_`)
- `stripe_secret_key` (phase 3, masks the match): Stripe secret keys (`sk_live_`,
  `sk_test_`, `sk_prod_`)
- `npm_token` (phase 3, masks the match): npm tokens (`npm_`)
- `huggingface_token` (phase 3, masks the match): Hugging Face tokens (`hf_`)
- `gitlab_token` (phase 3, masks the match): GitLab tokens (`glpat-`, `glrt-`, `gldt-`,
  `glptt-`)
- `twilio_api_key` (phase 3, masks the match): Twilio API keys (`SK` and 32 hex digits)
- `sendgrid_key` (phase 3, masks the match): SendGrid keys (`SG.x.y`)
- `cookie` (phase 3, masks after group 1): `Cookie:` and `Set-Cookie:` values, to the end of
  the line
- `authorization_header` (phase 3, masks after group 1): `Authorization:` values after a
  scheme phase 2 does not know (`SSWS`, `ApiKey`), and after any at a line's start inside a
  JSON string (`\nAuthorization: Basic ...`)
- `escaped_line_bearer` (phase 3, masks after group 1): a `Bearer <token>` at a line's start
  inside a JSON string (`\nBearer ...`)
- `secret_name_pass` (phase 3, masks after group 1): values named `...pass` in any syntax
  (`KEY=`, `"key":`, `key: `, `=>`)
- `secret_name_pwd` (phase 3, masks after group 1): values named `...pwd` in any syntax
  (`KEY=`, `"key":`, `key: `, `=>`)
- `secret_name_auth` (phase 3, masks after group 1): values named `...auth` in any syntax
  (`KEY=`, `"key":`, `key: `, `=>`)
- `secret_name_key` (phase 3, masks after group 1): values named `...key` in any syntax
  (`KEY=`, `"key":`, `key: `, `=>`)
- `secret_name_sig` (phase 3, masks after group 1): values named `...sig` in any syntax
  (`KEY=`, `"key":`, `key: `, `=>`)
- `secret_name_dsn` (phase 3, masks after group 1): values named `...dsn` in any syntax
  (`KEY=`, `"key":`, `key: `, `=>`)
- `url_secret_param` (phase 3, masks after group 1): secret query parameters of a URL after
  `?` (`sig=`, `token=`, ...)
- `url_secret_param_amp` (phase 3, masks after group 1): secret query parameters of a URL
  after `&` (`sig=`, `token=`, ...)
- `url_secret_param_encoded` (phase 3, masks after group 1): secret query parameters of a
  URL after `%3f` (`sig=`, `token=`, ...)
- `url_secret_param_encoded_amp` (phase 3, masks after group 1): secret query parameters of
  a URL after `%26` (`sig=`, `token=`, ...)
- `netrc_line` (phase 3, masks after group 1): `.netrc` lines:
  `machine HOST login USER password VALUE`
- `netrc_password_line` (phase 3, masks after group 1): a `.netrc` line of its own:
  `password VALUE` (indented or not, JSON-escaped or not)
- `pgpass_line` (phase 3, masks group 1): `.pgpass` lines:
  `host:port:database:user:password`
- `putty_private_key` (phase 3, masks after group 1): PuTTY private keys: the
  `Private-Lines` body and its `Private-MAC`
- `credential_word_token` (phase 3, masks the match): a random token (a digit, distinct
  characters; both cases, or hex/base32 in one) right after a credential word
- `password_flag_after_user` (phase 3, masks after group 1): a password after `-p` (glued or
  not) following `-u USER` or `--user USER`
- `password_flag_p` (phase 3, masks the match): a password after `-p` (glued or not) on a
  line naming `mysql`, `mariadb`, `sshpass`, `login`, `mongo`, `twine`
- `password_flag_p_upper` (phase 3, masks the match): a password after `-P` (glued or not)
  on a line naming `sqlcmd`, `bcp`, `osql`, `zip`
- `seven_zip_password` (phase 3, masks after group 1): 7-Zip's password, glued to its `-p`
  (`7z x a.7z -pS3cret`)
- `password_flag_a` (phase 3, masks the match): a password after `-a` (glued or not) on a
  line naming `redis`
- `password_flag_w` (phase 3, masks the match): a password after `-w` (glued or not) on a
  line naming `ldap`
- `pass_flag` (phase 3, masks after group 1): `--pass`, `--passphrase`, `--pw`,
  `-storepass`, `-keypass`... and their value
- `user_password_flag` (phase 3, masks after group 1): `user:password` after `-u`, `-U`,
  `-a`, `-A`, `--user`, `--proxy-user`, `--auth` (curl, httpie; `user%password` for
  smbclient)

Left alone on purpose: git SHAs and sha256 digests (hex has no upper and lower case mix,
so it is never an AWS secret; right after a credential word, `api_token 3f9a...`, it is a
token), UUIDs, `max_tokens=4096`, `token_count=5` (the secret word must END the name),
base64 data without a key context, certificates and public keys; and a placeholder where
a header's credential goes (`Authorization: Bearer TOKEN`, `$API_KEY`, `<token>`: the
shapes marked `placeholders`, engine.is_placeholder), which the reference masked.

A key's prefix is its start where it stands after a blank or punctuation; a distinctive
one inside a longer word too (rules.py: `k33-hvs.…`; one with `_` or `-` never after a
letter, where a kebab-case name runs into it). A dotted family's key may hold more
dot-separated parts (`dp.st.<config>.…`, `sk.eyJ….<signature>`).

Engines. Which passes run on a text is decided by its anchors (gate.py): under the
compiled engine (scan.py, when Hyperscan loads) one scan finds every anchor; under the
pure-Python one, a substring search each; the compiled engine also looks at a long text a
chunk at a time, and a rule that matches within a line then reads only the chunks that
hold its anchors. The passes, and so the output, are the same byte for byte
(tests/test_redact.py runs its checks under both, tests/test_redact_chunks.py compares
chunked texts).

Masks keep syntax: a mask never ends inside an escape (`\\"` stays whole: a masked JSON
string stays a JSON string with its closing quote), and the shape-free rules stop a value
at a quote, a backslash or a bracket.

Linear time. Every pattern runs in linear time on Python's backtracking `re` (record.py
says how a pattern is written so; tests/test_redact.py walks every compiled pattern), a
pattern runs at all only where its anchors occur (gate.py), and what a long text costs
after that is a fixed number of substring searches over it and a scan per rule that has
matches, whatever it holds (engine.py). Where credentials are on every line the work is
per match, kept to a scan per rule (trace.py).

The files of this package, in layers: each imports only those above it when it is loaded
(front.py loads trace.py and tail.py on first use; tests/test_redact.py checks the order):

- words.py: the marker, and the secret-sounding names and flags the rules look for.
- env.py: which values of the child's environment are literal secrets.
- text.py: phase 1 (the literal secrets) and the hand-over of a whole text to the rest.
- front.py: `redact`, `redact_argv`, `redact_tail`; the rest is imported on the first
  text long enough for a rule (start-up time matters).
- record.py: what an entry of the table holds (`Shape`), and what is read off entries.
- rules.py: the provider rules: rules.toml read, each record checked and made a `Shape`.
- shapes.py: the table, one entry a shape, then the provider rules' shapes.
- scan.py: the compiled engine (Hyperscan, the `fast` extra): every anchor in one scan;
  which engine is in use (`use_engine`).
- gate.py: the case fold, and which passes can match a text at all (anchors).
- engine.py: the table compiled into passes; how each finds its matches; phases 2 and 3.
- trace.py: where each piece of the output came from, so phase 3 masks on top of phase 2.
- tail.py: a tail with the text before its cut, its first line traced with that text.

Other rooms import only from `execkit._redact`; tests may reach into its files.
"""

from __future__ import annotations

from execkit._redact.env import MIN_ENV_SECRET_LEN, looks_secret_name, secret_env_values
from execkit._redact.front import redact, redact_argv, redact_tail
from execkit._redact.scan import available_engines, engine_in_use, use_engine
from execkit._redact.words import REDACTED

__all__ = [
    "MIN_ENV_SECRET_LEN",
    "REDACTED",
    "available_engines",
    "engine_in_use",
    "looks_secret_name",
    "redact",
    "redact_argv",
    "redact_tail",
    "secret_env_values",
    "use_engine",
]
