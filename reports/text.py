"""Text from a target or a record, made safe to show: one function per output format.

Every string the reports print that did not come from this code (target names and
descriptions, error messages, case ids and summaries, environment values, check details, any
field of a JSON record) goes through the function of its format here, and nowhere else:

- :func:`visible`: control and invisible characters (C0 and C1 controls, ANSI escape
  sequences' ESC, NUL, line breaks, bidirectional overrides, zero-width characters, unpaired
  surrogates) written as backslash escapes (``\\x1b``, ``\\n``, ``\\u202e``), so that nothing a
  target supplies moves the cursor, colours a terminal, starts a new table row or hides text.
- :func:`bounded`: at most :data:`DISPLAY_LIMIT` characters. Messages recorded by the engine
  are already shortened once where the failure was recorded
  (:func:`losslessness.results.shorten_message`, well below this limit); the bound only
  applies to records written elsewhere.
- :func:`markdown_text` (GitHub-flavoured Markdown, ``report.md``), :func:`terminal_text`
  (rich), :func:`plot_text` (matplotlib) and :func:`html_finalize` (the jinja2 environment of
  ``report.html``, whose autoescape does the HTML escaping with markupsafe).
"""

from __future__ import annotations

import html
import re
import unicodedata
from typing import Any

from markupsafe import Markup
from rich.text import Text

DISPLAY_LIMIT = 2000
"""Characters of one record field shown in a report (far above what the engine records)."""

_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Unicode categories written as escapes: controls, format characters (bidirectional
overrides, zero-width characters), surrogates, line and paragraph separators."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

_CANDIDATES = re.compile(r"[^\x20-\x7e]")
"""Characters that may need an escape (everything but printable ASCII): the fast path."""

_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|~$@#/])|(?<![A-Za-z0-9])(www)\.", re.IGNORECASE)
"""What makes inline Markdown syntax, besides HTML, in a line that does not start with the
text (every record string the summary prints sits after a table pipe or a list marker; its
line breaks are escapes): backslash, code span, emphasis and strikethrough, link and image
brackets, table pipes, GitHub's math, mentions and issue references, and the extended
autolinks of GitHub-flavoured Markdown (``https://``: the slash; ``www.``: its dot). A
backslash makes each of them a literal character (CommonMark 0.31, section 2.4,
https://spec.commonmark.org/0.31.2/#backslash-escapes); other punctuation stays as it is, so
numbers, times and paths read as written. ``<``, ``>`` and ``&`` (HTML tags, autolinks in
angle brackets, entities) become entities first."""


def _markdown_escape(match: re.Match[str]) -> str:
    return "\\" + match.group(1) if match.group(1) else match.group(2) + "\\."


def _escape_character(match: re.Match[str]) -> str:
    character = match.group()
    if character in _NAMED:
        return _NAMED[character]
    if unicodedata.category(character) not in _INVISIBLE_CATEGORIES:
        return character
    code = ord(character)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(value: Any) -> str:
    """``str(value)`` with every control or invisible character written as a backslash
    escape (``\\n``, ``\\t``, ``\\x00``, ``\\x1b``, ``\\u202e``, ...); printable text, non-ASCII
    letters and symbols included, is kept as it is."""
    return _CANDIDATES.sub(_escape_character, str(value))


def bounded(value: Any, limit: int = DISPLAY_LIMIT) -> str:
    """``str(value)``, cut after ``limit`` characters with ``" ... (N more characters)"``."""
    text = str(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]} ... ({len(text) - limit} more characters)"


def shown(value: Any, limit: int = DISPLAY_LIMIT) -> str:
    """:func:`bounded`, then :func:`visible`: one line of inert text (no format's escaping)."""
    return visible(bounded(value, limit))


def markdown_text(value: Any, limit: int = DISPLAY_LIMIT) -> str:
    """``value`` as literal GitHub-flavoured Markdown inline text, safe in a table cell: cut at
    ``limit`` characters, control characters and line breaks as visible escapes, then every
    character of Markdown's inline syntax backslash-escaped (``![x](y)`` renders as written,
    never as an image; ``|`` never ends a cell; ``<script>`` is ``&lt;script&gt;``)."""
    return _MARKDOWN_SPECIAL.sub(_markdown_escape, html.escape(shown(value, limit), quote=False))


def terminal_text(value: Any, style: str = "") -> Text:
    """``value`` as a rich :class:`~rich.text.Text` in ``style``: a Text is never parsed for
    markup (``[bold]`` prints as written), and :func:`shown` makes ANSI escapes and other
    control characters visible, so a message cannot restyle or rewrite the terminal."""
    return Text(shown(value), style=style)


def plot_text(value: Any, limit: int = DISPLAY_LIMIT) -> str:
    """``value`` for a matplotlib title or label: :func:`shown`, with ``$`` escaped so that
    no mathtext is parsed (a malformed ``$\\frac$`` would fail the figure)."""
    return shown(value, limit).replace("$", r"\$")


def html_finalize(value: Any) -> Any:
    """The jinja2 ``finalize`` of the HTML report: every string an expression prints is
    :func:`shown` before autoescape (markupsafe) escapes it; :class:`~markupsafe.Markup`
    (text this package marked safe, such as a figure's data URI) and non-strings pass."""
    if isinstance(value, str) and not isinstance(value, Markup):
        return shown(value)
    return value
