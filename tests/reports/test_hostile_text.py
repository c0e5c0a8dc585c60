"""Hostile text in a record stays inert in every report, malformed records are refused with the
field's path, and a huge message is kept once, in full, in the JSON only.

The record is a real small audit (fixed seed 5, 2000 steps of ``v2-tilted``: the reference,
LOSSLESS, and ``residual_is_target``, LOSSY, so that every section of every report is
rendered), in which every free-text field (target names, descriptions, errors, messages, case
ids and summaries, replay lines, environment keys and values, strings inside details) is then
prefixed with :data:`PAYLOAD`: a Markdown image badge and link, a table pipe, a
``<script>`` element, an entity, rich markup (``[/]`` alone used to crash rich), ANSI colour
escapes, NUL and other control characters, a line break, a bidirectional override, matplotlib
mathtext and a bare autolink.
"""

from __future__ import annotations

import io
import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from markdown_it import MarkdownIt
from rich.console import Console

from losslessness.adapters.base import Adapter
from losslessness.cli import main
from losslessness.config import AuditConfig, RunConfig
from losslessness.engine import ShardSpec, plan_run, run_audit, run_shard, save_shard
from losslessness.records import RecordError
from losslessness.results import MESSAGE_LIMIT, AuditResult, Verdict
from losslessness.targets import resolve_adapter
from reports import (
    audit_from_dict,
    audit_to_dict,
    print_audit,
    read_json,
    render_html,
    render_junit,
    render_markdown,
    write_json,
    write_reports,
)
from tests.wrong_verifiers import residual_is_target

PAYLOAD = (
    "![LOSSLESS](https://img.shields.io/badge/audit-LOSSLESS-green) [docs](https://evil.example)"
    " | cell | <script>alert(1)</script> &amp; `tick` *em* ~~del~~ [bold]rich[/bold] [/]"
    " \x1b[31mred\x1b[0m \x00\x07\x7f\x9b \r\n\t \u202e\udc80 $\\frac$ www.evil.example"
)
"""What a hostile target (or record) puts in every text field."""

SEEN = (
    "![LOSSLESS](https://img.shields.io/badge/audit-LOSSLESS-green) [docs](https://evil.example)"
    " | cell | <script>alert(1)</script> &amp; `tick` *em* ~~del~~ [bold]rich[/bold] [/]"
    r" \x1b[31mred\x1b[0m \x00\x07\x7f\x9b \r\n\t \u202e\udc80 $\frac$ www.evil.example"
)
"""What a reader sees of :data:`PAYLOAD` in every format: the same characters, the control
ones written as escapes."""

RAW_CONTROLS = ("\x00", "\x07", "\x1b", "\x7f", "\x9b", "\u202e", "\udc80", "\r")
"""Characters of :data:`PAYLOAD` that must never reach an output file or a terminal raw."""

_ENUM_FIELDS = frozenset({"schema_version", "verdict", "kind"})


def _poison(value: Any, key: str = "") -> Any:
    """``value`` (a JSON record or part of one) with :data:`PAYLOAD` before every free-text
    string; enums and the config (validated values) are left as they are."""
    if isinstance(value, dict):
        return {
            (PAYLOAD + name if key == "environment" else name): (
                item if name == "config" else _poison(item, name)
            )
            for name, item in value.items()
        }
    if isinstance(value, list):
        return [_poison(item, key) for item in value]
    if isinstance(value, str) and key not in _ENUM_FIELDS:
        return f"{PAYLOAD} {value}"
    return value


@pytest.fixture(scope="module")
def audit() -> AuditResult:
    targets = [
        resolve_adapter("reference"),
        Adapter("residual_is_target", "wrong residual", chain=residual_is_target),
    ]
    return run_audit(
        targets, AuditConfig(cases=("v2-tilted",), seed=5, steps=2000, early_stop=False)
    )


@pytest.fixture(scope="module")
def hostile(audit: AuditResult) -> AuditResult:
    record = _poison(audit_to_dict(audit))
    record["targets"][0]["error"] = f"{PAYLOAD} could not load"
    record["targets"][1]["stopped_early"] = f"{PAYLOAD} stopped"
    record["config"]["cases"] = [PAYLOAD, *record["config"]["cases"]]
    return audit_from_dict(record)


class _Collect(HTMLParser):
    """Tags (with attributes), their text and the cells of every table row."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.rows: list[int] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag == "tr":
            self.rows.append(0)
        elif tag in ("td", "th"):
            self.rows[-1] += 1

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _collect(html: str) -> _Collect:
    parser = _Collect()
    parser.feed(html)
    parser.close()
    return parser


def _assert_no_raw_controls(text: str) -> None:
    for character in RAW_CONTROLS:
        assert character not in text, repr(character)


def test_markdown_renders_hostile_text_as_literal_text_in_intact_tables(
    hostile: AuditResult,
) -> None:
    """report.md, rendered as GitHub does (CommonMark with tables and strikethrough), shows the
    payload character for character as text: no image, link, script, emphasis, strikethrough
    or code element comes from it, every table row keeps its header's number of cells (a ``|``
    in a name or message never adds one), and the file holds no raw control character."""
    markdown = render_markdown(hostile)
    _assert_no_raw_controls(markdown)
    html = MarkdownIt("commonmark").enable(["table", "strikethrough"]).render(markdown)
    parsed = _collect(html)
    tags = {tag for tag, _ in parsed.tags}
    assert tags <= {"h1", "h2", "p", "strong", "table", "thead", "tbody", "tr", "th", "td"} | {
        "code", "ul", "li"
    }, tags
    assert len(set(parsed.rows)) == 2, parsed.rows  # the verdict table and the failures table
    assert parsed.rows.count(7) >= 2  # the failures table: header and at least one row
    text = "".join(parsed.text)
    assert text.count(SEEN) >= 4  # names, messages, case ids, environment


def test_html_report_shows_hostile_text_as_escaped_text_only(hostile: AuditResult) -> None:
    """report.html has no element or attribute from the payload (jinja2 autoescape is on: the
    only links are the page's own anchors, the only images the figures' data URIs), shows it
    as text with its control characters as escapes, and holds no raw control character; the
    figures render a name with mathtext in it."""
    html = render_html(hostile)
    _assert_no_raw_controls(html)
    assert "<script" not in html.lower()
    parsed = _collect(html)
    assert "script" not in {tag for tag, _ in parsed.tags}
    for tag, attrs in parsed.tags:
        if tag == "a":
            assert (attrs["href"] or "").startswith("#target-")
        if tag == "img":
            assert (attrs["src"] or "").startswith("data:image/png;base64,")
    assert "".join(parsed.text).count(SEEN) >= 4


def test_terminal_prints_hostile_text_literally_with_control_characters_visible(
    hostile: AuditResult,
) -> None:
    """print_audit prints the payload as written: rich markup in it (``[bold]``, a lone
    ``[/]``) is not interpreted, and no ANSI escape or other control character reaches the
    terminal raw."""
    buffer = io.StringIO()
    print_audit(hostile, Console(file=buffer, width=100_000, color_system=None))
    output = buffer.getvalue()
    _assert_no_raw_controls(output)
    assert output.count(SEEN) >= 3


def test_junit_keeps_hostile_text_as_xml_text(hostile: AuditResult) -> None:
    """junit.xml parses, holds no raw control character, and gives the payload back as
    attribute text."""
    xml = render_junit(hostile)
    assert "<script" not in xml
    _assert_no_raw_controls(xml)
    root = ET.fromstring(xml)
    messages = [element.get("message") or "" for element in root.iter("failure")]
    assert messages and all("<script>alert(1)</script>" in message for message in messages)


def test_hostile_record_round_trips_and_its_reports_are_written(
    hostile: AuditResult, tmp_path: Path
) -> None:
    """The poisoned record is a valid record: written and read back unchanged (the escaping is
    the renderers', never the record's), and its four reports are written as UTF-8 (an
    unpaired surrogate in a name does not stop them)."""
    paths = write_reports(hostile, tmp_path / "out")
    assert audit_to_dict(read_json(paths["json"])) == audit_to_dict(hostile)
    for name in ("html", "markdown", "junit"):
        _assert_no_raw_controls(paths[name].read_text(encoding="utf-8"))


def _edit(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set (or, for ``...``, delete) the field at ``path`` (``targets.1.checks.3.p_value``)."""

    def edit(record: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = record
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        where: Any = int(last) if isinstance(node, list) else last
        if value is ...:
            del node[where]
        else:
            node[where] = value

    return edit


MALFORMED = [
    ("a wrong type", _edit("targets.1.checks.3.p_value", "abc"),
     "targets[1].checks[3].p_value: expected a number, got 'abc'"),
    ("a missing field", _edit("targets.0.checks.0.seed", ...),
     "targets[0].checks[0].seed: missing"),
    ("null for a string", _edit("targets.0.name", None),
     "targets[0].name: expected a string, got null"),
    ("true for an integer", _edit("n_assertions", True),
     "n_assertions: expected a 64-bit integer, got True"),
    ("an unknown verdict", _edit("targets.0.verdict", "GREAT"),
     "targets[0].verdict: expected one of 'LOSSLESS'"),
    ("an array for an object", _edit("environment", [1]), "environment: expected an object"),
    ("an unknown field", _edit("targets.0.colour", "red"),
     "targets[0]: unknown field 'colour' of TargetResult"),
    ("cells of different lengths", _edit("targets.0.checks.1.cells.p", []),
     "targets[0].checks[1].cells.tokens, observed and p"),
    ("a design out of range", _edit("config.tv", 5), "config.tv: must lie in (0, 1]"),
    ("an integer beyond int64", _edit("targets.0.checks.1.cells.observed.0", 2**64),
     "targets[0].checks[1].cells.observed[0]: expected a 64-bit integer, got 18446744073709551616"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "edit", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_report_refuses_a_malformed_record_naming_the_field(
    audit: AuditResult,
    tmp_path: Path,
    what: str,
    edit: Callable[[dict[str, Any]], None],
    message: str,
) -> None:
    """``losslessness report`` on a record with {what} exits 2 (a usage error, no traceback)
    with a message naming the field's path and what was wrong."""
    record = audit_to_dict(audit)
    assert record["targets"][0]["checks"][1]["cells"] is not None
    edit(record)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(record))
    result = CliRunner().invoke(main, ["report", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{nope", "Expecting property name"),
        ("[1, 2]", "the record: expected an object, got list"),
        ('"LOSSLESS"', "the record: expected an object, got str"),
        ('{"schema_version": "4", "n_assertions": NaN}', "not strict JSON: NaN"),
        ('{"schema_version": "1"}', "schema_version: expected one of"),
    ],
    ids=["not JSON", "an array", "a string", "NaN", "another version"],
)
def test_report_refuses_a_file_that_is_not_a_record(
    tmp_path: Path, text: str, message: str
) -> None:
    """``losslessness report`` on a file that is not JSON, not an object, not strict JSON or of
    an unknown schema version exits 2 saying so."""
    path = tmp_path / "bad.json"
    path.write_text(text)
    result = CliRunner().invoke(main, ["report", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_a_refused_record_is_quoted_briefly_with_its_control_characters_escaped(
    audit: AuditResult,
) -> None:
    """A 2 MB wrong-typed value with an ANSI escape is quoted in the error in a few dozen
    characters, its escape written as ``\\x1b``."""
    record = audit_to_dict(audit)
    record["targets"][0]["verify_steps"] = "\x1b[31m" + "x" * 2_000_000
    with pytest.raises(RecordError) as caught:
        audit_from_dict(record)
    text = str(caught.value)
    assert text.startswith("targets[0].verify_steps: expected a 64-bit integer, got '\\x1b[31m")
    assert len(text) < 200


def test_merge_refuses_a_shard_with_a_malformed_unit_naming_the_field(tmp_path: Path) -> None:
    """``losslessness merge`` of a shard file whose unit record has a wrong-typed check field
    exits 2 naming the file and the field's path."""
    config = RunConfig(cases=("greedy-v8-ties",), chunk_steps=64, seed=3, early_stop=False)
    plan = plan_run(config, [resolve_adapter("reference")])
    path = save_shard(run_shard(plan, ShardSpec(0, 1), tmp_path), tmp_path / "s.npz")
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    meta = json.loads(str(arrays["meta"][()]))
    unit = next(i for i, unit in enumerate(meta["units"]) if unit["checks"])
    meta["units"][unit]["checks"][0]["n"] = "many"
    arrays["meta"] = np.array(json.dumps(meta))
    np.savez_compressed(path, **arrays)
    result = CliRunner().invoke(main, ["merge", str(path), "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert f"units[{unit}].checks[0].n: expected a 64-bit integer, got 'many'" in " ".join(
        result.output.split()
    )


MIDDLE = "MIDDLE-OF-THE-HUGE-MESSAGE"


def _huge_failure(*args: object, **kwargs: object) -> torch.Tensor:
    raise RuntimeError("begin " + "x" * 1_000_000 + MIDDLE + "y" * 1_000_000 + " end")


def test_a_2_mb_exception_message_is_kept_once_in_full_and_shown_shortened(
    tmp_path: Path,
) -> None:
    """A target whose every call raises a 2 MB message, over three chain cases and one greedy
    case (13 checks that repeat its failure): report.json is under 2.5 MB and holds the full
    text exactly once (the target's ``full_messages``, under the key its checks' messages
    name), every check's message is at most a few hundred characters saying how many were
    left out, report.html is under 1 MB and report.md, junit.xml and the terminal output are
    small."""
    target = Adapter(
        "huge-message", "raises 2 MB", chain=_huge_failure, greedy=_huge_failure
    )
    config = AuditConfig(cases=("v2-tilted", "v8-far", "edge-disjoint", "greedy-v8-ties"))
    result = run_audit([target], config)
    (audited,) = result.targets
    assert len(audited.checks) >= 10
    assert all(check.verdict is Verdict.ERROR for check in audited.checks if check.n == 0)
    ((key, full),) = audited.full_messages.items()
    assert len(full) > 2_000_000 and MIDDLE in full
    for check in audited.checks:
        if check.message.startswith("target raised"):
            assert len(check.message) < MESSAGE_LIMIT + 200
            assert f"{len(full) - MESSAGE_LIMIT} more characters" in check.message
            assert key in check.message
            assert check.message.endswith(full[-50:])
    path = tmp_path / "report.json"
    write_json(result, path)
    text = path.read_text()
    assert len(text.encode()) < 2_500_000
    assert text.count(MIDDLE) == 1
    assert read_json(path).targets[0].full_messages == {key: full}
    html = render_html(result)
    assert len(html.encode()) < 1_000_000 and MIDDLE not in html
    assert len(render_markdown(result).encode()) < 100_000
    assert len(render_junit(result).encode()) < 200_000
    buffer = io.StringIO()
    print_audit(result, Console(file=buffer, width=200))
    assert len(buffer.getvalue()) < 100_000
