"""The docs read in one sitting: outside code, tables, headings, images and HTML comments,
a page's sentences run 20 words on average and none past 40 (issue 49: the admin docs
people like run 15 to 20).

The pages are read as Markdown (markdown-it-py, the parser MyST builds on), not as lines of
text: a bullet is its own sentence, and inline code is one word however long.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from markdown_it.token import Token

ROOT = Path(__file__).resolve().parents[2]
MEAN = 20
LONGEST = 40
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIPPED = {"table_open": "table_close", "heading_open": "heading_close"}
"""Blocks whose text is not prose (code and HTML are single tokens, left out below)."""
ABBREVIATIONS = re.compile(r"\b(e\.g|i\.e|etc|vs|cf)\.", re.I)
END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")
"""A sentence's end: its stop, any closing quote or bracket, then a space."""
CODE = "\x00"
"""What a piece of inline code becomes: one word, with no stop inside it."""


def blocks(markdown: str) -> list[str]:
    """The text of each paragraph outside tables and headings: a bullet's paragraph is a
    block of its own, inline code is one word, an image is nothing."""
    found = []
    closing: list[str] = []
    for token in MarkdownIt("commonmark").enable("table").parse(markdown):
        if closing:
            if token.type == closing[-1]:
                closing.pop()
            elif token.type in SKIPPED:
                closing.append(SKIPPED[token.type])
        elif token.type in SKIPPED:
            closing.append(SKIPPED[token.type])
        elif token.type == "inline":
            found.append(text(token))
    return [b for b in found if b.strip()]


def text(inline: Token) -> str:
    parts = []
    for child in inline.children or []:
        if child.type == "text":
            parts.append(child.content)
        elif child.type == "code_inline":
            parts.append(CODE)
        elif child.type in ("softbreak", "hardbreak"):
            parts.append(" ")
    return "".join(parts)


def sentences(block: str) -> list[str]:
    plain = ABBREVIATIONS.sub(lambda m: m.group(1), block)
    return [s.strip() for s in END.split(plain) if s.strip()]


def words(sentence: str) -> int:
    """Words, not marks: a dash standing alone is not one."""
    return sum(1 for w in sentence.split() if w == CODE or re.search(r"\w", w))


def shown(sentence: str, n: int = 8) -> str:
    """A sentence's first words, as a writer searches the page for them."""
    return " ".join(sentence.replace(CODE, "`…`").split()[:n]) + " …"


def measure(markdown: str) -> tuple[float, list[tuple[int, str]]]:
    """The mean sentence length in words, and each sentence over ``LONGEST`` words."""
    counted = [(words(s), s) for b in blocks(markdown) for s in sentences(b)]
    counted = [(n, s) for n, s in counted if n]
    mean = sum(n for n, _ in counted) / len(counted) if counted else 0.0
    return mean, [(n, s) for n, s in counted if n > LONGEST]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_pages_sentences_run_20_words_on_average_and_none_past_40(page: Path) -> None:
    mean, long = measure(page.read_text())
    name = page.relative_to(ROOT).as_posix()
    problems = [f"{name}: {len(long)} sentences over {LONGEST} words"] if long else []
    problems += [f"  {n} words: {shown(s)}" for n, s in long]
    if mean > MEAN:
        problems.insert(0, f"{name}: the mean sentence runs {mean:.1f} words (at most {MEAN})")
    assert not problems, "\n".join(problems)


def test_only_prose_counts_and_a_long_sentence_is_named_by_its_first_words() -> None:
    page = "\n".join(
        [
            "# A heading of many words that would be one long sentence if it counted",
            "",
            "Run `jupyter gpubroker status --json --all-users` to see it. Then stop.",
            "",
            "- one idea",
            "- another idea",
            "",
            "| a table cell | is not prose | however long it runs |",
            "| --- | --- | --- |",
            "",
            "```bash",
            "echo code. Is not. Prose either " * 20,
            "```",
            "",
            "<!-- " + "a comment " * 50 + "-->",
            "",
            "![an image's words](x.png) " + "word " * 41 + "end, e.g. here.",
        ]
    )
    counted = [words(s) for b in blocks(page) for s in sentences(b)]
    assert counted == [5, 2, 2, 2, 44]
    mean, long = measure(page)
    assert mean == 11.0
    assert [shown(s) for _, s in long] == ["word word word word word word word word …"]
