"""The README is a product page and the docs hold the rest: at most 200 lines, every docs page reachable from it,
every relative link resolving, and no history (dates, commit hashes, issue numbers) in README or docs prose
(history is CHANGELOG.md's, numbers are benchmarks/README.md's)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
HISTORY = re.compile(r"[Ii]ssue \d+|\b20\d\d-\d\d-\d\d\b|`[0-9a-f]{7,40}`")


def test_the_readme_is_short_and_links_every_docs_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    linked = {(ROOT / target).resolve() for target in LINK.findall(readme)}
    docs = {p.resolve() for p in PAGES[1:]}
    assert docs <= linked, sorted(str(p.relative_to(ROOT)) for p in docs - linked)
    # a newcomer's four questions: how to run it, how a switch works, which routes exist, what happens on a death
    for page in ("docs/architecture.md", "docs/routes.md", "docs/failures.md"):
        assert (ROOT / page).resolve() in linked, page
    assert "make demo" in readme and "make test" in readme


def test_relative_links_resolve_and_prose_carries_no_history():
    broken, history = [], []
    for page in PAGES:
        text = page.read_text()
        for target in LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)} -> {target}")
        history += [f"{page.relative_to(ROOT)}: {m.group(0)}" for m in HISTORY.finditer(text)]
    assert not broken, broken
    assert not history, history
