"""JUnit XML of an audit: one ``<testsuite>`` per target, one ``<testcase>`` per check.

The layout conforms to the JUnit schema CI systems validate against, Jenkins xunit's
``junit-10.xsd``
(https://github.com/jenkinsci/xunit-plugin/blob/master/src/main/resources/org/jenkinsci/plugins/xunit/types/model/xsd/junit-10.xsd):

- LOSSY -> ``<failure type="LOSSY">``; IRREPRODUCIBLE (a broken seed contract) ->
  ``<failure type="IRREPRODUCIBLE">``; ERROR (the target crashed) -> ``<error>``;
  SKIPPED (unreachable position) -> ``<skipped>``; SUBOPTIMAL passes with the warning in
  ``<system-out>``; PASS has no failure element.
- A target that could not be loaded is a suite with one skipped test case ``audit``.
- The schema allows ``<properties>`` only on suites: each suite carries the run's seed, design
  TV, power, family-wise and per-assertion alpha and the target's verdict; each test case
  states its own numbers in ``<system-out>`` as ``key=value`` lines (seed, alpha, power,
  min_detectable_tv, p_value, n, verdict, case_hash, replay), which CI pages show.

Every text from a target or the record is :func:`reports.text.shown` (control characters as
visible escapes, cut at :data:`reports.text.DISPLAY_LIMIT` characters), then
:func:`xml_safe`: characters XML 1.0 forbids are replaced by ``\\xNN`` escapes so that the file
always parses; ElementTree escapes the rest.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

from losslessness.results import AuditResult, CheckResult, TargetResult, Verdict
from reports.text import shown

_INVALID_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def xml_safe(text: str) -> str:
    """``text`` with characters outside XML 1.0's Char production written as ``\\xNN``."""
    return _INVALID_XML.sub(lambda match: f"\\x{ord(match.group()):02x}", str(text))


def _text(value: object) -> str:
    """A record's text for an attribute or element: :func:`reports.text.shown`, XML-safe."""
    return xml_safe(shown(value))


def _number(value: float | None) -> str:
    return "" if value is None else repr(float(value))


def _properties(parent: ET.Element, values: dict[str, str]) -> None:
    properties = ET.SubElement(parent, "properties")
    for name, value in values.items():
        ET.SubElement(properties, "property", name=name, value=_text(value))


def _testcase(suite: ET.Element, result: AuditResult, check: CheckResult) -> None:
    case = ET.SubElement(
        suite,
        "testcase",
        name=_text(f"{check.check_id} {check.where}"),
        classname=_text(f"losslessness.{check.target}.{check.case_id}"),
        time=f"{check.wall_time_s:.3f}",
    )
    message = _text(check.message)
    if check.verdict is Verdict.LOSSY:
        ET.SubElement(case, "failure", message=message, type="LOSSY").text = message
    elif check.verdict is Verdict.ERROR:
        ET.SubElement(case, "error", message=message, type="ERROR").text = message
    elif check.verdict is Verdict.IRREPRODUCIBLE:
        # A broken seed contract fails the build as its own type, not as a lossy law.
        ET.SubElement(case, "failure", message=message, type="IRREPRODUCIBLE").text = message
    elif check.verdict is Verdict.SKIPPED:
        ET.SubElement(case, "skipped", message=message)
    numbers = {
        "verdict": check.verdict.value,
        "seed": str(check.seed),
        "alpha": _number(check.alpha),
        "power": _number(check.power),
        "min_detectable_tv": _number(check.min_detectable_tv),
        "p_value": _number(check.p_value),
        "n": str(check.n),
        "case_hash": _text(check.case_hash),
        "replay": _text(check.replay or ""),
    }
    lines = [f"{key}={value}" for key, value in numbers.items()]
    if check.verdict is Verdict.SUBOPTIMAL:
        lines.insert(0, f"SUBOPTIMAL (lossless, a warning): {message}")
    ET.SubElement(case, "system-out").text = xml_safe("\n".join(lines))


def _suite(root: ET.Element, result: AuditResult, target: TargetResult) -> dict[str, int]:
    checks = target.checks
    counts = {
        "tests": max(len(checks), 1 if target.error is not None else 0),
        "failures": sum(c.verdict in (Verdict.LOSSY, Verdict.IRREPRODUCIBLE) for c in checks),
        "errors": sum(c.verdict is Verdict.ERROR for c in checks),
        "skipped": sum(c.verdict is Verdict.SKIPPED for c in checks)
        + (target.error is not None and not checks),
    }
    attributes = {
        "name": _text(f"losslessness.{target.name}"),
        **{key: str(value) for key, value in counts.items()},
        "time": f"{target.wall_time_s:.3f}",
        "timestamp": _text(result.started_at),
    }
    suite = ET.SubElement(root, "testsuite", attrib=attributes)
    config = result.config
    _properties(
        suite,
        {
            "seed": str(config.seed),
            "tv": _number(config.tv),
            "power": _number(config.power),
            "family_wise_alpha": _number(config.family_wise_alpha),
            "per_assertion_alpha": _number(result.per_assertion_alpha),
            "n_assertions": str(result.n_assertions),
            "target_verdict": target.verdict.value,
            "description": target.description,
        },
    )
    for check in checks:
        _testcase(suite, result, check)
    if target.error is not None and not checks:
        case = ET.SubElement(
            suite, "testcase", classname=_text(f"losslessness.{target.name}"), name="audit"
        )
        ET.SubElement(case, "skipped", message=_text(f"could not be audited: {target.error}"))
    return counts


def render_junit(result: AuditResult) -> str:
    """The JUnit XML document of ``result`` (UTF-8 text with an XML declaration)."""
    root = ET.Element("testsuites", name="losslessness")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for target in result.targets:
        for key, value in _suite(root, result, target).items():
            totals[key] += value
    for key in ("tests", "failures", "errors"):  # junit-10.xsd has no "skipped" here
        root.set(key, str(totals[key]))
    root.set("time", f"{result.wall_time_s:.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(result: AuditResult, path: str | Path) -> None:
    """Write :func:`render_junit` of ``result`` to ``path`` (UTF-8)."""
    Path(path).write_text(render_junit(result), encoding="utf-8")
