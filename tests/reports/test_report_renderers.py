"""Report renderers: the HTML is well-formed, self-contained and escapes every text from a
target; JUnit XML has one test case per check with the right failure/error/skipped counts;
the Markdown summary carries the verdicts within GitHub's step-summary limit; report.json
round-trips; trends flag new failures and power drops and nothing in a steady history; the
law and acceptance details the figures need are in the records, bounded in size.

The audit behind the reports is real and small (fixed seed 11, 3000 steps of one V=2 case and
one greedy case): the reference (LOSSLESS), ``residual_is_target`` (LOSSY at the law of
positions 0 and 1, p-values below 1e-10 at this seed), a target whose name and error message
contain ``<script>`` (ERROR) and an unavailable one.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from losslessness.adapters.base import Adapter
from losslessness.batteries import default_chain_battery
from losslessness.checks.conditional_law import LAW_CELLS_KEPT, law_cells
from losslessness.cli import main
from losslessness.config import AuditConfig
from losslessness.engine import run_audit
from losslessness.laws import chain_laws
from losslessness.results import AuditResult, CheckResult, LawCells, Verdict
from losslessness.targets import UnavailableTarget, resolve_adapter
from reports import (
    REPORT_FILES,
    STEP_SUMMARY_LIMIT,
    audit_from_dict,
    audit_to_dict,
    compute_trends,
    load_history,
    read_json,
    render_html,
    render_junit,
    render_markdown,
    write_json,
    write_reports,
)
from reports.figures import law_groups, report_figures
from tests.wrong_verifiers import residual_is_target

SCRIPT = "<script>alert(1)</script>"
CASES = ("v2-tilted", "greedy-v8-ties")


def _crashing_verifier(*args: object, **kwargs: object) -> torch.Tensor:
    raise RuntimeError(f"kernel failed {SCRIPT} \x1b[31m")


@pytest.fixture(scope="module")
def result() -> AuditResult:
    targets: list[Adapter | UnavailableTarget] = [
        resolve_adapter("reference"),
        Adapter("residual_is_target", "wrong residual", chain=residual_is_target),
        Adapter(SCRIPT, f"crashes {SCRIPT}", chain=_crashing_verifier),
        UnavailableTarget(f"missing{SCRIPT}", f"not installed {SCRIPT}"),
    ]
    # The fixed design: every planned step, so that the lossy target's every failing check
    # is in the record the renderers are tested on.
    return run_audit(targets, AuditConfig(cases=CASES, seed=11, steps=3000, early_stop=False))


@pytest.fixture(scope="module")
def written(result: AuditResult, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_reports(result, tmp_path_factory.mktemp("report"))


def _copy(result: AuditResult, started_at: str) -> AuditResult:
    return dataclasses.replace(audit_from_dict(audit_to_dict(result)), started_at=started_at)


def _edit_checks(run: AuditResult, edit: Callable[[CheckResult], None]) -> AuditResult:
    for target in run.targets:
        for check in target.checks:
            edit(check)
    return run


class _StrictHTML(HTMLParser):
    """Collects tags and fails on mis-nested or unclosed elements (void elements excepted)."""

    VOID = frozenset({"meta", "img", "br", "hr", "input", "link", "col", "wbr"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.doctype = ""

    def handle_decl(self, decl: str) -> None:
        self.doctype = decl

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1:]}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse_html(text: str) -> _StrictHTML:
    parser = _StrictHTML()
    parser.feed(text)
    parser.close()
    assert not parser.stack, f"unclosed elements: {parser.stack}"
    return parser


def test_html_report_is_well_formed_self_contained_with_figures_and_tables(
    written: dict[str, Path], result: AuditResult
) -> None:
    """report.html parses with every element closed, embeds its figures as PNG data URIs
    (QQ, acceptance, minimum detectable TV, law), has a verdict table and one check table per
    audited target, and loads nothing from outside (no scripts, stylesheets or remote
    images)."""
    parser = _parse_html(written["html"].read_text(encoding="utf-8"))
    assert parser.doctype.lower() == "doctype html"
    images = [attrs for tag, attrs in parser.tags if tag == "img"]
    assert len(images) >= 6
    for attrs in images:
        source = attrs["src"] or ""
        assert source.startswith("data:image/png;base64,")
        assert base64.b64decode(source.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    alts = {attrs["alt"] for attrs in images}
    assert {"p-value QQ plot", "acceptance rate vs sum min(p, q)"} <= alts
    assert any((alt or "").startswith("law: v2-tilted") for alt in alts)
    tags = [tag for tag, _ in parser.tags]
    audited = sum(target.error is None for target in result.targets)
    assert tags.count("table") >= 2 + audited  # summary, failing checks, one per target
    assert "script" not in tags and "link" not in tags
    text = " ".join(parser.text)
    for verdict in ("LOSSLESS", "LOSSY", "ERROR"):
        assert verdict in text
    assert f"{result.per_assertion_alpha:.3g}" in text


def test_html_escapes_target_name_description_and_error_message(written: dict[str, Path]) -> None:
    """A target named ``<script>...`` whose error message contains ``<script>`` comes out as
    text (entities), never as an element."""
    raw = written["html"].read_text(encoding="utf-8")
    assert "<script" not in raw.lower()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in raw
    parser = _parse_html(raw)
    text = "".join(parser.text)
    assert f"kernel failed {SCRIPT}" in text
    assert f"not installed {SCRIPT}" in text
    assert f"crashes {SCRIPT}" in text


# Elements and attributes junit-10.xsd allows (Jenkins xunit plugin, the JUnit schema CI
# systems validate against): https://github.com/jenkinsci/xunit-plugin, file
# src/main/resources/org/jenkinsci/plugins/xunit/types/model/xsd/junit-10.xsd
_JUNIT_CHILDREN = {
    "testsuites": {"testsuite"},
    "testsuite": {"testsuite", "properties", "testcase", "system-out", "system-err"},
    "properties": {"property"},
    "property": set(),
    "testcase": {"skipped", "error", "failure", "system-out", "system-err"},
    "failure": set(),
    "error": set(),
    "skipped": set(),
    "system-out": set(),
    "system-err": set(),
}
_JUNIT_ATTRIBUTES = {
    "testsuites": ({"name", "time", "tests", "failures", "errors"}, set()),
    "testsuite": (
        {"name", "tests", "failures", "errors", "group", "time", "skipped", "timestamp"}
        | {"hostname", "id", "package", "file", "log", "url"},
        {"name", "tests", "failures", "errors"},
    ),
    "property": ({"name", "value"}, {"name", "value"}),
    "testcase": ({"name", "time", "classname", "group"}, {"name"}),
    "failure": ({"type", "message"}, set()),
    "error": ({"type", "message"}, set()),
    "skipped": ({"type", "message"}, set()),
}
_SUREFIRE_TIME = re.compile(r"(([0-9]{0,3},)*[0-9]{3}|[0-9]{0,3})*(\.[0-9]*)?")


def _assert_junit_10_conformant(element: ET.Element) -> None:
    children = {child.tag for child in element}
    assert children <= _JUNIT_CHILDREN[element.tag], (element.tag, children)
    allowed, required = _JUNIT_ATTRIBUTES.get(element.tag, (set(), set()))
    assert required <= element.attrib.keys() <= allowed, (element.tag, element.attrib)
    if element.tag in ("testsuites", "testsuite") and "time" in element.attrib:
        assert _SUREFIRE_TIME.fullmatch(element.attrib["time"])
    for child in element:
        _assert_junit_10_conformant(child)


def test_junit_conforms_to_junit_10_xsd_with_one_testcase_per_check_and_counts(
    written: dict[str, Path], result: AuditResult
) -> None:
    """junit.xml parses (control characters of an error message included) and uses only the
    elements and attributes junit-10.xsd allows; each check is one test case with failure for
    LOSSY, error for ERROR, skipped for SKIPPED; an unavailable target is one skipped test
    case; suite totals match; every test case states seed, alpha, power and
    min_detectable_tv in its system-out, and every suite the run's design as properties."""
    root = ET.parse(written["junit"]).getroot()
    assert root.tag == "testsuites"
    _assert_junit_10_conformant(root)
    suites = root.findall("testsuite")
    assert len(suites) == len(result.targets)
    for suite, target in zip(suites, result.targets, strict=True):
        cases = suite.findall("testcase")
        verdicts = [check.verdict for check in target.checks]
        assert len(cases) == (len(verdicts) if target.error is None else 1)
        failures = sum(case.find("failure") is not None for case in cases)
        errors = sum(case.find("error") is not None for case in cases)
        skipped = sum(case.find("skipped") is not None for case in cases)
        assert failures == verdicts.count(Verdict.LOSSY) == int(suite.get("failures", -1))
        assert errors == verdicts.count(Verdict.ERROR) == int(suite.get("errors", -1))
        expected_skips = verdicts.count(Verdict.SKIPPED) + (target.error is not None)
        assert skipped == expected_skips == int(suite.get("skipped", -1))
        assert int(suite.get("tests", -1)) == len(cases)
        design = {p.get("name"): p.get("value") for p in suite.iter("property")}
        assert design["seed"] == "11" and design["target_verdict"] == target.verdict.value
        for case, check in zip(cases, target.checks, strict=False):
            lines = (case.findtext("system-out") or "").splitlines()
            numbers = dict(line.split("=", 1) for line in lines if "=" in line)
            assert numbers["seed"] == str(check.seed)
            assert float(numbers["min_detectable_tv"]) == check.min_detectable_tv
            assert {"alpha", "power", "p_value", "verdict"} <= numbers.keys()
    # residual_is_target: law at positions 0 and 1, and structure (a rejected draft emitted as
    # its own replacement, which the residual p allows and norm(max(0, p - q)) never does).
    assert int(root.get("failures", -1)) == 3
    crashed = suites[2].findall("testcase")
    assert crashed and all(case.find("error") is not None for case in crashed)
    assert "\\x1b" in (crashed[0].find("error").get("message") or "")  # type: ignore[union-attr]
    total = sum(len(suite.findall("testcase")) for suite in suites)
    assert int(root.get("tests", -1)) == total


def test_markdown_summary_has_verdicts_budget_and_failures_within_step_summary_limit(
    written: dict[str, Path], result: AuditResult
) -> None:
    """report.md names each target's verdict, the budget line and the failing checks with
    replay commands (record text Markdown-escaped: ``_`` as ``\\_``), ``<script>`` as entities,
    and is under GitHub's 1 MiB step-summary limit."""
    text = written["markdown"].read_text(encoding="utf-8")
    assert text.startswith("# losslessness audit: LOSSY")
    assert "| reference | **LOSSLESS** |" in text
    assert "| residual\\_is\\_target | **LOSSY** |" in text
    assert f"alpha {result.per_assertion_alpha:.3g} each" in text
    assert (
        "losslessness audit residual\\_is\\_target --seed 11 --case v2-tilted --only law"
        in text
    )
    assert "<script" not in text and "&lt;script&gt;" in text
    assert len(text.encode("utf-8")) < STEP_SUMMARY_LIMIT


def test_markdown_summary_is_cut_at_the_step_summary_limit(result: AuditResult) -> None:
    """Even a run with thousands of long-named targets yields at most 1 MiB of Markdown."""
    base = result.targets[0]
    many = [dataclasses.replace(base, name=f"{'x' * 230}{i}", checks=[]) for i in range(6000)]
    text = render_markdown(dataclasses.replace(result, targets=many))
    assert len(text.encode("utf-8")) <= STEP_SUMMARY_LIMIT
    assert text.rstrip().endswith("see report.html)")


def test_report_json_round_trips_with_figure_details(
    written: dict[str, Path], result: AuditResult
) -> None:
    """report.json reads back into the same record, law cell counts included."""
    again = read_json(written["json"])
    assert audit_to_dict(again) == audit_to_dict(result)
    law = next(c for c in again.targets[0].checks if c.check_id == "law" and c.n > 0)
    assert law.cells is not None
    assert sum(law.cells.observed) + law.cells.other_observed == law.n
    assert set(REPORT_FILES) == set(written) and all(path.exists() for path in written.values())


def test_law_details_keep_the_top_cells_by_p_and_pool_the_rest() -> None:
    """For V above :data:`LAW_CELLS_KEPT` the record keeps that many cells of largest p (ties
    by lowest id) and one "other" cell with the remaining counts and mass; below it, all."""
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.full(500, 0.3))
    p[[7, 9]] = p.max()  # a tie at the top: id 7 before id 9
    p /= p.sum()
    observed = rng.multinomial(10_000, p)
    cells = law_cells(observed, p)
    assert len(cells.tokens) == LAW_CELLS_KEPT
    assert cells.tokens[:2] == [7, 9]
    assert cells.p == sorted(cells.p, reverse=True)
    assert sum(cells.observed) + cells.other_observed == 10_000
    assert math.isclose(sum(cells.p) + cells.other_p, 1.0, rel_tol=1e-12)
    small = law_cells(np.array([3, 1]), np.array([0.25, 0.75]))
    assert small == LawCells(
        tokens=[1, 0], observed=[1, 3], p=[0.75, 0.25], other_observed=0, other_p=0.0
    )
    json.dumps(dataclasses.asdict(cells))


def test_acceptance_details_carry_counts_and_exact_sum_min_pq(result: AuditResult) -> None:
    """Every acceptance record carries its typed counts: accepted of n reached, and the exact
    sum min(p_i, q_i)."""
    case = next(c for c in default_chain_battery() if c.case_id == "v2-tilted")
    exact = chain_laws(case.target_probs[0], case.draft_probs[0]).acceptance
    checks = [c for c in result.targets[0].checks if c.check_id == "acceptance"]
    assert [c.position for c in checks] == [0, 1]
    for check in checks:
        assert check.acceptance is not None and check.acceptance.reached == check.n
        assert 0 < check.acceptance.accepted <= check.n
        assert check.acceptance.expected_rate == float(exact[check.position])


def test_steady_history_flags_nothing(result: AuditResult) -> None:
    """Three earlier identical nights: every check has four points and no flag."""
    history = [_copy(result, f"2020-01-0{night}T00:00:00+00:00") for night in (3, 1, 2)]
    trends = compute_trends(result, history)
    assert trends.runs[:3] == tuple(f"2020-01-0{n}T00:00:00+00:00" for n in (1, 2, 3))
    assert not trends.new_failures and not trends.power_drops
    assert all(len(trend.points) == 4 for trend in trends.checks)


def test_trends_flag_a_new_failure_only_where_the_last_run_passed(result: AuditResult) -> None:
    """The three LOSSY checks (structure, law at positions 0 and 1) are new failures when they
    passed last night, and not when they already failed then (even if they passed before)."""

    def passing(check: CheckResult) -> None:
        if check.verdict is Verdict.LOSSY:
            check.verdict = Verdict.PASS

    passed = _edit_checks(_copy(result, "2020-01-01T00:00:00+00:00"), passing)
    trends = compute_trends(result, [passed])
    flagged = [(t.key[0], t.key[1], t.key[3]) for t in trends.new_failures]
    assert flagged == [
        ("residual_is_target", "structure", None),
        ("residual_is_target", "law", 0),
        ("residual_is_target", "law", 1),
    ]
    failed_last = _copy(result, "2020-01-02T00:00:00+00:00")
    assert not compute_trends(result, [passed, failed_last]).new_failures


@pytest.mark.parametrize(("shrink", "flagged"), [(1.3, True), (1.2, False)])
def test_trends_flag_a_power_drop_above_the_factor(
    result: AuditResult, shrink: float, flagged: bool
) -> None:
    """Minimum detectable TV 1.3x last night's is a power drop at factor 1.25; 1.2x is not;
    crashed checks are never power drops."""

    def more_power(check: CheckResult) -> None:
        check.min_detectable_tv /= shrink

    earlier = _edit_checks(_copy(result, "2020-01-01T00:00:00+00:00"), more_power)
    trends = compute_trends(result, [earlier])
    comparable = [
        t
        for t in trends.checks
        if math.isfinite(t.points[-1].min_detectable_tv)
        and t.points[-1].verdict not in (Verdict.ERROR, Verdict.SKIPPED)
    ]
    assert comparable
    assert all(t.power_drop is flagged for t in comparable)
    assert all(not t.power_drop for t in trends.checks if t.points[-1].verdict is Verdict.ERROR)
    if flagged:
        assert all(math.isclose(t.tv_ratio or 0, shrink) for t in comparable)


def test_history_loading_skips_foreign_files_in_directories_and_drops_the_current_run(
    result: AuditResult, tmp_path: Path
) -> None:
    """A history directory yields its audit records (the current run's own report.json is
    not counted twice) and lists the JSON files it skipped; a named non-record file is a
    clear error."""
    write_json(result, tmp_path / "report.json")
    write_json(_copy(result, "2020-01-01T00:00:00+00:00"), tmp_path / "night1.json")
    (tmp_path / "other.json").write_text('{"unrelated": true}')
    runs, skipped = load_history([tmp_path])
    assert len(runs) == 2 and [Path(s).name for s, _ in skipped] == ["other.json"]
    assert compute_trends(result, runs).runs == ("2020-01-01T00:00:00+00:00", result.started_at)
    with pytest.raises(ValueError, match=r"other\.json"):
        load_history([tmp_path / "other.json"])
    with pytest.raises(FileNotFoundError, match=r"missing\.json"):
        load_history([tmp_path / "missing.json"])
    with pytest.raises(ValueError, match="power_drop_factor"):
        compute_trends(result, runs, power_drop_factor=1.0)


def test_law_figures_show_failures_first_within_the_caps(result: AuditResult) -> None:
    """The failing (case, row) comes first, at most the cap of law figures is drawn, and a
    target without samples (crashed) gets no figure."""
    lossy = result.targets[1]
    assert law_groups(lossy, 1)[0][0].verdict is Verdict.LOSSY
    reference_law_only = dataclasses.replace(
        result.targets[0], checks=[c for c in result.targets[0].checks if c.check_id == "law"]
    )
    run = dataclasses.replace(result, targets=[reference_law_only, lossy, *result.targets[2:]])
    figures = report_figures(run, max_law_figures=1, max_law_figures_total=1)
    law_titles = [[f.title for f in target if f.title.startswith("law")] for target in figures]
    assert law_titles == [[], ["law: v2-tilted"], [], []]  # the LOSSY target's, not the PASS one
    assert figures[2] == [] and figures[3] == []


def test_report_command_writes_the_four_files_with_trends(
    result: AuditResult, tmp_path: Path
) -> None:
    """``losslessness report RESULT.json --history DIR --out DIR`` writes report.html,
    report.md, junit.xml and report.json; the Markdown then has a trends section."""
    history = tmp_path / "history"
    history.mkdir()
    small = dataclasses.replace(result, targets=result.targets[2:])  # no figures: fast
    write_json(small, tmp_path / "result.json")
    write_json(_copy(small, "2020-01-01T00:00:00+00:00"), history / "night1.json")
    out = tmp_path / "out"
    run = CliRunner().invoke(
        main,
        ["report", str(tmp_path / "result.json"), "--history", str(history), "--out", str(out)],
    )
    assert run.exit_code == 0, run.output
    assert sorted(p.name for p in out.iterdir()) == sorted(REPORT_FILES.values())
    assert "## Trends" in (out / "report.md").read_text(encoding="utf-8")
    bad = CliRunner().invoke(main, ["report", str(history), "--out", str(out)])
    assert bad.exit_code == 2
    (tmp_path / "junk.json").write_text("[]")
    junk = CliRunner().invoke(main, ["report", str(tmp_path / "junk.json"), "--out", str(out)])
    assert junk.exit_code == 2 and "not an audit record" in junk.output


def test_junit_renders_without_targets(result: AuditResult) -> None:
    """An empty run is a valid document with zero tests."""
    root = ET.fromstring(render_junit(dataclasses.replace(result, targets=[])))
    assert root.get("tests") == "0" and root.findall("testsuite") == []


def test_reports_name_a_target_stopped_early_and_after_how_many_steps() -> None:
    """A sequential audit that stops a lossy target early says so in report.md and
    report.html: the target, LOSSY, and after how many verify steps."""
    mutant = resolve_adapter("mutant/draft-chosen-greedily")
    stopped = run_audit([mutant], AuditConfig(cases=("v2-tilted", "v8-far")))
    target = stopped.targets[0]
    assert target.stopped_early is not None
    text = render_markdown(stopped)
    assert "## Stopped early" in text
    assert f"LOSSY after {target.verify_steps} verify steps" in text
    page = render_html(stopped)
    assert f"Stopped early: LOSSY after {target.verify_steps} verify steps" in page
