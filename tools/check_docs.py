"""Check the documentation before and after `mkdocs build` (run by `make docs`).

Sources (Markdown files or folders of them): no unfinished-text marker ("To be completed", TODO, TBD, FIXME)
and no reference to the project's own issues or pull requests ("issue 12", "issue-17", "PR #3"). Docs speak
of the software, not of its history. Another project's issue is cited as a link to its tracker,
`[OpenOOD issue #308](https://github.com/...)`, which is allowed. Nor does a page narrate the work that led to
the code: a short, explicit list of phrases ("this round", "first round", "earlier run", "earlier code", "the final
code", "predates", "the commit after", ...) is refused; a measured figure names its conditions or configuration
instead of the moment it was taken.

Built site (`--site DIR`): every relative link and resource of every HTML page leads to a file, so the site
navigates when opened from disk (file://), where a link to a folder shows a directory listing, and a link
starting with "/" leaves the site. (404.html is exempt: only a web server shows it, for any address.) No page
loads a resource (script, stylesheet, font, image) from the network: opened from disk with the network off, a
script from a CDN never arrives (the search box waits for its worker shim forever).

Usage: python tools/check_docs.py docs README.md        (exit 1 listing each finding, 0 when clean)
       python tools/check_docs.py --site site
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit

MARKERS = re.compile(r"\bto be completed\b|\b(?:TODO|TBD|FIXME)\b", re.IGNORECASE)
# "issue 12", "issues 3 and 4", "Issue-17", "issue #5", "PR 7", "pull request #9".
OWN_ISSUE = re.compile(r"\b(?:issues?|PRs?|pull requests?)[ \t\-_]*#?\d+", re.IGNORECASE)
# Narration of the project's history: the phrases that have crept into benchmark sections. Explicit on purpose,
# so that ordinary prose ("a full round trip", "rounds to 0") never trips it.
HISTORY = re.compile(
    r"\b(?:(?:this|first|second|last|previous|next|earlier|later) round"
    r"|earlier (?:runs?|code|versions?)"
    r"|the final code"
    r"|predat(?:e|es|ed|ing)"
    r"|the commit (?:after|before))\b",
    re.IGNORECASE,
)
# A Markdown link to an external page: its text may name that project's issues.
EXTERNAL_LINK = re.compile(r"\[[^\]\n]*\]\(https?://[^)\s]+\)")
LINK_ATTR = re.compile(r"""\b(?:href|src)\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.IGNORECASE)
# A resource the page loads by itself (not a link the reader follows): any src=, and a <link> other than
# rel=canonical/alternate, whose address is on another host.
REMOTE_RESOURCE = re.compile(
    r"""<(?:[a-z]+\b[^>]*?\ssrc|link\b(?![^>]*\brel\s*=\s*["']?(?:canonical|alternate))[^>]*?\shref)\s*=\s*"""
    r"""["']?((?:https?:)?//[^"'\s>]+)""",
    re.IGNORECASE,
)


def markdown_files(paths: Iterable[str | Path]) -> list[Path]:
    """The Markdown files named, and those under the folders named, in a stable order."""
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(path.rglob("*.md"))
        elif path.is_file():
            found.append(path)
        else:
            raise FileNotFoundError(f"no such file or folder: {path}")
    return found


def source_findings(path: Path) -> Iterator[str]:
    """One line per marker, own-issue reference or history narration in a Markdown file."""
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        for match in MARKERS.finditer(line):
            yield f"{path}:{number}: {match[0]!r}: unfinished text; finish it or remove it"
        # Spaces keep the columns; the text of an external link is another project's business.
        blanked = EXTERNAL_LINK.sub(lambda m: " " * len(m[0]), line)
        for match in OWN_ISSUE.finditer(blanked):
            yield (
                f"{path}:{number}: {match[0]!r}: the docs describe the software, not its history; "
                "drop the issue number (another project's issue: link to its tracker)"
            )
        for match in HISTORY.finditer(blanked):
            yield (
                f"{path}:{number}: {match[0]!r}: the docs describe the software, not its history; "
                "say what the code does now (a figure: name its machine, load, sizes or configuration)"
            )


def _local_target(link: str) -> str | None:
    """The path part of a link that points into the site, or None for external, anchor-only and data links."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith("#") or not (parts.path or parts.query):
        return None
    return unquote(parts.path)


def site_findings(site: Path) -> Iterator[str]:
    """One line per link of the built site that would not work from disk."""
    for page in sorted(site.rglob("*.html")):
        if page == site / "404.html":  # a web server's answer to any missing address: root links by design
            continue
        text = page.read_text(encoding="utf-8", errors="replace")
        for match in REMOTE_RESOURCE.finditer(text):
            yield f"{page.relative_to(site)}: loads {match[1]!r} from the network: opened from disk offline it fails"
        for match in LINK_ATTR.finditer(text):
            link = match[1] if match[1] is not None else match[2]
            target = _local_target(link)
            if target is None:
                continue
            where = f"{page.relative_to(site)}: link {link!r}"
            if target.startswith("/"):
                yield f"{where} starts at the root: opened from disk it leaves the site"
                continue
            resolved = (page.parent / target) if target else page
            if resolved.is_dir():
                yield f"{where} leads to a folder: opened from disk it shows a directory listing"
            elif not resolved.is_file():
                yield f"{where} leads to nothing ({resolved.relative_to(site.parent)} does not exist)"


def main(argv: list[str] | None = None) -> int:
    """Print every finding; 1 when there is any, 2 on bad usage, 0 when the docs are clean."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["--site"]:
            if len(args) != 2 or not Path(args[1]).is_dir():
                raise FileNotFoundError("--site takes one folder: the built site")
            findings = list(site_findings(Path(args[1])))
            what = f"the built site {args[1]}"
        else:
            if not args:
                raise FileNotFoundError("give the Markdown files or folders to check, or --site DIR")
            files = markdown_files(args)
            findings = [line for path in files for line in source_findings(path)]
            what = f"{len(files)} Markdown files"
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for line in findings:
        print(line, file=sys.stderr)
    if findings:
        print(f"check_docs: {len(findings)} problem(s) in {what}", file=sys.stderr)
        return 1
    print(f"check_docs: {what} clean")
    return 0


if __name__ == "__main__":
    sys.exit(main())
