"""The README and the docs against what they describe (issue 37): every command, option, choice and default the
README names is the parser's (hermetic.cli.parser.build_parser, its subparsers walked), every option of every
command is in the README's table, the Python range is pyproject's and hermetic.interpreter's, the completion
advice is --help's, the exit codes are hermetic.errors'; no doc outside docs/measurements/ carries a date; every
relative link of the README and the docs reaches a file and, with #, a heading. Each check is a function that
returns the problems it found, run once on the real files and once on a doctored snippet, so that it can fail."""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest

from hermetic import errors, interpreter
from hermetic.cli.parser import DESCRIPTION, build_parser

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
ROW = re.compile(r"^\| `hermetic [^|]*?(?:\\\|[^|]*?)*\| ", re.M)
CODE = re.compile(r"`([^`]+)`")


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its name, `key generate` as one name."""
    out: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = subparsers(sub)
                out.update({f"{name} {n}": p for n, p in nested.items()} if nested else {name: sub})
    return out


def common_options(parser: argparse.ArgumentParser) -> set[str]:
    """The options every command takes (the top parser's, less --help and --version)."""
    return {o for a in parser._actions for o in a.option_strings if o.startswith("-")} - {"-h", "--help",
                                                                                          "--version"}


def options_of(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {o: a for a in parser._actions for o in a.option_strings}


def table_rows(text: str) -> list[tuple[str, str]]:
    """The command table: (its first cell, with `\\|` for a |, and the rest of the row)."""
    rows = []
    for line in text.splitlines():
        if line.startswith("| `hermetic "):
            cells = re.split(r"(?<!\\)\|", line)
            rows.append((cells[1].strip(), "|".join(cells[2:])))
    return rows


def command_problems(text: str, parser: argparse.ArgumentParser) -> list[str]:
    """Each command row of the README against the parser: the command exists; each option it names exists, takes
    a value exactly when the README gives one, and has the README's choices; every option the command has is
    named; every command has a row; the options every command takes are the ones the README lists."""
    problems: list[str] = []
    commands = subparsers(parser)
    common = common_options(parser)
    seen: set[str] = set()
    for cell, _ in table_rows(text):
        spans = CODE.findall(cell)
        words = spans[0].split()
        name = " ".join(words[1:3]) if " ".join(words[1:3]) in commands else words[1]
        names = [name] + [s for s in spans[1:] if s in commands]
        if name not in commands:
            problems.append(f"README: `hermetic {name}` is no command of the parser")
            continue
        seen.update(names)
        rest = spans[0].split(name, 1)[1]
        named: set[str] = set()
        for opt, value in re.findall(r"(--[\w-]+)(?: ([^\s\]]+))?", rest):
            named.add(opt)
            for n in names:
                action = options_of(commands[n]).get(opt)
                if action is None:
                    problems.append(f"README: `hermetic {n}` has no option {opt}")
                    continue
                takes_value = action.nargs != 0
                if takes_value != bool(value):
                    problems.append(f"README: `hermetic {n} {opt}` {'takes' if takes_value else 'takes no'} value")
                if value and "\\|" in value and set(value.split("\\|")) != set(action.choices or ()):
                    problems.append(f"README: `hermetic {n} {opt}` choices {value.split(chr(92) + '|')} are not "
                                    f"the parser's {list(action.choices or ())}")
        for word in re.sub(r"\[[^\]]*\]", "", rest).split():
            if "\\|" in word:
                positional = [a for a in commands[name]._actions if not a.option_strings and a.choices]
                if not positional or set(word.split("\\|")) != set(positional[0].choices or ()):
                    problems.append(f"README: `hermetic {name}` takes {word.split(chr(92) + '|')}, the parser "
                                    f"{list(positional[0].choices or ()) if positional else 'no choice'}")
        for n in names:
            missing = set(options_of(commands[n])) - common - {"-h", "--help"} - named
            missing = {o for o in missing if o.startswith("--")}
            if missing:
                problems.append(f"README: the row of `hermetic {n}` lacks {sorted(missing)}")
    if not_there := set(commands) - seen:
        problems.append(f"README: no row for {sorted(not_there)}")
    m = re.search(r"Every command takes, before or after its name: (.*?)\n\n", text, re.S)
    listed = {w for span in CODE.findall(m.group(1)) for w in span.split() if w.startswith("-")} if m else set()
    if listed != common:
        problems.append(f"README: every command takes {sorted(listed)}; the parser says {sorted(common)}")
    return problems


def option_mention_problems(text: str, parser: argparse.ArgumentParser) -> list[str]:
    """Every --option anywhere in the README is an option of some command; every `CMD --opt` defaults to `X`
    is the parser's default; every HERMETIC_ variable is one hermetic's source reads."""
    problems = []
    every = set(options_of(parser)) | {o for p in subparsers(parser).values() for o in options_of(p)}
    for opt in sorted(set(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", text))):
        if opt not in every:
            problems.append(f"README names {opt}, which no command has")
    commands = subparsers(parser)
    for name, opt, default in re.findall(r"`(\w+) (--[\w-]+)` defaults to `([^`]+)`", text):
        action = options_of(commands[name]).get(opt) if name in commands else None
        if action is None or str(action.default) != default:
            problems.append(f"README: `{name} {opt}` defaults to {default!r}, the parser to "
                            f"{action.default if action else 'nothing'!r}")
    source = "\n".join(p.read_text() for p in (REPO / "hermetic").rglob("*.py"))
    for var in sorted(set(re.findall(r"HERMETIC_[A-Z_]+", text)) - {"HERMETIC_REQUIRE_ALL"}):
        if var not in source:
            problems.append(f"README names {var}, which hermetic never reads")
    return problems


def python_problems(text: str) -> list[str]:
    """The README's Python range is pyproject's requires-python; the interpreters a recipe may name are
    hermetic.interpreter.SUPPORTED; no other range is given."""
    problems = []
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    low = requires.removeprefix(">=")
    quoted = re.findall(r'requires-python = "([^"]+)"', text)
    if quoted != [requires]:
        problems.append(f"README quotes requires-python {quoted}, pyproject says {requires!r}")
    if re.findall(r"Python (\d+\.\d+) or newer", text) != [low]:
        problems.append(f"README: 'Python X or newer' is not pyproject's {low}")
    supported = "-".join(".".join(map(str, v)) for v in interpreter.SUPPORTED)
    ranges = re.findall(r"(3\.\d+-3\.\d+)", text)
    if ranges != [supported]:
        problems.append(f"README gives the Python ranges {ranges}; hermetic.interpreter supports {supported}")
    return problems


def completion_problems(text: str, parser: argparse.ArgumentParser) -> list[str]:
    """The README's install lines for the completion scripts are what `hermetic completion --help` says."""
    block = text.split("### Shell completion", 1)[-1].split("```sh", 1)[-1].split("```", 1)[0]
    shell = next(a for a in subparsers(parser)["completion"]._actions if a.dest == "shell")
    wanted = re.findall(r"eval \"\$\(hermetic completion bash\)\"|hermetic completion zsh > \S+|fpath=\([^)]*\)",
                        block)
    problems = [f"README: completion advice {w!r} is not in `hermetic completion --help`" for w in wanted
                if w not in (shell.help or "")]
    if len(wanted) != 3:
        problems.append(f"README: the completion block gives {wanted}, not bash's eval, zsh's file and its fpath")
    return problems


def exit_code_problems(text: str) -> list[str]:
    rows = dict(re.findall(r"^\| (\d) \| ([^|]+)\|", text, re.M))
    problems = [] if set(rows) == {"0", "1", "2", "3", str(errors.WORK_NEEDED)} else [
        f"README: exit codes {sorted(rows)}"]
    if not rows.get(str(errors.WORK_NEEDED), "").startswith("`realize --check`"):
        problems.append(f"README: exit {errors.WORK_NEEDED} is not '`realize --check`' (errors.WORK_NEEDED)")
    if f"{errors.WORK_NEEDED} `realize --check`" not in DESCRIPTION:
        problems.append(f"--help: exit {errors.WORK_NEEDED} is not '`realize --check`'")
    for cls, words in ((errors.HermeticError, "the work failed"), (errors.BadInput, "bad input"),
                       (errors.PreconditionFailed, "a precondition was not met")):
        if not rows.get(str(cls.exit_code), "").startswith(words):
            problems.append(f"README: exit {cls.exit_code} is not '{words}' ({cls.__name__})")
        if f"{cls.exit_code} {words}" not in DESCRIPTION:
            problems.append(f"--help: exit {cls.exit_code} is not '{words}'")
    return problems


MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
DATE = re.compile(rf"\b20\d\d-[01]\d-[0-3]\d\b|\b(?:{MONTHS}|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)\.? "
                  rf"(?:\d{{1,2}}(?:st|nd|rd|th)?|20\d\d)\b|\b\d{{1,2}} (?:{MONTHS})\b")


def date_problems(name: str, text: str) -> list[str]:
    return [f"{name}:{n}: a date ({m.group(0)}): dated figures go to docs/measurements/"
            for n, line in enumerate(text.splitlines(), 1) for m in DATE.finditer(line)]


def anchors(path: Path) -> set[str]:
    """GitHub's ids of a Markdown file's headings (outside code blocks)."""
    out, fenced = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#+ (.*)", line)):
            out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def link_problems(path: Path) -> list[str]:
    """Every relative link of a Markdown file reaches a file of the repository (or a folder), and its #anchor a
    heading there; none leaves the repository."""
    problems, text = [], re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.is_relative_to(REPO) or not dest.exists():
            problems.append(f"{path.relative_to(REPO)}: the link {target} reaches nothing in the repository")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{path.relative_to(REPO)}: the link {target} names no heading of {file or path.name}")
    return problems


def docs() -> list[Path]:
    return [README, REPO / "bench" / "README.md", *sorted((REPO / "docs").glob("*.md"))]


# --- the real files -------------------------------------------------------------------------------------------

def test_the_readme_is_short_and_self_contained() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 140
    assert "../shared" not in text and "PRODUCT.md" not in text
    assert "python3 -m pip install -e . torch==2.14.1 && hermetic realize recipes/p2p.toml && hermetic run " \
           "runner/worker.toml" in text


def test_the_readme_commands_options_and_choices_are_the_parsers() -> None:
    parser = build_parser()
    assert command_problems(README.read_text(), parser) == []
    assert option_mention_problems(README.read_text(), parser) == []


def test_the_readme_python_range_completion_and_exit_codes_are_the_codes() -> None:
    text = README.read_text()
    assert python_problems(text) == []
    assert completion_problems(text, build_parser()) == []
    assert exit_code_problems(text) == []


def test_no_doc_outside_measurements_carries_a_date() -> None:
    assert [p for path in docs() for p in date_problems(str(path.relative_to(REPO)), path.read_text())] == []


def test_every_relative_link_of_the_docs_reaches_its_file_and_heading() -> None:
    pages = [*docs(), *sorted((REPO / "docs" / "measurements").glob("*.md"))]
    assert [p for page in pages for p in link_problems(page)] == []


def test_each_measurement_says_what_where_when_and_how() -> None:
    for page in sorted((REPO / "docs" / "measurements").glob("*.md")):
        if page.name != "README.md":
            text = page.read_text()
            assert all(f"* **{k}:**" in text for k in ("What", "Where", "When", "Command", "Raw files")), page
            assert f"]({page.name})" in (REPO / "docs" / "measurements" / "README.md").read_text(), page


# --- the checks can fail ----------------------------------------------------------------------------------------

RUN_ROW = ("| `hermetic run RUNNER.toml [--device auto\\|cpu\\|gpu] [--gpu N] [--peer N] [--repetitions N] "
           "[--power-cap W] [--lock-timeout S] [--states FILE] [--record-digests] [--jobs N] "
           "[--sandbox auto\\|required\\|off] [--remote-cache URL] [--remote-cache-mode off\\|ro\\|rw]` | measure |")


@pytest.mark.parametrize("doctor, found", [
    (lambda row: row.replace("[--gpu N]", "[--gpu N] [--frobnicate]"), "has no option --frobnicate"),
    (lambda row: row.replace(" [--states FILE]", ""), "lacks ['--states']"),
    (lambda row: row.replace("auto\\|cpu\\|gpu", "cpu\\|gpu"), "choices ['cpu', 'gpu']"),
    (lambda row: row.replace("[--record-digests]", "[--record-digests DIR]"), "--record-digests` takes no value"),
    (lambda row: row.replace("hermetic run", "hermetic measure"), "`hermetic measure` is no command"),
])
def test_the_command_check_fails_on_a_doctored_readme(doctor: Callable[[str], str], found: str) -> None:
    text = README.read_text()
    real = next(line for line in text.splitlines() if line.startswith("| `hermetic run "))
    assert real.split(" | ")[0] == RUN_ROW.split(" | ")[0], "RUN_ROW is the README's run row"
    problems = command_problems(text.replace(real, doctor(real)), build_parser())
    assert any(found in p for p in problems), problems


def test_the_other_readme_checks_fail_on_doctored_snippets() -> None:
    parser = build_parser()
    text = README.read_text()
    assert any("--dry-runs" in p for p in option_mention_problems(text + "\nuse `--dry-runs`\n", parser))
    assert any("'20'" in p for p in option_mention_problems(text.replace("defaults to `19`", "defaults to `20`"),
                                                              parser))
    assert any("HERMETIC_NOPE" in p for p in option_mention_problems(text + "\n`HERMETIC_NOPE=1`\n", parser))
    assert python_problems(text.replace("3.11-3.14", "3.11-3.13"))
    assert python_problems(text.replace("Python 3.11 or newer", "Python 3.10 or newer"))
    assert completion_problems(text.replace("~/.zfunc/_hermetic", '"${fpath[1]}/_hermetic"'), parser)
    assert exit_code_problems(text.replace("| 2 | bad input", "| 2 | wrong input"))
    assert command_problems(text.replace("`-q`/`--quiet`", "`-x`/`--quiet`"), parser)


def test_the_date_check_finds_dates_and_passes_plain_figures() -> None:
    doctored = "measured 2026-12-03 on 2 cores\nsince December 3 it compiles\nthe 3 March run\nin Nov. 2026\n"
    assert len(date_problems("x.md", doctored)) == 4
    assert date_problems("x.md", "0.52x in 8.02 s; receipt run-draft-20261202T023815-9e27fac6d8ce.json; "
                                 "it may 3 jobs; 3.11-3.14; 10:05-10:31; 2,429.5 s") == []


def test_the_link_check_finds_a_broken_link() -> None:
    fake = REPO / ".cache" / "test_readme_links.md"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("[a](../README.md#no-such-heading) [b](../nowhere.md) [c](../README.md#docs) [d](../../x)\n")
    try:
        problems = link_problems(fake)
    finally:
        fake.unlink()
    assert len(problems) == 3 and "no-such-heading" in problems[0] and "nowhere.md" in problems[1], problems
