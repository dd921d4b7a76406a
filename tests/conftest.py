"""Suite-wide hooks: one closing line that says how many tests skipped and why."""

from __future__ import annotations

from collections import Counter

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print `skipped: N (reason ×k; …)`, or `skipped: none`, just before pytest's own closing line."""
    reasons: Counter[str] = Counter()
    for report in terminalreporter.stats.get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons[reason.removeprefix("Skipped: ")] += 1
    if not reasons:
        terminalreporter.write_line("skipped: none")
        return
    detail = "; ".join(f"{reason} ×{count}" for reason, count in reasons.most_common())
    hint = " (apt-get install chromium enables the browser tests)" if "hromium" in detail else ""
    terminalreporter.write_line(f"skipped: {sum(reasons.values())} ({detail}){hint}")
