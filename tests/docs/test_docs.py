"""The README is a front door and the documentation holds together: links resolve, and
every command the quick start shows is one a test or CI runs, exactly as written.

The site itself is built by `.ci/run` with warnings as errors (`sphinx-build -W -n`),
which also fails on a link to a missing page or heading inside `docs/`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")


def anchors(page: Path) -> set[str]:
    """The heading anchors MyST (and GitHub) give a page's headings."""
    found = set()
    for line in page.read_text().splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower().replace("`", ""))
            found.add(text.replace(" ", "-"))
    return found


def shown_commands(page: Path) -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", page.read_text(), re.S)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readme_is_a_front_door_with_the_two_commands_first() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    first = readme.split("```bash\n")[1].split("```")[0].splitlines()
    assert first == ['pip install -e ".[test]" && jupyter gpubroker demo', "python -m pytest"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_and_image_in_the_docs_resolves(page: Path) -> None:
    text = page.read_text()
    broken = []
    for target in LINK.findall(text) + IMAGE.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # the web: the checks here cannot reach it
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists() or anchor and anchor not in anchors(file):
            broken.append(target)
    assert broken == []


def test_every_command_the_quick_start_shows_is_run_by_a_test_or_ci() -> None:
    """A command shown in the README or the quick start names a test (or `.ci/run`)
    that runs it as written; a new command without one fails here."""
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    ci = (ROOT / ".ci" / "run").read_text()
    shown = {
        c for p in (ROOT / "README.md", ROOT / "docs" / "quickstart.md") for c in shown_commands(p)
    }
    installs = {c for c in shown if c.startswith("pip install -e")}
    # CI installs the dev extra, which holds the test extra, from the same checkout
    assert 'pip install --quiet -e ".[dev]"' in ci
    unrun = []
    start = r'^\s*(?:job "[^"]*" )?'  # a line of .ci/run, or its job of that name
    end = r"(?: &&| \|\||  #|$)"  # then more, a failure counted, a comment, or nothing
    for command in sorted(shown - installs):
        if re.search(rf"{start}{re.escape(command)}{end}", ci, re.M):
            continue  # .ci/run runs the whole line
        for part in command.split(" && "):
            if part.startswith("pip install -e"):
                continue
            quoted = f'"{part}"' in sources or f"'{part}'" in sources
            if not quoted and not re.search(rf"(?:{start}|&& ){re.escape(part)}{end}", ci, re.M):
                unrun.append(part)
    assert unrun == []


EXTEND = re.compile(r"(?:jupyter gpubroker|%gpu) extend[^`\n#]*")
"""A command that extends a time limit, as a page shows it (in code, up to a comment)."""


def test_every_extend_command_the_docs_show_is_run_by_a_test() -> None:
    """Each `jupyter gpubroker extend ...` and `%gpu extend ...` the docs show, but for
    the placeholder lease ``l-...``, is run as written by a test (quoted in its source)."""
    tests = [p for p in (ROOT / "tests").rglob("*.py") if p.parent.name != "docs"]
    sources = "\n".join(p.read_text() for p in tests)
    shown = {c.strip() for page in PAGES for c in EXTEND.findall(page.read_text())}
    shown = {c for c in shown if "l-..." not in c}
    assert {"jupyter gpubroker extend --by 1h", "%gpu extend 1h"} <= shown
    assert [c for c in sorted(shown) if f'"{c}"' not in sources and f"'{c}'" not in sources] == []
