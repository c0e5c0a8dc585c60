"""``losslessness list`` names, for each engine adapter, the installed version of the package
it wraps (vllm, sglang, flashinfer-python, transformers) or "not installed", read from the
package metadata without importing the engine (issue 12, item 4)."""

from __future__ import annotations

import sys
from importlib import metadata

import pytest
from click.testing import CliRunner

from losslessness.cli import main
from losslessness.commands import list as list_module
from losslessness.commands.list import engine_distribution, engine_version

FAKE_VERSIONS = {"vllm": "9.9.9", "transformers": "8.8.8"}


def _fake_version(distribution: str) -> str:
    if distribution in FAKE_VERSIONS:
        return FAKE_VERSIONS[distribution]
    raise metadata.PackageNotFoundError(distribution)


def test_engine_distribution_maps_adapter_modules_to_their_engine_package() -> None:
    """The built-in engine adapters map to their PyPI distributions; others to None."""
    assert engine_distribution("losslessness.adapters.vllm:v2_block_adapter") == "vllm"
    assert engine_distribution("losslessness.adapters.sglang:block_adapter") == "sglang"
    assert engine_distribution("losslessness.adapters.flashinfer:adapter") == "flashinfer-python"
    assert engine_distribution("losslessness.adapters.transformers_cuda:adapter") == "transformers"
    assert engine_distribution("losslessness.adapters.reference:adapter") is None
    assert engine_distribution("thirdparty.engine:adapter") is None


def test_engine_version_reads_metadata_or_says_not_installed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An installed distribution gives 'name version', a missing one 'name not installed'."""
    monkeypatch.setattr(list_module.metadata, "version", _fake_version)
    assert engine_version("vllm") == "vllm 9.9.9"
    assert engine_version("sglang") == "sglang not installed"


def test_list_shows_each_engine_adapters_installed_version_without_importing_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The adapters table has the installed version on every vllm* and transformers* row and
    'not installed' on sglang* and flashinfer rows, and listing imports no engine."""
    monkeypatch.setattr(list_module.metadata, "version", _fake_version)
    monkeypatch.setenv("COLUMNS", "250")
    engines = ("vllm", "sglang", "flashinfer")
    before = {name for name in engines if name in sys.modules}
    result = CliRunner().invoke(main, ["list"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    rows = {
        line.split("│")[1].strip(): line
        for line in result.output.splitlines()
        if "losslessness.adapters." in line and line.count("│") >= 4
    }
    assert "vllm 9.9.9" in rows["vllm"] and "vllm 9.9.9" in rows["vllm-v2-block"]
    assert "transformers 8.8.8" in rows["transformers"]
    assert "sglang not installed" in rows["sglang-block"]
    assert "flashinfer-python not installed" in rows["flashinfer"]
    assert "not installed" not in rows["reference"] and "9.9.9" not in rows["reference"]
    assert {name for name in engines if name in sys.modules} == before
