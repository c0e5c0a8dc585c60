"""Fixtures of the end-to-end tests."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _server_logs_in_the_tests_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Servers' default logs go under the test's ``tmp_path`` (pytest prunes old ones), in this
    process and in the processes it starts: the logs kept because an error named them, or
    because their process was killed outright (the tests provoke both), stay out of /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("TMPDIR", str(tmp_path))
