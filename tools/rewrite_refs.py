"""Rewrite section and decision references in the code base to explicit, resolvable ones.

Usage (from the repository root)::

    python tools/rewrite_refs.py            # rewrite files in place, list what changed
    python tools/rewrite_refs.py --check    # change nothing; exit 1 if any file would change
    python tools/rewrite_refs.py --explain  # also print, per reference, the doc it was attributed to

Targets: every .py/.yaml/.yml/.md file except those under docs/, .git, .venv and other hidden or build
folders. Results look like ``docs/preference.md <S>7.1``, ``docs/multiturn.md <S>2.9`` and
``docs/decisions.md, decision 4`` (<S> being the section sign). Running it twice changes nothing.

How a bare section reference is attributed to preference.md or multiturn.md, first rule that applies:

1. it continues a chain written right after a doc name ("multiturn.md <S>2.8, <S>9");
2. the nearest doc name earlier on the same line;
3. the only doc the file names anywhere;
4. the per-file table ``FILE_DOCS`` (by file basename), for files that name both docs or none;
5. the nearest doc name earlier in the file, else the first one after it;
6. a keyword vote over the file's text (printed as a warning).

A reference that cannot be attributed is reported and makes the script exit with status 2.
"""

from __future__ import annotations

import argparse
import io
import re
import sys
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SECTION = "\u00a7"
DOCS = ("preference", "multiturn")
SUFFIXES = {".py", ".yaml", ".yml", ".md"}
LINE_LENGTH = 120  # ruff's line-length in pyproject.toml: .py lines made longer are re-wrapped
SKIP_DIRS = {"docs", ".git", ".venv", "venv", "build", "dist", "node_modules", "__pycache__"}
SELF = {Path(__file__).resolve(), (ROOT / "tests" / "test_docs_refs.py").resolve()}

# Files that name both docs (or none) and whose bare references belong to one of them. Keyed by basename;
# a basename shared by several files must mean the same doc for all of them.
FILE_DOCS = {
    # preference trainers
    "config.py": "preference",
    "config_marlhf.py": "preference",
    "replay.py": "preference",
    "preferences.py": "preference",
    "distributions.py": "preference",
    "reward_model.py": "preference",
    "learned_reward.py": "preference",
    "marlhf.py": "preference",
    "preference.py": "preference",
    "iterative.py": "preference",
    "reward_pairs.py": "preference",
    "madpo.py": "preference",
    "logprobs.py": "preference",
    "common.py": "preference",
    "api.py": "preference",
    "centralized.py": "preference",
    "local.py": "preference",
    "history_checkpoint.py": "preference",
    "replay_selection.py": "preference",
    "reward_distribution.py": "preference",
    "iterative_collection.py": "preference",
    "tiny.yaml": "preference",
    "madpo_step.py": "preference",
    "test_config.py": "preference",
    "test_replay.py": "preference",
    "test_preferences.py": "preference",
    "test_centralized_adapter.py": "preference",
    "test_reward_distribution.py": "preference",
    "test_reward_model.py": "preference",
    "test_madpo.py": "preference",
    "test_marlhf.py": "preference",
    "test_api_comparator.py": "preference",
    "test_iterative_rounds.py": "preference",
    "test_iterative_comparators.py": "preference",
    # multi-turn training
    "actor_critic.py": "multiturn",
    "magrpo.py": "multiturn",
    "reinforce.py": "multiturn",
    "config_rl.py": "multiturn",
    "config_ac.py": "multiturn",
    "reference.py": "multiturn",
    "tree.py": "multiturn",
    "transitions.py": "multiturn",
    "rewards.py": "multiturn",
    "prompts.py": "multiturn",
    "sandbox.py": "multiturn",
    "analysis.py": "multiturn",
    "tasks_dm.py": "multiturn",
    "evaluation.py": "multiturn",
    "test_code_env.py": "multiturn",
    "test_reference_kl.py": "multiturn",
    "test_transitions.py": "multiturn",
    "test_magrpo_tree.py": "multiturn",
    "test_magrpo_module.py": "multiturn",
    "test_rewards.py": "multiturn",
    "test_actor_critic.py": "multiturn",
    "test_losses.py": "multiturn",
    "test_sandbox.py": "multiturn",
}

# Upstream numbered-list items that our docs cover in a regular section: (doc, old) -> new.
SECTION_MAP = {
    ("preference", "14.26"): "8.1",  # reward-model scoring prompts come from the formatters
    ("multiturn", "12.20"): "5.1",   # code environment: do not re-wrap transition prompts
}

KEYWORDS = {
    "preference": ("madpo", "marlhf", "comparator", "replay", "preference", "reward model", "dpo", "pair"),
    "multiturn": ("magrpo", "rollout", "transition", "actor-critic", "critic", "turn", "reinforce", "sandbox"),
}

NUM = r"\d+(?:\.\d+)*"
TOKEN = rf"{SECTION}{NUM}(?:\s*[-\u2013]\s*{SECTION}?{NUM})?"
SEP = r"\s*(?:,\s*and|,\s*or|,|;|/|and|or)\s*"
DOC_NAME = r"(?<![\w/.])(?:[Ss]pec\s+)?(?:docs/)?(preference|multiturn)\.md"
CHAIN_RE = re.compile(rf"{DOC_NAME}\s+(?P<chain>{TOKEN}(?:{SEP}{TOKEN})*)")
ANY_DOC_RE = re.compile(r"(preference|multiturn)\.md")
TOKEN_RE = re.compile(rf"(?:(?<![\w/])[Ss]pec\s+)?(?P<tok>{TOKEN})")
NUM_IN_TOKEN_RE = re.compile(rf"{SECTION}?({NUM})")
SURPRISE_RE = re.compile(r",\s*surprise\s+\d+")
DECISION_RE = re.compile(
    r"(?<!docs/decisions\.md, )(?:(?<![\w/])(?:[Oo]ur|README|[Ss]pec)\s+)?(?<![\w/])"
    r"(?P<word>[Dd]ecisions?)\s+(?P<nums>\d+(?:\s*(?:,\s*and|,|and|or)\s*\d+)*)\b"
)


def iter_files(root: Path):
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.suffix not in SUFFIXES or not path.is_file():
            continue
        if any(part in SKIP_DIRS or part.startswith(".") for part in rel.parts[:-1]):
            continue
        if path.resolve() in SELF:
            continue
        yield path


def _remap(doc: str, token: str) -> str:
    def sub(m: re.Match) -> str:
        return m.group(0).replace(m.group(1), SECTION_MAP.get((doc, m.group(1)), m.group(1)))

    return NUM_IN_TOKEN_RE.sub(sub, token)


def _file_doc(path: Path, text: str, pos: int, mentions: list[tuple[int, str]]) -> tuple[str | None, str]:
    """(doc, rule) for a bare reference at ``pos`` with no doc name on its line."""
    docs = {d for _, d in mentions}
    if len(docs) == 1:
        return docs.pop(), "file names one doc"
    if path.name in FILE_DOCS:
        return FILE_DOCS[path.name], "FILE_DOCS"
    before = [d for p, d in mentions if p < pos]
    if before:
        return before[-1], "nearest earlier doc name"
    if mentions:
        return mentions[0][1], "first doc name after"
    lowered = text.lower()
    votes = {d: sum(lowered.count(k) for k in kws) for d, kws in KEYWORDS.items()}
    best = max(votes, key=votes.get)
    if votes[best] == 0 or list(votes.values()).count(votes[best]) > 1:
        return None, "unresolved"
    return best, "keyword vote (add the file to FILE_DOCS)"


def rewrite_text(path: Path, text: str, log: list[str]) -> str:
    text = SURPRISE_RE.sub("", text)
    mentions = [(m.start(), m.group(1)) for m in ANY_DOC_RE.finditer(text)]

    # 1. Explicit chains: normalise the doc name, keep the chained tokens (remapped).
    covered: list[tuple[int, int]] = []
    out, last = [], 0
    for m in CHAIN_RE.finditer(text):
        doc = m.group(1)
        chain = re.sub(TOKEN, lambda t, d=doc: _remap(d, t.group(0)), m.group("chain"))
        out.append(text[last:m.start()])
        out.append(f"docs/{doc}.md {chain}")
        last = m.end()
        log.append(f"{path}: explicit {doc}: {m.group('chain')}")
    out.append(text[last:])
    text = "".join(out)
    mentions = [(m.start(), m.group(1)) for m in ANY_DOC_RE.finditer(text)]
    covered = [(m.start("chain"), m.end("chain")) for m in CHAIN_RE.finditer(text)]

    # 2. Bare tokens: attribute and prefix; a following chain of bare tokens shares the prefix.
    out, last, prev_end, prev_doc = [], 0, -1, None
    for m in TOKEN_RE.finditer(text):
        start, tok = m.start(), m.group("tok")
        if any(a <= m.start("tok") < b for a, b in covered):
            continue
        if prev_doc is not None and re.fullmatch(SEP, text[prev_end:start]):
            doc, rule, prefix = prev_doc, "chain", ""
        else:
            line_start = text.rfind("\n", 0, start) + 1
            same_line = [d for p, d in mentions if line_start <= p < start]
            if same_line:
                doc, rule = same_line[-1], "same line"
            else:
                doc, rule = _file_doc(path, text, start, mentions)
            if doc is None:
                log.append(f"UNRESOLVED {path}:{text.count(chr(10), 0, start) + 1}: {tok}")
                prev_doc = None
                continue
            prefix = f"docs/{doc}.md "
        out.append(text[last:start])
        out.append(prefix + _remap(doc, tok))
        last, prev_end, prev_doc = m.end(), m.end(), doc
        log.append(f"{path}:{text.count(chr(10), 0, start) + 1}: {tok} -> {doc} ({rule})")
    out.append(text[last:])
    text = "".join(out)

    # 3. Decisions.
    def dec(m: re.Match) -> str:
        word = "decisions" if m.group("word").lower() == "decisions" else "decision"
        return f"docs/decisions.md, {word} {m.group('nums')}"

    return DECISION_RE.sub(dec, text)


# --- keeping .py lines within LINE_LENGTH -------------------------------------------------------------------------

KEEP = "\x00"  # stands for a space that must not become a line break
UNBREAKABLE_RE = re.compile(rf"docs/\w+\.md {SECTION}|docs/decisions\.md, decisions? \d+")
BULLET_RE = re.compile(r"\s*(?:[*-]|\d+\.)\s")


def _prose_lines(text: str) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """({line: (first, last) line of its triple-quoted string}, {whole-line comment lines}), 0-based."""
    strings, comments = {}, set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            (r0, _), (r1, _) = tok.start, tok.end
            if tok.type == tokenize.STRING and re.match(r"[rRbBuUfF]*(\"\"\"|\'\'\')", tok.string):
                for r in range(r0, r1 + 1):
                    strings[r - 1] = (r0 - 1, r1 - 1)
            elif tok.type == tokenize.COMMENT and tok.line.lstrip().startswith("#"):
                comments.add(r0 - 1)
    except (tokenize.TokenError, SyntaxError):
        return {}, set()
    return strings, comments


def _split(line: str, limit: int) -> tuple[str, str] | None:
    """Break ``line`` at its last breakable space within ``limit`` columns: (head, tail)."""
    protected = UNBREAKABLE_RE.sub(lambda m: m.group(0).replace(" ", KEEP), line)
    indent = len(line) - len(line.lstrip())
    cut = protected.rfind(" ", indent + 1, limit + 1)
    if cut <= indent + 2 or not protected[cut + 1:].strip():
        return None
    return line[:cut].rstrip(), line[cut + 1:]


def wrap_long_lines(text: str, limit: int = LINE_LENGTH) -> str:
    """Re-wrap docstring and comment lines longer than ``limit`` (overflow joins the next line of the
    same paragraph, else a new line with the same indentation); code lines are left alone."""
    if not any(len(line) > limit for line in text.splitlines()):
        return text
    strings, comments = _prose_lines(text)
    lines = text.split("\n")
    out, i, carry = [], 0, None
    while i < len(lines):
        line = lines[i]
        if carry is not None:  # overflow from the previous line joins this one
            indent, tail = carry
            line = line[:indent] + tail + " " + line[indent:].lstrip()
            carry = None
        if len(line) > limit and (i in strings or i in comments):
            rule = re.match(r"(\s*#.*?)(-{4,})$", line) if i in comments else None
            if rule and len(rule.group(1)) + 4 <= limit:
                line = rule.group(1) + "-" * (limit - len(rule.group(1)))
            elif (parts := _split(line, limit)) is not None:
                head, tail = parts
                stripped = line.lstrip()
                indent = len(line) - len(stripped)
                if i in comments:
                    prefix = line[:indent] + "# "
                    nxt = lines[i + 1] if i + 1 < len(lines) else ""
                    same = (i + 1 in comments and nxt.startswith(prefix) and nxt[len(prefix):].strip()
                            and not nxt.rstrip().endswith("----"))
                else:
                    quote = re.match(r'[rRbBuUfF]*("""|\'\'\')', stripped)
                    if not quote and BULLET_RE.match(stripped):  # (after opening quotes: align with them)
                        indent += BULLET_RE.match(stripped).end() - (len(stripped) - len(stripped.lstrip()))
                    prefix = " " * indent
                    nxt = lines[i + 1] if i + 1 < len(lines) else ""
                    first, last = strings[i]
                    same = (i + 1 <= last and i + 1 < last and nxt.startswith(prefix) and nxt.strip()
                            and not nxt[len(prefix):].startswith(" ") and not BULLET_RE.match(nxt))
                out.append(head)
                if same:
                    carry = (len(prefix), tail)
                else:
                    lines.insert(i + 1, prefix + tail)
                    was_comment = i in comments
                    comments = {c + 1 if c > i else c for c in comments}
                    strings = {(k + 1 if k > i else k): (a + (a > i), b + (b >= i)) for k, (a, b) in strings.items()}
                    if was_comment:
                        comments.add(i + 1)
                    else:
                        strings[i + 1] = strings[i]
                i += 1
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file would change")
    parser.add_argument("--explain", action="store_true", help="print the attribution of every reference")
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args(argv)
    changed, log = [], []
    for path in iter_files(args.root):
        text = path.read_text(encoding="utf-8")
        new = rewrite_text(path.relative_to(args.root), text, log)
        if path.suffix == ".py" and new != text:
            new = wrap_long_lines(new)
        if new != text:
            changed.append(path.relative_to(args.root))
            if not args.check:
                path.write_text(new, encoding="utf-8")
    unresolved = [line for line in log if line.startswith("UNRESOLVED")]
    for line in log if args.explain else unresolved:
        print(line)
    for line in log:
        if "keyword vote" in line:
            print("warning:", line, file=sys.stderr)
    verb = "would change" if args.check else "changed"
    for p in changed:
        print(f"{verb}: {p}")
    print(f"{len(changed)} file(s) {verb}; {len(unresolved)} unresolved reference(s).")
    if unresolved:
        return 2
    return 1 if (args.check and changed) else 0


if __name__ == "__main__":
    sys.exit(main())
