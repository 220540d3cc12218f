"""Third-party adapters registered under the `execkit.adapters` entry-point group."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from adapters import CodexAdapter
from execkit import Adapter, AgentRequest, adapter_names, available_adapters, get_adapter
from execkit._errors import InvalidInput, UnknownAdapter


def install_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry_points: str) -> None:
    """A real distribution on sys.path: a module plus a dist-info with entry_points.txt."""
    (tmp_path / "acme_adapter.py").write_text(
        textwrap.dedent(
            """
            import attrs
            from execkit import map_result

            @attrs.frozen
            class AcmeAdapter:
                name: str = "acme"
                binary: str = "acme"
                install_hint: str = "pip install acme-cli"
                login_hint: str | None = None

                def build_argv(self, request):
                    return [self.binary, request.prompt]

                def parse(self, result):
                    return map_result(self, result)

            INSTANCE = AcmeAdapter(name="acme-instance")
            NOT_AN_ADAPTER = object()

            def broken():
                raise RuntimeError("cannot import the vendor SDK")
            """
        )
    )
    dist = tmp_path / "acme_adapter-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-adapter\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[execkit.adapters]\n" + entry_points)
    monkeypatch.syspath_prepend(str(tmp_path))


def test_registered_adapter_is_found_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install_plugin(
        tmp_path,
        monkeypatch,
        "acme = acme_adapter:AcmeAdapter\n"
        "acme-instance = acme_adapter:INSTANCE\n"
        "bogus = acme_adapter:NOT_AN_ADAPTER\n"
        "broken = acme_adapter:broken\n"
        "codex = acme_adapter:AcmeAdapter\n",
    )
    assert {"acme", "acme-instance", "bogus", "broken", "codex"} <= set(adapter_names())
    acme = get_adapter("acme")
    assert isinstance(acme, Adapter)
    assert acme.build_argv(AgentRequest(prompt="hi")) == ["acme", "hi"]
    assert get_adapter("acme-instance").name == "acme-instance"
    # A plugin cannot replace a built-in.
    assert isinstance(get_adapter("codex"), CodexAdapter)
    with pytest.raises(InvalidInput, match=r"bogus.*does not provide"):
        get_adapter("bogus")
    with pytest.raises(InvalidInput, match=r"broken.*cannot import the vendor SDK"):
        get_adapter("broken")
    # Broken plugins are skipped by available(), not fatal.
    assert {"acme", "codex"} <= {a.name for a in available_adapters()}
    with pytest.raises(UnknownAdapter, match="acme"):
        get_adapter("zzz")
