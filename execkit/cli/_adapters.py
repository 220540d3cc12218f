"""`execkit adapters [--json]` (a doctor check) and `execkit run --adapter NAME -- ARGS...`.

`execkit adapters` lists every adapter, its binary and where that binary is on PATH, and
whether its credentials look present: one of its documented variables (`credential_env`)
is set, or one of its credential files (`credential_files`) exists. Only names are ever
printed, never a value.
`run_adapter_command` runs one prompt once through the adapter, with the argv the
dispatcher would build (`adapter.build_argv`: the last ARG is the prompt, the ARGS before
it are added as the request's `extra_args`), and reports the AgentProof: with `--json` the
whole proof (with `"class"`, `"reason"`, `"precondition"`), otherwise the reply on stdout,
or one line on stderr naming the class and what to fix. The `generic` adapter takes the
program and its arguments as ARGS, as before.
"""

from __future__ import annotations

import argparse
import os
import subprocess
from collections.abc import Mapping
from typing import Any

from execkit._adapter import Adapter, AgentRequest, credential_env_of, credential_files_of
from execkit._agent import run_command
from execkit._classify import Reason, never_started, stall_reason
from execkit._errors import InvalidInput
from execkit._exec import DEFAULT_KILL_GRACE_S, ProcessStarter
from execkit._proof import AgentProof, AgentStatus
from execkit._registry import adapter_names, find_binary, get_adapter
from execkit.cli._args import parse_seconds
from execkit.cli._output import emit, print_json, safe_text

__all__ = ["register", "run_adapter_command"]

# Shell conventions, as `execkit run` uses them: never started, timed out, other failure.
_NOT_STARTED_EXIT = 127
_TIMEOUT_EXIT = 124
_FAILED_EXIT = 1


def register(sub: argparse._SubParsersAction[Any]) -> None:
    """Add `execkit adapters`."""
    parser = sub.add_parser(
        "adapters",
        help="list vendor adapters and whether each binary is on PATH",
        description="List the built-in and registered adapters, their binaries, "
        "whether each binary is on PATH (with the install hint when it is not), and "
        "whether credentials look present (a documented variable set or a credential "
        "file there; names only, never values).",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=_handle_list)


def credential_status(adapter: Adapter, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Whether `adapter`'s credentials look present, by name only (values never read out).

    `{"known": bool, "present": bool, "found": [names set / files there], "env": [...],
    "files": [...]}`; `known` is False for an adapter that documents no credentials.
    """
    environ = os.environ if env is None else env
    names = list(credential_env_of(adapter))
    files = list(credential_files_of(adapter))
    found = [name for name in names if environ.get(name, "").strip()]
    home = environ.get("HOME") or os.path.expanduser("~")
    for path in files:
        full = os.path.join(home, path[2:]) if path.startswith("~/") else path
        if os.path.isfile(full):
            found.append(path)
    return {
        "known": bool(names or files),
        "present": bool(found),
        "found": found,
        "env": names,
        "files": files,
    }


def _credentials_line(row: dict[str, Any]) -> str:
    """What follows `credentials: ` (execkit's own label, written unmasked by `emit`: the
    redactor would read `credentials: present` as a secret-named value)."""
    creds = row["credentials"]
    if not creds["known"]:
        return "none documented"
    if creds["present"]:
        return "present (" + ", ".join(creds["found"]) + ")"
    missing = []
    if creds["env"]:
        missing.append(_listed(creds["env"]) + " set")
    if creds["files"]:
        missing.append(_listed(creds["files"]))
    login = f"; log in: {row['login_hint']}" if row.get("login_hint") else ""
    return f"none found (no {', no '.join(missing)}){login}"


def _listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for name in adapter_names():
        try:
            adapter = get_adapter(name)
        except InvalidInput as exc:
            rows.append({"name": name, "error": exc.message})
            continue
        path = find_binary(adapter)
        rows.append(
            {
                "name": name,
                "binary": adapter.binary or None,
                "path": path,
                "on_path": path is not None,
                "install_hint": adapter.install_hint,
                "login_hint": adapter.login_hint,
                "credentials": credential_status(adapter),
            }
        )
    return rows


def _handle_list(args: argparse.Namespace) -> int:
    rows = _rows()
    if args.json:
        print_json({"adapters": rows})
        return 0
    for row in rows:
        # Names, hints and paths come from installed distributions and PATH: escape them.
        if "error" in row:
            line = f"{row['name']:<10} broken: {row['error']}"
        elif row["binary"] is None:
            line = f"{row['name']:<10} (any command: give it after --)"
        elif row["on_path"]:
            line = f"{row['name']:<10} {row['binary']:<10} {row['path']}"
        else:
            line = (
                f"{row['name']:<10} {row['binary']:<10} not on PATH; install: {row['install_hint']}"
            )
        emit(safe_text(line))
        if "error" not in row:
            emit(safe_text(_credentials_line(row)), lead="           credentials: ")
    return 0


# A stall is a timeout of its own kind: the same exit status (the reason names the seconds).
_STALLED = stall_reason(1).split(":")[0] + ":"


def _exit_code(proof: AgentProof) -> int:
    if proof.status is not AgentStatus.FAILED:
        return 0
    if never_started(proof.reason):
        return _NOT_STARTED_EXIT
    if proof.reason == Reason.TIMEOUT or (proof.reason or "").startswith(_STALLED):
        return _TIMEOUT_EXIT
    return _FAILED_EXIT


# A prompt no one types: the adapter's own argv is what build_argv gives around it.
_PROBE = "\x00execkit-prompt\x00"


def _own_tokens(adapter: Adapter) -> tuple[set[str], set[str]]:
    """(flags, words) the adapter puts in every argv it builds: its options (a flag's name
    before any `=`) and its subcommand words, the program and the prompt left out."""
    flags: set[str] = set()
    words: set[str] = set()
    for token in adapter.build_argv(AgentRequest(prompt=_PROBE))[1:]:
        if token == "--":
            continue
        if token.startswith("-"):
            flags.add(token.split("=", 1)[0])
        elif _PROBE not in token:
            words.add(token)
    return flags, words


def _adapter_argv(adapter: Adapter, given: list[str]) -> list[str]:
    """The argv `execkit run --adapter` runs: the dispatcher's for the prompt in `given`."""
    name = adapter.name
    if not adapter.binary:
        # generic: the program comes with the request (its extra_args), the prompt is none.
        if not given:
            raise InvalidInput(
                f"adapter {name!r} needs the command after --: "
                f"execkit run --adapter {name} -- PROGRAM [ARGS...]",
                field="extra_args",
            )
        return adapter.build_argv(AgentRequest(prompt="", extra_args=given))
    usage = f"execkit run --adapter {name} -- [ARGS...] PROMPT"
    if not given:
        raise InvalidInput(f"adapter {name!r} needs a prompt after --: {usage}", field="prompt")
    flags, words = _own_tokens(adapter)
    *extra, prompt = given
    for index, arg in enumerate(given):
        flag = arg.startswith("-")
        own = arg.split("=", 1)[0] in flags if flag else arg in words
        # The last ARG is the prompt: a word there is its text, a flag of the adapter's not.
        if own and (index < len(extra) or flag):
            shown = " ".join(adapter.build_argv(AgentRequest(prompt="PROMPT")))
            raise InvalidInput(
                f"{arg!r} is set by the {name} adapter itself ({shown}); give only the "
                f"prompt and any other arguments: {usage}",
                field="extra_args",
            )
    return adapter.build_argv(AgentRequest(prompt=prompt, extra_args=extra))


def run_adapter_command(
    args: argparse.Namespace, *, start: ProcessStarter = subprocess.Popen
) -> int:
    """`execkit run --adapter NAME [--json] [--timeout S] -- [ARGS...] PROMPT`.

    Reads `args.adapter`, `args.command_argv` (a leading `--` is dropped), `args.json`
    and, when present, `args.timeout` and `args.kill_grace` (strings, as `execkit run`
    parses them). The argv is the dispatcher's (issue 51): `adapter.build_argv` of a
    request whose prompt is the last ARG and whose `extra_args` are the ARGS before it,
    added after the adapter's own (`claude -p --output-format stream-json --verbose ARGS...
    PROMPT`), never in their place; `generic` takes the program and its arguments as ARGS.
    `start` starts it (`spawn`'s seam). Exit status: 0 on success, 127 when the binary
    could not be started, 124 on timeout, 1 for any other failure (a refused credential
    included: the program ran).
    Raises UnknownAdapter / InvalidInput (the CLI reports them) for bad input: no ARGS
    (field `prompt`), or an ARG the adapter sets itself (field `extra_args`: its output
    format, its subcommand; the adapter could not read what another one prints).
    """
    adapter = get_adapter(args.adapter)
    raw_args = list(getattr(args, "command_argv", None) or [])
    if raw_args and raw_args[0] == "--":
        raw_args = raw_args[1:]
    argv = _adapter_argv(adapter, raw_args)
    timeout = parse_seconds("--timeout", getattr(args, "timeout", None), allow_zero=False)
    grace = parse_seconds("--kill-grace", getattr(args, "kill_grace", None), allow_zero=True)
    stall = parse_seconds("--stall-timeout", getattr(args, "stall_timeout", None), allow_zero=False)
    proof = run_command(
        adapter,
        argv,
        timeout_s=timeout,
        stall_timeout_s=stall,
        kill_grace=DEFAULT_KILL_GRACE_S if grace is None else grace,
        start=start,
    )
    if getattr(args, "json", False):
        print_json(proof.to_dict())
    elif proof.status is AgentStatus.FAILED:
        cls = proof.failure_class.value if proof.failure_class else "work"
        detail = proof.precondition or proof.error or "no output"
        line = f"execkit: {adapter.name} failed ({cls}: {proof.reason}): {detail}"
        emit(safe_text(line), err=True)
    elif proof.output:
        # The vendor's reply, lines and all; its other control characters are escaped.
        emit(safe_text(proof.output, multiline=True))
    return _exit_code(proof)
