"""How each recorded CLI is pointed at the loopback fake API: its env and config files.

One `setup_<cli>(box, base_url, scenario)` per CLI writes the CLI's config into the cell's
sandbox and returns the variables it runs with (`Setup`). A scenario shapes it:
`no_key` leaves the credential out, `logged_out` also leaves the base URL out (the CLI's
own default vendor, refused by the proxy), `keep_retries` keeps the CLI's own retry
policy (otherwise lowered where the CLI lets it be), `untrusted` leaves the working
directory unmarked, `cli_attempts` sets the CLI's own attempts (its delays left at their
defaults), `output` asks the CLI for another output mode than the adapter's (`MODE_FLAGS`:
the flag and value each adapter passes, dropped for `text`). `base_url` is where the CLI
is pointed: the fake API, a dead port, a host name that cannot resolve, or `https://` to
the plain-HTTP fake.

`APPLIES` says which scenarios each CLI is recorded in: a CLI that cannot be pointed at
a loopback API (auggie, amp's own service) is recorded only where it never needs one
(not logged in, no credentials, unreachable); crush, whose npm package has no binary
here, once as it is installed. tests/vendors/README.md tells the same per CLI.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fake_api import SCENARIOS, Scenario, Vendor

__all__ = [
    "APPLIES",
    "GATEWAY_TOKEN",
    "KEYS",
    "MODE_FLAGS",
    "SETUPS",
    "TIMEOUT_S",
    "VENDOR_OF",
    "Sandbox",
    "Setup",
    "applies",
]


# The fake keys: recognisable, never real, scrubbed to <KEY> in every recorded byte.
def _jwt_part(value: dict[str, str]) -> str:
    raw = json.dumps(value, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


# An unsigned gateway-session token (JWT audience `claude-gateway`): a credential stand-in
# like KEYS, scrubbed from recordings like them.
GATEWAY_TOKEN = (
    f"{_jwt_part({'alg': 'none', 'typ': 'JWT'})}.{_jwt_part({'aud': 'claude-gateway'})}.fake"
)
KEYS: dict[str, str] = {
    "codex": "sk-test-execkit-openai-0000",
    "claude": "sk-ant-api03-test-execkit-0000",
    "gemini": "AIzaSyTest-execkit-google-0000",
    "opencode": "sk-test-execkit-opencode-0000",
    "qwen": "sk-test-execkit-qwen-0000",
    "pi": "sk-test-execkit-pi-0000",
    "kilo": "sk-test-execkit-kilo-0000",
    "copilot": "sk-test-execkit-copilot-0000",
    "cn": "sk-test-execkit-continue-0000",
    "droid": "fk-test-execkit-factory-0000",
    "aider": "sk-test-execkit-aider-0000",
    "llm": "sk-test-execkit-llm-0000",
    "amp": "sgamp_test_execkit_0000",
    "auggie": "sk-test-execkit-augment-0000",
    "crush": "sk-test-execkit-crush-0000",
}
VENDOR_OF: dict[str, Vendor] = {
    "codex": "openai",
    "claude": "anthropic",
    "gemini": "google",
    "opencode": "openai",
    "qwen": "openai",
    "pi": "openai",
    "kilo": "openai",
    "copilot": "openai",
    "cn": "openai",
    "droid": "openai",
    "aider": "openai",
    "llm": "openai",
    "amp": "anthropic",
    "auggie": "anthropic",
    "crush": "openai",
}
# opencode and kilo retry 429/5xx five times with 2 s doubling backoff (no knob lowers
# opencode's): their own give-up takes about 75 s; aider gives up after about 60 s.
TIMEOUT_S: dict[str, float] = {"opencode": 120.0, "kilo": 120.0, "aider": 100.0, "qwen": 120.0}

_ALL = frozenset(SCENARIOS)
# Scenarios about a trust prompt apply only to CLIs that have one.
_TRUSTING = frozenset({"gemini", "qwen"})
# Where the CLI talks to its own service, not a model API: only what needs no API.
_NO_API = frozenset({"not_logged_in", "no_credentials"})
APPLIES: dict[str, frozenset[str]] = {
    "amp": _NO_API | {"connection_refused", "dns_failure", "tls_failure"},
    "auggie": frozenset({"not_logged_in"}),
    "crush": frozenset({"not_installed"}),
}


# The output-mode flag and value each adapter's argv carries (`Scenario.output` swaps it).
MODE_FLAGS: dict[str, tuple[str, str]] = {
    "pi": ("--mode", "json"),
    "qwen": ("--output-format", "stream-json"),
    "gemini": ("--output-format", "json"),
}


def output_argv(cli: str, argv: list[str], output: str | None) -> list[str]:
    """`argv` with the adapter's output mode swapped for `output` (`text`: the flag and
    its value dropped, the CLI's default; else the value replaced)."""
    if output is None:
        return argv
    flag, value = MODE_FLAGS[cli]
    at = next(i for i in range(len(argv) - 1) if argv[i] == flag and argv[i + 1] == value)
    if output == "text":
        return argv[:at] + argv[at + 2 :]
    return [*argv[: at + 1], output, *argv[at + 2 :]]


def applies(cli: str, scenario: str) -> bool:
    """Whether `cli` is recorded in `scenario`."""
    chosen = SCENARIOS[scenario].clis
    if chosen is not None:
        return cli in chosen
    if cli in APPLIES:
        return scenario in APPLIES[cli]
    if scenario == "not_installed":
        return False
    if scenario == "untrusted_workspace":
        return cli in _TRUSTING
    if SCENARIOS[scenario].gateway or SCENARIOS[scenario].stream_json:
        return cli == "claude"
    return scenario in _ALL


@dataclass
class Sandbox:
    """One cell's private directories: all of a CLI's state lives under `root`."""

    root: Path
    home: Path = field(init=False)
    work: Path = field(init=False)
    tmp: Path = field(init=False)

    def __post_init__(self) -> None:
        self.home = self.root / "home"
        self.work = self.root / "work"
        self.tmp = self.root / "tmp"
        for path in (self.home, self.work, self.tmp):
            path.mkdir(parents=True)
        # The agent's working directory is a fresh, empty git repository, as an agent
        # runner's checkout would be (codex exec refuses a directory outside one).
        git = shutil.which("git")
        if git:
            subprocess.run(
                [git, "init", "-q", str(self.work)],
                env={"PATH": "/usr/bin:/bin", "HOME": str(self.home)},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=30,
                check=False,
            )

    def write(self, path: Path, text: str, files: dict[str, str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        files[str(path)] = text


@dataclass
class Setup:
    """The env a CLI runs with, the config files written for it, and what the request
    adds to the adapter's argv (`model`, `extra_args`: what a user would pass)."""

    env: dict[str, str]
    files: dict[str, str] = field(default_factory=dict)
    model: str | None = None
    extra_args: tuple[str, ...] = ()


def _key(env: dict[str, str], name: str, cli: str, scenario: Scenario) -> None:
    if not scenario.no_key:
        env[name] = KEYS[cli]


# --------------------------------------------------------------------------- the first four


def _toml_str(value: str) -> str:
    return json.dumps(value)


def setup_codex(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    codex_home = box.home / ".codex"
    retries = "" if scenario.keep_retries else "request_max_retries = 1\nstream_max_retries = 1\n"
    provider = (
        ""
        if scenario.logged_out
        else f"""
[model_providers.fake]
name = "fake"
base_url = {_toml_str(base_url + "/v1")}
env_key = "OPENAI_API_KEY"
wire_api = "responses"
{retries}stream_idle_timeout_ms = 15000
"""
    )
    config = f"""\
{"" if scenario.logged_out else 'model_provider = "fake"' + chr(10)}approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false

[features]
plugins = false
remote_plugin = false
apps = false
plugin_sharing = false

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"
trace_exporter = "none"
metrics_exporter = "none"
log_user_prompt = false
{provider}
[projects.{_toml_str(str(box.work))}]
trust_level = "trusted"
"""
    setup = Setup({"CODEX_HOME": str(codex_home)})
    _key(setup.env, "OPENAI_API_KEY", "codex", scenario)
    box.write(codex_home / "config.toml", config, setup.files)
    return setup


def setup_claude(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    env = {
        "CLAUDE_CONFIG_DIR": str(box.home / ".claude"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_ERROR_REPORTING": "1",
    }
    if not scenario.logged_out:
        env["ANTHROPIC_BASE_URL"] = base_url
    if not scenario.keep_retries:
        env["CLAUDE_CODE_MAX_RETRIES"] = "1"
    if scenario.gateway:
        # claude-code 2.1 tracks the unified limits (and prints `rate_limit_event`) only for
        # a claude.ai sign-in or a gateway session: a bearer token whose JWT audience is
        # `claude-gateway`, sent to a base URL that is not api.anthropic.com. The token is
        # an unsigned stand-in: only the fake API reads it.
        env["ANTHROPIC_AUTH_TOKEN"] = GATEWAY_TOKEN
        return Setup(env)
    # stream-json --verbose is the adapter's own argv (issue 51): the `*_stream` scenarios
    # (recorded when it was not) now run what every claude cell runs.
    _key(env, "ANTHROPIC_API_KEY", "claude", scenario)
    return Setup(env)


def _gemini_like(
    box: Sandbox, scenario: Scenario, folder: str, auth: str, general: dict[str, object]
) -> tuple[dict[str, object], Path]:
    if scenario.cli_attempts is not None:
        general["maxAttempts"] = scenario.cli_attempts
    elif not scenario.keep_retries:
        general["maxAttempts"] = 2
    settings: dict[str, object] = {
        "general": general,
        "privacy": {"usageStatisticsEnabled": False},
        "telemetry": {"enabled": False},
        "security": {"auth": {"selectedType": auth}} if not scenario.logged_out else {},
    }
    if scenario.untrusted:
        security = settings["security"]
        assert isinstance(security, dict)
        security["folderTrust"] = {"enabled": True}
    return settings, box.home / folder / "settings.json"


def setup_gemini(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    general: dict[str, object] = {
        "enableAutoUpdate": False,
        "enableAutoUpdateNotification": False,
    }
    settings, path = _gemini_like(box, scenario, ".gemini", "gemini-api-key", general)
    env: dict[str, str] = {}
    _key(env, "GEMINI_API_KEY", "gemini", scenario)
    if not scenario.logged_out:
        env["GOOGLE_GEMINI_BASE_URL"] = base_url
    if not scenario.untrusted:
        env["GEMINI_CLI_TRUST_WORKSPACE"] = "true"
    setup = Setup(env)
    box.write(path, json.dumps(settings, indent=2), setup.files)
    return setup


def _openai_compatible(base_url: str, key_env: str) -> dict[str, object]:
    return {
        "npm": "@ai-sdk/openai-compatible",
        "name": "Fake",
        "options": {"baseURL": base_url + "/v1", "apiKey": "{env:" + key_env + "}"},
        "models": {"gpt-fake": {"name": "GPT Fake"}},
    }


def setup_opencode(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    config: dict[str, object] = {
        "$schema": "https://opencode.ai/config.json",
        "model": "fake/gpt-fake",
        "autoupdate": False,
        "share": "disabled",
        "provider": {"fake": _openai_compatible(base_url, "FAKE_API_KEY")},
    }
    if scenario.logged_out:
        del config["model"], config["provider"]
    path = box.home / ".config" / "opencode" / "opencode.json"
    env = {
        "OPENCODE_CONFIG": str(path),
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_SHARE": "1",
    }
    _key(env, "FAKE_API_KEY", "opencode", scenario)
    setup = Setup(env)
    box.write(path, json.dumps(config, indent=2), setup.files)
    return setup


# --------------------------------------------------------------------------- the others


def setup_qwen(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    general: dict[str, object] = {"disableAutoUpdate": True, "disableUpdateNag": True}
    settings, path = _gemini_like(box, scenario, ".qwen", "openai", general)
    if scenario.cli_attempts is not None:
        # Its rate-limit loop with its own delays (60 s doubling to 5 min, at least the
        # Retry-After): only the count of retries is set.
        settings["model"] = {"generationConfig": {"maxRetries": scenario.cli_attempts - 1}}
    elif not scenario.keep_retries:
        # qwen's own rate-limit and 5xx loop (10 tries from 60 s apart by default):
        # `model.generationConfig` lowers it (packages/core/src/models/constants.ts).
        settings["model"] = {
            "generationConfig": {
                "maxRetries": 1,
                "retryInitialDelayMs": 500,
                "retryMaxDelayMs": 1000,
            }
        }
    env: dict[str, str] = {}
    _key(env, "OPENAI_API_KEY", "qwen", scenario)
    if not scenario.logged_out:
        env["OPENAI_BASE_URL"] = base_url + "/v1"
        env["OPENAI_MODEL"] = "gpt-fake"
    if not scenario.untrusted:
        env["QWEN_CODE_TRUST_WORKSPACE"] = "true"
        env["GEMINI_CLI_TRUST_WORKSPACE"] = "true"
    setup = Setup(env)
    box.write(path, json.dumps(settings, indent=2), setup.files)
    return setup


def setup_pi(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    agent = box.home / ".pi" / "agent"
    env: dict[str, str] = {"PI_SKIP_VERSION_CHECK": "1", "PI_TELEMETRY": "0"}
    _key(env, "FAKE_API_KEY", "pi", scenario)
    setup = Setup(env)
    settings: dict[str, object] = {"quietStartup": True}
    if scenario.cli_attempts is not None:
        retry: dict[str, object] = {"enabled": True, "maxRetries": scenario.cli_attempts - 1}
        if scenario.sdk_retries is not None:
            retry["provider"] = {"maxRetries": scenario.sdk_retries}
        settings["retry"] = retry
    elif not scenario.keep_retries:
        settings["retry"] = {"enabled": True, "maxRetries": 1, "baseDelayMs": 500}
    if not scenario.logged_out:
        models = {
            "providers": {
                "fake": {
                    "baseUrl": base_url + "/v1",
                    "api": "openai-completions",
                    "apiKey": "FAKE_API_KEY",
                    "models": [{"id": "gpt-fake", "name": "GPT Fake", "contextWindow": 128000}],
                }
            }
        }
        box.write(agent / "models.json", json.dumps(models, indent=2), setup.files)
        settings["defaultProvider"] = "fake"
        settings["defaultModel"] = "gpt-fake"
    box.write(agent / "settings.json", json.dumps(settings, indent=2), setup.files)
    return setup


def setup_kilo(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    config: dict[str, object] = {
        "$schema": "https://app.kilo.ai/config.json",
        "model": "fake/gpt-fake",
        "autoupdate": False,
        "share": "disabled",
        "provider": {"fake": _openai_compatible(base_url, "FAKE_API_KEY")},
    }
    if scenario.logged_out:
        del config["model"], config["provider"]
    env: dict[str, str] = {"KILO_CONFIG_CONTENT": json.dumps(config)}
    for prefix in ("KILO", "OPENCODE"):
        for switch in (
            "DISABLE_MODELS_FETCH",
            "DISABLE_AUTOUPDATE",
            "DISABLE_DEFAULT_PLUGINS",
            "DISABLE_LSP_DOWNLOAD",
            "DISABLE_SHARE",
            "DISABLE_TELEMETRY",
        ):
            env[f"{prefix}_{switch}"] = "1"
    if not scenario.keep_retries:
        env["KILO_SESSION_RETRY_LIMIT"] = "1"
    _key(env, "FAKE_API_KEY", "kilo", scenario)
    return Setup(env)


def setup_copilot(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    env: dict[str, str] = {
        "COPILOT_HOME": str(box.home / ".copilot"),
        "COPILOT_AUTO_UPDATE": "false",
        "COPILOT_DISABLE_TELEMETRY": "1",
    }
    if not scenario.logged_out:
        env["COPILOT_PROVIDER_BASE_URL"] = base_url + "/v1"
        env["COPILOT_MODEL"] = "gpt-fake"
        env["COPILOT_OFFLINE"] = "true"
    _key(env, "COPILOT_PROVIDER_API_KEY", "copilot", scenario)
    return Setup(env)


def setup_cn(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    path = box.home / ".continue" / "execkit-fake.yaml"
    key = "" if scenario.no_key else f"\n    apiKey: {KEYS['cn']}"
    config = f"""\
name: execkit-fake
version: 1.0.0
schema: v1
models:
  - name: gpt-fake
    provider: openai
    model: gpt-fake
    apiBase: {base_url}/v1{key}
    roles: [chat, edit, apply]
"""
    setup = Setup({"CONTINUE_GLOBAL_DIR": str(box.home / ".continue"), "CONTINUE_TELEMETRY": "0"})
    if not scenario.logged_out:
        box.write(path, config, setup.files)
        setup.extra_args = ("--config", str(path))
    return setup


def setup_droid(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    env: dict[str, str] = {"FACTORY_DISABLE_AUTOUPDATE": "1", "DROID_DISABLE_AUTO_UPDATE": "1"}
    if not scenario.logged_out:
        env["FACTORY_API_BASE_URL"] = base_url
    _key(env, "FACTORY_API_KEY", "droid", scenario)
    return Setup(env)


def setup_aider(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    env: dict[str, str] = {
        "AIDER_CHECK_UPDATE": "false",
        "AIDER_ANALYTICS": "false",
        "AIDER_SHOW_MODEL_WARNINGS": "false",
    }
    if not scenario.logged_out:
        env["OPENAI_API_BASE"] = base_url + "/v1"
    _key(env, "OPENAI_API_KEY", "aider", scenario)
    model = None if scenario.logged_out else "openai/gpt-fake"
    return Setup(env, model=model, extra_args=("--no-auto-commits", "--no-gitignore"))


def setup_llm(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    user_path = box.home / "llm"
    setup = Setup({"LLM_USER_PATH": str(user_path)})
    if scenario.logged_out:
        setup.model = None
    else:
        models = (
            "- model_id: fake\n"
            "  model_name: gpt-fake\n"
            f"  api_base: {base_url}/v1\n"
            "  api_key_name: fake\n"
        )
        box.write(user_path / "extra-openai-models.yaml", models, setup.files)
        setup.model = "fake"
    if not scenario.no_key:
        name = "openai" if scenario.logged_out else "fake"
        keys = json.dumps({name: KEYS["llm"]}, indent=2)
        box.write(user_path / "keys.json", keys, setup.files)
    return setup


def setup_amp(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    env: dict[str, str] = {"AMP_SETTINGS_FILE": str(box.home / ".config" / "amp" / "s.json")}
    if not scenario.logged_out:
        env["AMP_URL"] = base_url
    _key(env, "AMP_API_KEY", "amp", scenario)
    return Setup(env)


def setup_plain(box: Sandbox, base_url: str, scenario: Scenario) -> Setup:
    """A CLI that cannot be pointed at a loopback API: nothing but the sandbox."""
    return Setup({})


SETUPS: dict[str, Callable[[Sandbox, str, Scenario], Setup]] = {
    "codex": setup_codex,
    "claude": setup_claude,
    "gemini": setup_gemini,
    "opencode": setup_opencode,
    "qwen": setup_qwen,
    "pi": setup_pi,
    "kilo": setup_kilo,
    "copilot": setup_copilot,
    "cn": setup_cn,
    "droid": setup_droid,
    "aider": setup_aider,
    "llm": setup_llm,
    "amp": setup_amp,
    "auggie": setup_plain,
    "crush": setup_plain,
}
