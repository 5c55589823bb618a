"""The docs stay true: the flags page is the parser's own (every flag documented once), the README stays one
screen and opens with the two commands CI runs, every link between the pages reaches a file and a heading, and
what the pages count or list (eval tasks per suite, audit detectors, the jobs that resume, the layers and their
modules) is what the code has."""

from __future__ import annotations

import re

from support.paths import ROOT

from mieb_ray.audit import job
from mieb_ray.cli import parser, reference
from mieb_ray.evals.registry import SUITES
from mieb_ray.formats import DETECTORS as METHODS

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


def _readme_before_benchmarks() -> str:
    """The README above its benchmarks table, whose rows say what each recorded run scored at the time."""
    return (ROOT / "README.md").read_text().split("\n## Benchmarks")[0]


# How the README and docs/evals.md count each suite's tasks ("23 zero-shot"); BioVITA is one task, named
COUNTED = {"zeroshot": "zero-shot", "linear_probe": "linear-probe", "clustering": "clustering",
           "retrieval": "SciMMIR retrieval", "mteb": "other MIEB"}


def test_the_task_counts_the_docs_state_are_the_registry_s():
    tasks = {suite.name: len(suite.tasks) for suite in SUITES}
    assert set(tasks) == {*COUNTED, "biovita"}, "a new suite: count it in the README's eval row, then here"
    readme = _readme_before_benchmarks()
    row = next(line for line in readme.splitlines() if line.startswith("| eval |"))
    for suite, words in COUNTED.items():  # the eval row counts every suite
        assert f"{tasks[suite]} {words}" in row, (suite, row)
    by_words = {words: suite for suite, words in COUNTED.items()}
    pattern = r"\b(\d+) (" + "|".join(map(re.escape, by_words)) + r")\b"
    for text in (readme, (ROOT / "docs" / "evals.md").read_text()):  # and every other count agrees
        for number, words in re.findall(pattern, text):
            assert int(number) == tasks[by_words[words]], (number, words)


def test_every_audit_detector_is_named_where_the_docs_list_them():
    cli = (ROOT / "docs" / "cli.md").read_text()
    listed = ", ".join(METHODS)
    assert f"({listed})" in next(line for line in cli.splitlines() if line.startswith("| `--exclude-detectors` |"))
    assert f"(detectors: {listed})" in cli.split("## mieb-ray audit\n")[1].split("\n|")[0]  # the command's line
    assert f"({listed}:" in job.__doc__.splitlines()[0]
    evals = (ROOT / "docs" / "evals.md").read_text()
    assert "per detector (" + ", ".join(f"`{m}`" for m in METHODS) + ")" in evals  # the clean block's counts
    audit = (ROOT / "docs" / "audit.md").read_text()
    for n, method in enumerate(METHODS, 1):  # the page's numbered list of detectors
        assert f"  {n}. **{method}**" in audit, method
    assert f"\n  {len(METHODS) + 1}. **" not in audit


def test_the_readme_says_which_jobs_resume():
    commands = next(a for a in parser()._actions if hasattr(a, "choices") and a.choices).choices
    readme = _readme_before_benchmarks()
    jobs = re.findall(r"^\| (\w+) \| .* \| \[docs/", readme, re.M)  # the jobs table's rows
    assert jobs
    said = next(p for p in readme.split("\n\n") if "`--resume` finishes" in p)
    for name in jobs:
        if "--resume" in commands[name]._option_string_actions:
            assert f"`{name}`" in said.split("`--resume` finishes")[1].split(";")[0], name
        else:
            assert f"`{name}` has no `--resume`" in said, name


def test_the_layers_are_the_import_contract_s_and_name_every_module():
    page = (ROOT / "docs" / "architecture.md").read_text()
    block = page.split("## The layers\n")[1].split("```\n")[1]
    heads = [re.split(r"\s{2,}", line)[0] for line in block.splitlines() if line and not line.startswith(" ")]
    contract = (ROOT / "pyproject.toml").read_text().split('type = "layers"')[1]  # no tomllib on Python 3.10
    layers = re.findall(r'"([^"]+)"', contract.split("layers = [")[1].split("]")[0])
    assert [h.replace(".py", "").replace("/", "") for h in heads] == [x.replace("mieb_ray.", "") for x in layers]
    package = ROOT / "mieb_ray"
    for module in sorted(package.rglob("*.py")):
        if module.stem not in ("__init__", "__main__"):
            assert re.search(rf"\b{module.stem}\b", block), module.relative_to(package)
    for suite in SUITES:
        assert re.search(rf"\b{suite.name}\b", block), suite.name
