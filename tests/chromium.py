"""A Chromium for the dashboard's browser tests: found where one is, else installed.

    python tests/chromium.py find       print the Chromium the tests use (exit 1: none)
    python tests/chromium.py ensure     find one, else install one (what `make unit` runs)
    python tests/chromium.py install-npm DIR
                                        install the npm package's Chromium into DIR (a test
                                        of that route on a machine that has a Chromium)

`find_chromium` takes the first runnable one of, in this order:

1. `$EXECKIT_CHROMIUM` (a path, or a name looked up on PATH). When it is set and names
   nothing runnable nothing else is tried: a mistyped choice must not quietly test another
   browser.
2. On PATH: `chromium`, `chromium-browser`, `google-chrome-stable`, `google-chrome`.
3. Where a package puts one when PATH lacks it (make under cron or sudo's secure_path):
   `/usr/bin/chromium`, `/usr/bin/chromium-browser`, `/usr/bin/google-chrome-stable`,
   `/usr/bin/google-chrome`, `/snap/bin/chromium`.
4. Playwright's own browsers, when something else downloaded them
   (`$PLAYWRIGHT_BROWSERS_PATH`, else `~/.cache/ms-playwright`): `chromium-N`, then
   `chromium_headless_shell-N`, the highest N first. Playwright's download itself is never
   used: this machine's network does not reach it.
5. The copy `ensure` installs without root: `<venv>/chromium/chromium`.

`ensure`, when none is found (each is checked to run: `--version` answers):

- as root with `apt-get`: Debian's `chromium`, waiting up to `APT_LOCK_WAIT_S` for the
  dpkg lock another process holds (`-o DPkg::Lock::Timeout`), and, when the package lists
  do not know it yet, `apt-get update` first, retried while another process holds the
  lists' lock (which that option does not cover);
- otherwise, or when that fails, with `npm`: the Chromium the npm package
  `@sparticuz/chromium` ships inside itself (a headless build for servers, with the NSS
  libraries it needs), fetched with `npm pack` at a pinned version, checked against its
  pinned sha512, and unpacked (brotli, by node's zlib) into `<venv>/chromium` behind a
  small wrapper script; no root, nothing outside the venv;
- with neither: it says how to get one and exits 0, and the browser tests skip; under
  `CI=true` it exits 1, since CI never skips them.

Every step has its seams (the environment, `which`, the command runner, the places), so
tests/test_chromium.py checks the order and the commands without a browser or a registry.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

ENV_VAR = "EXECKIT_CHROMIUM"
NAMES = ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome")
PLACES = (
    Path("/usr/bin/chromium"),
    Path("/usr/bin/chromium-browser"),
    Path("/usr/bin/google-chrome-stable"),
    Path("/usr/bin/google-chrome"),
    Path("/snap/bin/chromium"),
)
# The npm package and the exact tarball: a newer release is taken by changing both here.
NPM_PACKAGE = "@sparticuz/chromium@153.0.0"
NPM_SHA512 = (
    "sha512-jiGWqSvPMdu4+P9TilYqAR7yEGPEHINx+lCvE/"
    "NqNO/EHYzF/x1hUiI5T6ioVIt7dEy7n88byyT0vk+dnsgQwA=="
)
# The dpkg lock: another apt run (an unattended upgrade, a second `make test`) may hold it
# for minutes; `apt-get` without a timeout fails at once.
APT_LOCK_WAIT_S = 600
# `apt-get update` ignores that timeout for the lists' lock: it is retried instead.
APT_UPDATE_TRIES = 60
APT_UPDATE_PAUSE_S = 10.0
VERSION_TIMEOUT_S = 60.0
# apt-get waits for the lock first, then downloads; npm pack fetches about 70 MB.
INSTALL_TIMEOUT_S = APT_LOCK_WAIT_S + 1200.0

# A command and the seconds it may take: what `subprocess.run` answers (tests pass a fake).
Run = Callable[[Sequence[str], float], "subprocess.CompletedProcess[str]"]
Which = Callable[[str], "str | None"]


def default_venv() -> Path:
    """The virtual environment this interpreter runs in (`make`'s `.venv`)."""
    return Path(sys.prefix)


def installed_wrapper(venv: Path) -> Path:
    """Where `ensure` puts the Chromium it installs without root."""
    return venv / "chromium" / "chromium"


def playwright_cache(env: Mapping[str, str], home: Path) -> Path:
    given = env.get("PLAYWRIGHT_BROWSERS_PATH")
    return Path(given) if given and given != "0" else home / ".cache" / "ms-playwright"


def _revision(folder: Path) -> int:
    tail = folder.name.rpartition("-")[2]
    return int(tail) if tail.isdigit() else -1


def _playwright_builds(cache: Path) -> list[Path]:
    """Playwright's Chromium builds in `cache`, full builds before headless shells, the
    highest revision first."""
    found: list[Path] = []
    for prefix, program in (
        ("chromium-", "chrome"),
        ("chromium_headless_shell-", "headless_shell"),
    ):
        try:
            folders = [f for f in cache.iterdir() if f.name.startswith(prefix)]
        except OSError:
            continue
        for folder in sorted(folders, key=_revision, reverse=True):
            # chrome-linux/ until Playwright 1.5x, chrome-linux64/ (or -arm64) since.
            found += sorted(folder.glob(f"chrome*-linux*/{program}"))
            found += sorted(folder.glob(f"chrome-linux/{program}"))
    return list(dict.fromkeys(found))


def candidates(
    env: Mapping[str, str],
    which: Which,
    *,
    home: Path,
    venv: Path,
    places: Sequence[Path] = PLACES,
) -> list[Path]:
    """Every place a Chromium may be, in the order `find_chromium` tries them (without
    `$EXECKIT_CHROMIUM`, which is tried alone)."""
    found: list[Path] = []
    for name in NAMES:
        hit = which(name)
        if hit:
            found.append(Path(hit))
    found += places
    found += _playwright_builds(playwright_cache(env, home))
    found.append(installed_wrapper(venv))
    return list(dict.fromkeys(found))


def is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def answers_version(path: Path, run: Run | None = None) -> bool:
    """Whether `path --version` runs and exits 0 (a Chromium whose libraries are missing
    is executable but does not start)."""
    if not is_executable(path):
        return False
    runner = run or _run
    try:
        done = runner([str(path), "--version"], VERSION_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def find_chromium(
    env: Mapping[str, str] | None = None,
    which: Which = shutil.which,
    *,
    home: Path | None = None,
    venv: Path | None = None,
    places: Sequence[Path] = PLACES,
    usable: Callable[[Path], bool] = is_executable,
) -> Path | None:
    """The first usable Chromium in the order the module docstring gives, or None."""
    env = os.environ if env is None else env
    explicit = env.get(ENV_VAR)
    if explicit:
        named = Path(explicit) if os.sep in explicit else Path(which(explicit) or explicit)
        return named if usable(named) else None
    for path in candidates(
        env,
        which,
        home=Path.home() if home is None else home,
        venv=default_venv() if venv is None else venv,
        places=places,
    ):
        if usable(path):
            return path
    return None


# -- installing ------------------------------------------------------------------------


def _run(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)


def apt_install(run: Run, sleep: Callable[[float], None], say: Callable[[str], None]) -> bool:
    """Debian's chromium through apt-get (as root): True once installed."""
    install = [
        "apt-get",
        "-o",
        f"DPkg::Lock::Timeout={APT_LOCK_WAIT_S}",
        "install",
        "-y",
        "--no-install-recommends",
        "chromium",
    ]
    say("installing Debian's chromium (apt-get; waits for the apt lock when it is held)")
    if run(install, INSTALL_TIMEOUT_S).returncode == 0:
        return True
    # A fresh machine's package lists may not know the package yet.
    for _ in range(APT_UPDATE_TRIES):
        updated = run(["apt-get", "update"], INSTALL_TIMEOUT_S)
        if updated.returncode == 0:
            break
        if "lock" not in (updated.stderr or "").lower():
            say(f"apt-get update failed: {(updated.stderr or '').strip()[-500:]}")
            return False
        sleep(APT_UPDATE_PAUSE_S)  # another process holds the lists' lock
    else:
        say("apt-get update: the package lists stayed locked by another process")
        return False
    done = run(install, INSTALL_TIMEOUT_S)
    if done.returncode != 0:
        say(f"apt-get install chromium failed: {(done.stderr or '').strip()[-500:]}")
    return done.returncode == 0


def _sha512(data: bytes) -> str:
    return "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode("ascii")


def _extract(archive: tarfile.TarFile, into: Path, strip: str = "") -> None:
    """The regular files and folders of `archive` under `into` (less the `strip` prefix):
    nothing outside `into`, no links, no devices."""
    root = into.resolve()
    for member in archive.getmembers():
        name = member.name.removeprefix("./")
        if strip:
            if not name.startswith(strip):
                continue
            name = name[len(strip) :]
        if not name:
            continue
        target = (into / name).resolve()
        if root not in target.parents:
            raise RuntimeError(f"{member.name}: outside the folder it is unpacked into")
        if member.isdir():
            target.mkdir(parents=True, exist_ok=True)
        elif member.isfile():
            target.parent.mkdir(parents=True, exist_ok=True)
            source = archive.extractfile(member)
            assert source is not None
            target.write_bytes(source.read())
            target.chmod(0o755 if member.mode & 0o111 else 0o644)


_UNBROTLI = (
    "const fs = require('fs'), zlib = require('zlib');"
    "const [source, target] = process.argv.slice(1);"
    "fs.writeFileSync(target, zlib.brotliDecompressSync(fs.readFileSync(source)));"
)

_WRAPPER = """#!/bin/sh
# The Chromium of the npm package {package}, unpacked by tests/chromium.py: its own NSS
# libraries first on the library path, its fonts beside the system's.
LD_LIBRARY_PATH="{folder}/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
FONTCONFIG_FILE="{folder}/fonts.conf"
export LD_LIBRARY_PATH FONTCONFIG_FILE
exec "{folder}/chromium-bin" "$@"
"""

_FONTS_CONF = """<?xml version="1.0"?>
<!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig>
  <include ignore_missing="yes">/etc/fonts/fonts.conf</include>
  <dir>{folder}/fonts</dir>
  <cachedir>{folder}/fonts-cache</cachedir>
</fontconfig>
"""


def npm_install(
    folder: Path,
    run: Run,
    say: Callable[[str], None],
    *,
    package: str | None = None,
    sha512: str | None = None,
) -> Path | None:
    """The npm package's Chromium (`NPM_PACKAGE`, checked against `NPM_SHA512`, unless
    given) unpacked into `folder` (replaced whole, or left as it was on failure); its
    wrapper script, or None (said why)."""
    package = NPM_PACKAGE if package is None else package
    sha512 = NPM_SHA512 if sha512 is None else sha512
    say(f"installing the Chromium of the npm package {package} into {folder} (no root needed)")
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        return _npm_install(folder, run, say, package, sha512)
    except (OSError, RuntimeError, tarfile.TarError) as exc:
        say(f"installing {package} failed: {exc}")
        return None


def _npm_install(
    folder: Path, run: Run, say: Callable[[str], None], package: str, sha512: str
) -> Path | None:
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".chromium-") as scratch:
        work = Path(scratch)
        argv = ["npm", "pack", "--silent", "--pack-destination", str(work), package]
        packed = run(argv, INSTALL_TIMEOUT_S)
        tarballs = sorted(work.glob("*.tgz"))
        if packed.returncode != 0 or len(tarballs) != 1:
            say(f"npm pack {package} failed: {(packed.stderr or '').strip()[-500:]}")
            return None
        data = tarballs[0].read_bytes()
        if _sha512(data) != sha512:
            say(f"npm pack {package}: the tarball is not the pinned one ({_sha512(data)})")
            return None
        unpacked = work / "package"
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
            _extract(archive, unpacked, strip="package/")
        made = work / "chromium"
        made.mkdir()
        parts = {"chromium.br": made / "chromium-bin", "al2023.tar.br": work / "libs.tar"}
        parts["fonts.tar.br"] = work / "fonts.tar"
        for name, out in parts.items():
            source = unpacked / "bin" / name
            if not source.is_file():
                if name == "chromium.br":
                    say(f"{package} ships no bin/chromium.br (another layout?)")
                    return None
                continue
            done = run(["node", "-e", _UNBROTLI, str(source), str(out)], INSTALL_TIMEOUT_S)
            if done.returncode != 0:
                say(f"unpacking {name} with node failed: {(done.stderr or '').strip()[-500:]}")
                return None
        (made / "chromium-bin").chmod(0o755)
        for tar_name in ("libs.tar", "fonts.tar"):  # lib/*.so; fonts/ (and a fonts.conf)
            if (work / tar_name).is_file():
                with tarfile.open(work / tar_name) as archive:
                    _extract(archive, made)
        (made / "fonts").mkdir(exist_ok=True)
        (made / "fonts.conf").write_text(_FONTS_CONF.format(folder=folder))
        wrapper = made / "chromium"
        wrapper.write_text(_WRAPPER.format(package=package, folder=folder))
        wrapper.chmod(0o755)
        # The folder appears whole or not at all: a wrapper found means an install done.
        old = work / "old"
        if folder.exists():
            folder.rename(old)
        made.rename(folder)
    return folder / "chromium"


def ensure(
    env: Mapping[str, str] | None = None,
    *,
    run: Run = _run,
    which: Which = shutil.which,
    is_root: bool | None = None,
    venv: Path | None = None,
    home: Path | None = None,
    places: Sequence[Path] = PLACES,
    sleep: Callable[[float], None] | None = None,
    say: Callable[[str], None] = print,
) -> Path | None:
    """A Chromium that answers `--version`: found, else installed as the module docstring
    says; None when there is none to be had (said why)."""
    import time

    env = os.environ if env is None else env
    venv = default_venv() if venv is None else venv
    root = os.geteuid() == 0 if is_root is None else is_root

    def usable(path: Path) -> bool:
        return answers_version(path, run)

    def look() -> Path | None:
        return find_chromium(env, which, home=home, venv=venv, places=places, usable=usable)

    found = look()
    if found is not None or env.get(ENV_VAR):
        if found is None:
            say(f"${ENV_VAR}={env[ENV_VAR]} does not run (`--version` failed)")
        return found
    if root and which("apt-get") and apt_install(run, sleep or time.sleep, say):
        found = look()
        if found is not None:
            return found
    if which("npm") and which("node"):
        wrapper = npm_install(installed_wrapper(venv).parent, run, say)
        if wrapper is not None and usable(wrapper):
            return wrapper
        if wrapper is not None:
            say(f"{wrapper} was installed but does not run (`--version` failed)")
        return None
    say(
        "no Chromium found, and none can be installed here: "
        + ("" if root else "not root (for apt-get), ")
        + "no npm. Install one (`apt-get install chromium`), or name one in "
        f"${ENV_VAR}; until then the dashboard's browser tests skip."
    )
    return None


def main(argv: Sequence[str]) -> int:
    command = argv[0] if argv else ""
    if command == "find" and len(argv) == 1:
        found = find_chromium()
        if found is None:
            print("no Chromium found (python tests/chromium.py ensure installs one)")
            return 1
        print(found)
        return 0
    if command == "ensure" and len(argv) == 1:
        ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
        found = ensure(say=lambda line: print(f"chromium: {line}", flush=True))
        if found is not None:
            print(f"chromium: the dashboard's browser tests use {found}")
            return 0
        return 1 if ci else 0
    if command == "install-npm" and len(argv) == 2:
        wrapper = npm_install(Path(argv[1]).resolve(), _run, print)
        if wrapper is None or not answers_version(wrapper):
            return 1
        print(wrapper)
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
