"""Where the pinned vendor CLIs are (tests/vendors/node_modules) and what version each is.

    python tests/vendors/clis.py            # one line per CLI: found or why not
    python tests/vendors/clis.py install    # `npm ci` here when node_modules is stale

`find_cli(name)` never raises for a missing tool: it returns a `CLI` whose `missing` says
why (no node, no npm, not installed, a binary that does not run), so a caller prints that
and skips instead of failing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CLI",
    "CLI_NAMES",
    "HERE",
    "NODE_MODULES",
    "PACKAGES",
    "find_cli",
    "find_older",
    "install",
]

HERE = Path(__file__).resolve().parent
NODE_MODULES = HERE / "node_modules"
BIN = NODE_MODULES / ".bin"

# adapter name -> npm package (the binary is named like the adapter)
PACKAGES: dict[str, str] = {
    "codex": "@openai/codex",
    "claude": "@anthropic-ai/claude-code",
    "gemini": "@google/gemini-cli",
    "opencode": "opencode-ai",
    "qwen": "@qwen-code/qwen-code",
    "pi": "@mariozechner/pi-coding-agent",
    "kilo": "@kilocode/cli",
    "copilot": "@github/copilot",
    "cn": "@continuedev/cli",
    "droid": "@factory/cli",
    "amp": "@ampcode/cli",
    "auggie": "@augmentcode/auggie",
    "crush": "@charmland/crush",
}
# adapter name -> PyPI distribution, each in its own venv under pyvenv/ (their pins clash)
PYPI: dict[str, str] = {"aider": "aider-chat", "llm": "llm"}
CLI_NAMES: tuple[str, ...] = (*PACKAGES, *PYPI)
PYVENV = HERE / "pyvenv"
# Packages whose npm install script only links the binary of the platform package npm
# installed (no download): `npm ci --ignore-scripts`, then these are rebuilt. crush's
# script downloads from GitHub, which fails here: it is never run at install.
LINK_SCRIPTS = (
    "@anthropic-ai/claude-code",
    "opencode-ai",
    "@ampcode/cli",
    "@factory/cli",
    "@kilocode/cli",
)

_VERSION_TIMEOUT_S = 60.0
_NPM_CI_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class CLI:
    """One vendor CLI: its binary and version, or why it cannot be used (`missing`)."""

    name: str
    package: str
    pinned: str | None
    path: Path | None = None
    version: str | None = None
    missing: str | None = None

    @property
    def ok(self) -> bool:
        return self.missing is None and self.path is not None


def pinned_versions() -> dict[str, str]:
    """The exact versions package.json pins, by npm package name."""
    manifest = json.loads((HERE / "package.json").read_text(encoding="utf-8"))
    deps: dict[str, str] = manifest.get("dependencies", {})
    return deps


def _installed_version(package: str) -> str | None:
    meta = NODE_MODULES / package / "package.json"
    try:
        version = json.loads(meta.read_text(encoding="utf-8")).get("version")
    except (OSError, ValueError):
        return None
    return version if isinstance(version, str) else None


def _tool_missing() -> str | None:
    if shutil.which("node") is None:
        return "node is not on PATH (install Node.js 20+ and npm, then `make record-vendors`)"
    if shutil.which("npm") is None:
        return "npm is not on PATH (install npm, then `make record-vendors`)"
    return None


def node_bin_dir() -> str | None:
    """The directory of the `node` on PATH (the CLIs' shebangs need it on their PATH)."""
    node = shutil.which("node")
    return str(Path(node).resolve().parent) if node else None


def pypi_pins() -> dict[str, str]:
    """The exact versions requirements.txt pins, by PyPI distribution name."""
    pins: dict[str, str] = {}
    for line in (HERE / "requirements.txt").read_text(encoding="utf-8").splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and not name.startswith("#"):
            pins[name] = version
    return pins


def _find_pypi(name: str, run_version: bool) -> CLI:
    package = PYPI[name]
    pinned = pypi_pins().get(package)
    binary = PYVENV / name / "bin" / name
    if not binary.exists():
        why = f"{package} is not installed in {PYVENV / name} (run `python {HERE}/clis.py install`)"
        return CLI(name, package, pinned, missing=why)
    version = pinned
    if run_version:
        version, problem = _run_version(binary)
        if problem:
            return CLI(name, package, pinned, path=binary, missing=problem)
    return CLI(name, package, pinned, path=binary, version=version)


def find_cli(name: str, *, run_version: bool = True) -> CLI:
    """The installed CLI `name` (see `CLI_NAMES`), or why it is missing.

    crush is found without running it: its npm shim would try to download its binary.
    """
    if name in PYPI:
        return _find_pypi(name, run_version)
    package = PACKAGES[name]
    run_version = run_version and name != "crush"
    pinned = pinned_versions().get(package)
    missing = _tool_missing()
    if missing:
        return CLI(name, package, pinned, missing=missing)
    binary = BIN / name
    if not binary.exists():
        return CLI(
            name,
            package,
            pinned,
            missing=f"{package} is not installed in {NODE_MODULES} "
            "(run `cd tests/vendors && npm ci`, or `make record-vendors`)",
        )
    installed = _installed_version(package)
    if pinned and installed != pinned:
        return CLI(
            name,
            package,
            pinned,
            path=binary,
            missing=f"{package} {installed} is installed but package.json pins {pinned} "
            "(run `cd tests/vendors && npm ci`)",
        )
    version = installed
    if run_version:
        version, problem = _run_version(binary)
        if problem:
            return CLI(name, package, pinned, path=binary, missing=problem)
    return CLI(name, package, pinned, path=binary, version=version)


def _run_version(binary: Path) -> tuple[str | None, str | None]:
    """`BINARY --version` in a throwaway HOME: (its last line, None) or (None, why)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="execkit-clis-") as home:
        env = {
            "HOME": home,
            "PATH": os.pathsep.join(filter(None, [node_bin_dir(), "/usr/bin", "/bin"])),
            "LANG": "C.UTF-8",
            "NO_COLOR": "1",
        }
        try:
            done = subprocess.run(
                [str(binary), "--version"],
                env=env,
                cwd=home,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=_VERSION_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None, f"{binary.name} --version did not finish in {_VERSION_TIMEOUT_S:.0f}s"
        except OSError as exc:
            return None, f"{binary.name} could not be started: {exc}"
    # Some print their version on stderr (pi).
    lines = (done.stdout or done.stderr).decode(errors="replace").strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = done.stderr.decode(errors="replace").strip()[-300:]
        return None, f"{binary.name} --version exited {done.returncode}: {tail}"
    return lines[-1].strip(), None


def _stale() -> bool:
    marker = NODE_MODULES / ".package-lock.json"
    lock = HERE / "package-lock.json"
    return not marker.exists() or marker.stat().st_mtime < lock.stat().st_mtime


def _run(argv: list[str], why: str) -> str | None:
    try:
        done = subprocess.run(
            argv, cwd=HERE, stdin=subprocess.DEVNULL, timeout=_NPM_CI_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return f"{why} did not finish in {_NPM_CI_TIMEOUT_S:.0f}s"
    if done.returncode != 0:
        return f"{why} exited {done.returncode} (is the package registry reachable?)"
    return None


def install_pypi() -> str | None:
    """One venv per PyPI CLI under pyvenv/, each with its pinned distribution."""
    for name, package in PYPI.items():
        venv = PYVENV / name
        pin = f"{package}=={pypi_pins()[package]}"
        marker = venv / ".installed"
        if marker.exists() and marker.read_text(encoding="utf-8") == pin:
            continue
        problem = _run([sys.executable, "-m", "venv", str(venv)], f"venv {venv}") or _run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", pin],
            f"pip install {pin}",
        )
        if problem:
            return problem
        marker.write_text(pin, encoding="utf-8")
    return None


def install() -> str | None:
    """`npm ci --ignore-scripts` in tests/vendors when node_modules is missing or older than
    the lock file, then the install scripts that only link a platform binary
    (`LINK_SCRIPTS`), then the PyPI CLIs' venvs.

    Returns None when the CLIs are installed, else why not (a caller skips with it).
    """
    missing = _tool_missing()
    if missing:
        return missing
    npm = shutil.which("npm")
    assert npm is not None
    if _stale():
        problem = _run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], "npm ci")
        problem = problem or _run([npm, "rebuild", *LINK_SCRIPTS], "npm rebuild")
        if problem:
            return problem
    return install_pypi()


LATEST = HERE / "latest"
OLDER = HERE / "older"
VERSIONS = HERE.parent.parent / "fixtures" / "recorded" / "versions.json"


def find_older(name: str, version: str) -> CLI:
    """CLI `name` at an older `version` (a scenario that records how an older release
    prints a failure), installed into tests/vendors/older/<name>-<version>/ (git-ignored)
    when it is not there yet; `missing` says why when it cannot be."""
    package = PACKAGES[name]
    missing = _tool_missing()
    if missing:
        return CLI(name, package, version, missing=missing)
    prefix = OLDER / f"{name}-{version}"
    binary = prefix / "node_modules" / ".bin" / name
    if not binary.exists():
        npm = shutil.which("npm")
        assert npm is not None
        prefix.mkdir(parents=True, exist_ok=True)
        (prefix / "package.json").write_text('{"private": true}\n', encoding="utf-8")
        spec = f"{package}@{version}"
        problem = _run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
                "--prefix",
                str(prefix),
                spec,
            ],
            f"npm install {spec}",
        )
        if problem:
            return CLI(name, package, version, missing=problem)
    found, problem = _run_version(binary)
    if problem:
        return CLI(name, package, version, path=binary, missing=problem)
    return CLI(name, package, version, path=binary, version=found)


def newest_served(name: str) -> str | None:
    """The newest version the package registry serves for CLI `name` (one look-up with
    the ordinary client: `npm view` or `pip index versions`), or None when it cannot say."""
    if name in PYPI:
        argv = [sys.executable, "-m", "pip", "index", "versions", PYPI[name]]
    else:
        npm = shutil.which("npm")
        if npm is None:
            return None
        argv = [npm, "view", PACKAGES[name], "version"]
    try:
        done = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = done.stdout.decode(errors="replace").strip()
    if done.returncode != 0 or not out:
        return None
    if name in PYPI:  # "aider-chat (0.86.2)"
        first = out.splitlines()[0]
        return first[first.find("(") + 1 : first.find(")")] or None
    return out.splitlines()[-1].strip()


def write_versions() -> dict[str, dict[str, str | None]]:
    """fixtures/recorded/versions.json: each CLI's pinned version and the newest served."""
    pins = {**pinned_versions(), **pypi_pins()}
    table = {}
    for name in CLI_NAMES:
        package = PYPI.get(name) or PACKAGES[name]
        table[name] = {
            "package": package,
            "pinned": pins.get(package),
            "newest": newest_served(name),
        }
    VERSIONS.write_text(json.dumps(table, indent=2) + "\n", encoding="utf-8")
    return table


def install_latest(names: list[str]) -> dict[str, Path | str]:
    """Install each npm CLI's newest version into tests/vendors/latest (git-ignored).

    Returns name -> its binary, or name -> why it could not be installed (a platform
    package the registry does not serve, an install script that downloads).
    """
    npm = shutil.which("npm")
    if npm is None:
        return {name: "npm is not on PATH" for name in names}
    LATEST.mkdir(exist_ok=True)
    (LATEST / "package.json").write_text('{"private": true}\n', encoding="utf-8")
    found: dict[str, Path | str] = {}
    for name in names:
        if name in PYPI:
            found[name] = "PyPI CLIs are checked against their pinned venv only"
            continue
        spec = f"{PACKAGES[name]}@latest"
        problem = _run(
            [
                npm,
                "install",
                "--no-audit",
                "--no-fund",
                "--ignore-scripts",
                "--prefix",
                str(LATEST),
                spec,
            ],
            f"npm install {spec}",
        )
        if problem is None and PACKAGES[name] in LINK_SCRIPTS:
            problem = _run([npm, "rebuild", "--prefix", str(LATEST), PACKAGES[name]], "npm rebuild")
        binary = LATEST / "node_modules" / ".bin" / name
        if problem is None and name != "crush":
            _, problem = _run_version(binary)
        found[name] = problem or binary
    return found


def main(argv: list[str]) -> int:
    if argv[1:2] == ["versions"]:
        for name, row in write_versions().items():
            drift = "" if row["pinned"] == row["newest"] else "   <- newer served"
            versions = f"pinned {row['pinned']}  newest {row['newest']}"
            print(f"{name:<9} {row['package']:<32} {versions}{drift}")
        return 0
    if argv[1:2] == ["install"]:
        problem = install()
        if problem:
            print(f"SKIP: {problem}")
        return 0
    for name in CLI_NAMES:
        cli = find_cli(name)
        if cli.ok:
            print(f"{name}: {cli.version} ({cli.package}@{cli.pinned}) at {cli.path}")
        else:
            print(f"{name}: SKIP: {cli.missing}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
