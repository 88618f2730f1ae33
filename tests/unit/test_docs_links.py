"""Every relative link in README.md and docs/ leads somewhere: an existing file inside the
repository and, for an #anchor into a markdown file, one of its headings as GitHub names it."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), with an optional "title" after the target.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
# [label]: target
REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files(root: Path) -> list[Path]:
    """README.md and every markdown file under docs/."""
    files = [root / "README.md"] if (root / "README.md").exists() else []
    return files + sorted((root / "docs").rglob("*.md"))


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def links(text: str) -> Iterator[tuple[int, str]]:
    """(line number, target) of every inline and reference link outside code."""
    for number, line in prose_lines(text):
        without_code = CODE_SPAN.sub("", line)
        for match in INLINE_LINK.finditer(without_code):
            yield number, match.group(1)
        reference = REFERENCE_LINK.match(without_code)
        if reference:
            yield number, reference.group(1)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation dropped (hyphens and
    underscores kept), spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = "".join(char for char in text if char.isalnum() or char in "-_ ")
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a markdown file offers: its headings' slugs (a repeated slug gets -1, -2,
    as on GitHub) and explicit <a id> or <a name> anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in prose_lines(text):
        heading = HEADING.match(line)
        if heading:
            base = slug(heading.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            found.add(base if count == 0 else f"{base}-{count}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def broken_links(root: Path) -> list[str]:
    """One line per link that leads nowhere, naming the file, line and target."""
    root = root.resolve()
    problems: list[str] = []
    anchor_cache: dict[Path, set[str]] = {}

    def anchors_of(path: Path) -> set[str]:
        if path not in anchor_cache:
            anchor_cache[path] = anchors(path.read_text(encoding="utf-8"))
        return anchor_cache[path]

    for source in markdown_files(root):
        text = source.read_text(encoding="utf-8")
        where = source.relative_to(root)
        for number, target in links(text):
            if not target or SCHEME.match(target) or target.startswith("//"):
                continue  # an external address (https:, mailto:): not this test's business
            path_part, _, anchor = target.partition("#")
            if path_part.startswith("/"):
                problems.append(f"{where}:{number}: {target}: an absolute path")
                continue
            destination = (source.parent / path_part).resolve() if path_part else source
            if not destination.is_relative_to(root):
                problems.append(f"{where}:{number}: {target}: outside the repository")
                continue
            if not destination.exists():
                problems.append(f"{where}:{number}: {target}: no such file")
                continue
            if anchor and destination.suffix == ".md" and anchor not in anchors_of(destination):
                problems.append(f"{where}:{number}: {target}: no heading #{anchor}")
    return problems


def test_every_relative_link_in_readme_and_docs_resolves() -> None:
    assert markdown_files(REPO), "no README.md or docs/ found"
    problems = broken_links(REPO)
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    (tmp_path / "docs" / "sub").mkdir(parents=True)
    (tmp_path / "README.md").write_text(
        "# Top\n\n[fine](docs/guide.md#a-heading-with-code) [missing](docs/nope.md)\n"
    )
    (tmp_path / "docs" / "guide.md").write_text(
        "# Guide\n\n## A heading, with `code`!\n\n"
        "[anchor gone](#no-such-heading) [self](#guide) [out](../../etc/passwd)\n"
        "```\n[in a fence](nowhere.md)\n```\n"
        "`[in a span](nowhere.md)` [web](https://example.com/x.md)\n"
    )
    (tmp_path / "docs" / "sub" / "deep.md").write_text(
        "[up](../guide.md) [ref]\n\n[ref]: ../../missing.md\n"
    )
    problems = broken_links(tmp_path)
    assert problems == [
        "README.md:3: docs/nope.md: no such file",
        "docs/guide.md:5: #no-such-heading: no heading #no-such-heading",
        "docs/guide.md:5: ../../etc/passwd: outside the repository",
        "docs/sub/deep.md:3: ../../missing.md: no such file",
    ]


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("The reference run (2026-11-24)", "the-reference-run-2026-11-24"),
        ("`inventory show`", "inventory-show"),
        ("`/etc/hosts`", "etchosts"),
        ("gpu_health on a GPU", "gpu_health-on-a-gpu"),
        (
            "In the cluster: preflight, periodic checks, budgeted cordoning",
            "in-the-cluster-preflight-periodic-checks-budgeted-cordoning",
        ),
        ("See [the lab](lab.md) here", "see-the-lab-here"),
    ],
)
def test_slugs_follow_github(heading: str, expected: str) -> None:
    assert slug(heading) == expected
