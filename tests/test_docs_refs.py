"""Every section and decision reference in the repository resolves to a heading under docs/.

Scanned: .py/.yaml/.yml/.md files outside docs/, plus the docs
themselves. A section reference must name its doc ("docs/preference.md S7.1", further tokens may follow
in a chain: "S2.1, S2.3") and the doc must have that numbered heading; a decision reference must read
"docs/decisions.md, decision N" and docs/decisions.md must have "## Decision N". Inside docs/, a bare
section reference means the same page. No file may point at the team's private spec folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
SECTION = "\u00a7"
SUFFIXES = {".py", ".yaml", ".yml", ".md"}
SKIP_DIRS = {"docs", ".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__"}
SELF = {Path(__file__).resolve()}

NUM = r"\d+(?:\.\d+)*"
TOKEN = rf"{SECTION}{NUM}(?:\s*[-\u2013]\s*{SECTION}?{NUM})?"
SEP = r"\s*(?:,\s*and|,\s*or|,|;|/|and|or)\s*"
TOKEN_RE = re.compile(TOKEN)
NUMS_RE = re.compile(NUM)
CHAIN_RE = re.compile(rf"docs/(\w+)\.md\s+({TOKEN}(?:{SEP}{TOKEN})*)")
DOC_CHAIN_RE = re.compile(rf"\[?(?:docs/)?(\w+)\.md\s+({TOKEN}(?:{SEP}{TOKEN})*)")
HEADING_RE = re.compile(r"^#{1,6}\s+(\d+(?:\.\d+)*)\.?\s", re.M)
DECISION_HEADING_RE = re.compile(r"^##\s+Decision\s+(\d+):", re.M)
DECISION_RE = re.compile(r"(?<![\w/])[Dd]ecisions?\s+(\d+(?:\s*(?:,\s*and|,|and|or)\s*\d+)*)\b")
PRIVATE_RE = re.compile(r"\.\./shared|shared/spec")


def _code_files() -> list[Path]:
    files = []
    for path in sorted(ROOT.rglob("*")):
        rel = path.relative_to(ROOT)
        if path.suffix not in SUFFIXES or not path.is_file() or path.resolve() in SELF:
            continue
        if any(part in SKIP_DIRS or part.startswith(".") for part in rel.parts[:-1]):
            continue
        files.append(path)
    return files


def _doc_sections() -> dict[str, set[str]]:
    return {p.stem: set(HEADING_RE.findall(p.read_text(encoding="utf-8"))) for p in DOCS.glob("*.md")}


def _decisions() -> set[int]:
    return {int(n) for n in DECISION_HEADING_RE.findall((DOCS / "decisions.md").read_text(encoding="utf-8"))}


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _check_sections(rel: str, text: str, chain_re: re.Pattern, default_doc: str | None,
                    sections: dict[str, set[str]]) -> list[str]:
    """Problems with the section references of one file."""
    problems, attributed = [], {}
    for m in chain_re.finditer(text):
        for t in TOKEN_RE.finditer(m.group(2)):
            attributed[m.start(2) + t.start()] = m.group(1)
    for t in TOKEN_RE.finditer(text):
        doc = attributed.get(t.start(), default_doc)
        where = f"{rel}:{_line(text, t.start())}: {t.group(0)!r}"
        if doc is None:
            problems.append(f"{where} does not name a docs file (write 'docs/<page>.md {t.group(0)}')")
            continue
        if doc not in sections:
            problems.append(f"{where} names docs/{doc}.md, which does not exist")
            continue
        for num in NUMS_RE.findall(t.group(0)):
            if num not in sections[doc]:
                problems.append(f"{where}: docs/{doc}.md has no heading numbered {num}")
    return problems


def _check_decisions(rel: str, text: str, inside_docs: bool, decisions: set[int]) -> list[str]:
    problems = []
    for m in DECISION_RE.finditer(text):
        where = f"{rel}:{_line(text, m.start())}: {m.group(0)!r}"
        if not inside_docs and not text[:m.start()].endswith("docs/decisions.md, "):
            problems.append(f"{where} must read 'docs/decisions.md, {m.group(0).lower()}'")
        for n in re.findall(r"\d+", m.group(1)):
            if int(n) not in decisions:
                problems.append(f"{where}: docs/decisions.md has no 'Decision {n}' heading")
    return problems


def test_docs_exist_with_numbered_headings():
    sections = _doc_sections()
    for page, must in {"preference": {"2.1", "3.7", "4.3", "5.4", "7.1", "7.2", "8.1", "9.2", "10", "14"},
                       "multiturn": {"1.1", "2.8", "2.9", "3", "4.3", "5.1", "6.1", "9", "10.2", "11.1", "13"}}.items():
        assert must <= sections.get(page, set()), f"docs/{page}.md lacks {sorted(must - sections.get(page, set()))}"
    assert _decisions() == set(range(1, 11))


def test_code_references_resolve():
    sections, decisions = _doc_sections(), _decisions()
    problems = []
    for path in _code_files():
        rel = str(path.relative_to(ROOT))
        text = path.read_text(encoding="utf-8")
        problems += _check_sections(rel, text, CHAIN_RE, None, sections)
        problems += _check_decisions(rel, text, False, decisions)
    assert not problems, ("unresolved references (name the docs file and a heading it has):\n"
                          + "\n".join(problems[:60]) + (f"\n... and {len(problems) - 60} more" if len(problems) > 60 else ""))


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_docs_internal_references_resolve(page):
    sections, decisions = _doc_sections(), _decisions()
    text = (DOCS / page).read_text(encoding="utf-8")
    problems = _check_sections(f"docs/{page}", text, DOC_CHAIN_RE, Path(page).stem, sections)
    problems += _check_decisions(f"docs/{page}", text, True, decisions)
    assert not problems, "\n".join(problems)


def test_no_pointer_to_private_spec():
    hits = []
    for path in _code_files() + sorted(DOCS.glob("*.md")):
        text = path.read_text(encoding="utf-8")
        for m in PRIVATE_RE.finditer(text):
            hits.append(f"{path.relative_to(ROOT)}:{_line(text, m.start())}: {m.group(0)}")
    assert not hits, "the spec folder is not part of the repository; cite docs/ instead:\n" + "\n".join(hits)
