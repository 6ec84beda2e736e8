"""The README's links resolve, every docs page is in the nav, and code points at docs pages, not README sections.
(The site's own links and nav are checked by `mkdocs build --strict` in .ci/run.)"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CODE_DIRS = ("orchestrator", "jobs", "benchmarks", "tests", "infra")


def test_readme_links_resolve():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text())
    local = [x for x in links if not re.match(r"[a-z]+://", x)]
    assert local, "the README links into docs/"
    missing = [x for x in local if not (ROOT / x).exists()]
    assert not missing, f"README links to files that do not exist: {missing}"


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert [p for p in pages if f": {p}" not in nav] == []


def test_code_points_at_docs_not_readme_sections():
    """A comment like `(README, "what compiled means")` breaks whenever the README changes."""
    pattern = re.compile(r"README(?!\.md)[,:]? *(\"|'|section|table|'s)", re.I)
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for d in CODE_DIRS
        for p in (ROOT / d).rglob("*.py")
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line) and p.name != "test_docs.py"
    ]
    assert hits == []
