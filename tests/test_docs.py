"""The README is a front page and the rest lives in docs/: every relative link resolves,
every docs page is reachable from the README, and the front page stays short."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes."""
    headings = re.findall(r"^#+ (.+)$", page.read_text(), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_every_relative_link_resolves_to_a_file_and_heading() -> None:
    broken = []
    for page in _pages():
        for target, anchor in LINK.findall(page.read_text()):
            if "://" in target:
                continue
            path = (page.parent / target).resolve()
            if not path.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and anchor[1:] not in _anchors(path):
                broken.append(f"{page.name}: {target}{anchor}")
    assert not broken, broken


def test_every_docs_page_is_linked_from_the_readme_and_the_readme_is_short() -> None:
    readme = (ROOT / "README.md").read_text()
    linked = {Path(target).name for target, _ in LINK.findall(readme)}
    pages = {page.name for page in (ROOT / "docs").glob("*.md")}
    assert pages <= linked, sorted(pages - linked)
    assert len(readme.splitlines()) <= 160
