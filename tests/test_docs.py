"""The docs stay true: the flags page is the parser's own (every flag documented once), the README stays one
screen and opens with the two commands CI runs, and every link between the pages reaches a file and a heading."""

from __future__ import annotations

import re
from pathlib import Path

from mieb_ray.cli import parser, reference

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_flags_page_is_generated_from_the_parser():
    page = (ROOT / "docs" / "cli.md").read_text()
    assert page == reference(), "docs/cli.md is stale: regenerate it as docs/architecture.md says"
    commands = next(a for a in parser()._actions if hasattr(a, "choices") and a.choices).choices
    for name, command in commands.items():  # every flag of every command is on the page, in its section
        section = page.split(f"## mieb-ray {name}\n")[1].split("\n## ")[0]
        for action in command._actions:
            for flag in action.option_strings if action.dest != "help" else ():
                assert f"`{flag}`" in section, (name, flag)


def test_the_readme_is_one_screen_and_opens_with_the_commands_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 8192
    first = readme.split("```bash\n", 1)[1].split("```", 1)[0]
    demo, tests = [line for line in first.splitlines() if line and not line.startswith("#")]
    assert demo.endswith("mieb-ray demo") and tests.endswith(".venv/bin/pytest")
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests.removeprefix("python3 -m venv .venv && ") in ci


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_pages_resolves():
    for page in PAGES:
        for target in re.findall(r"\]\(([^)#\s]+\.md)?(#[^)\s]+)?\)", page.read_text()):
            path, anchor = target
            if not path and not anchor:
                continue
            dest = (page.parent / path) if path else page
            assert dest.exists(), (page.name, path)
            if anchor:
                headings = {_slug(h) for h in re.findall(r"^#+ (.+)$", dest.read_text(), re.M)}
                assert anchor[1:] in headings, (page.name, path, anchor)
