"""Renderers of :class:`losslessness.audit.AuditResult`: terminal tables (rich) and JSON.

``reports`` only reads AuditResult (DESIGN.md section 2); HTML, JUnit XML and Markdown
renderers join later.
"""

from reports.jsonio import audit_from_dict, audit_to_dict, read_json, write_json
from reports.terminal import print_audit, replay_command

__all__ = [
    "audit_from_dict",
    "audit_to_dict",
    "print_audit",
    "read_json",
    "replay_command",
    "write_json",
]
