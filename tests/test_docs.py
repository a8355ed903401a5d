"""The docs match the product: README.md and docs/*.md, read as GitHub renders them.

Every relative link resolves (files and heading anchors), every file, test, CLI command,
option and `/workflow` command a page names exists, every command that exists is named,
and no page speaks of issue numbers or of design files outside the repository.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from pi_workflows.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES: tuple[Path, ...] = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
"""The pages a user reads; CHANGELOG.md is history (its links are checked too)."""
LINKED_PAGES: tuple[Path, ...] = (*PAGES, ROOT / "CHANGELOG.md")
COMMANDS_TS = ROOT / "pi_workflows" / "pi" / "extension" / "commands.ts"
INDEX_TS = ROOT / "pi_workflows" / "pi" / "extension" / "index.ts"

ISSUE_WORDS = re.compile(r"\bissues?\s+#?\d+|\blater issues?\b", re.IGNORECASE)
"""Words that point at the project's tracker: "issue 5", "issues 2-15", "a later issue"."""

OUTSIDE_DOCUMENTS = re.compile(
    r"\b(?:spec/|(?:workflow-server|client-protocol|python-port|workflow-model|pi-rpc)\.md\b)"
)
"""The design's source documents, which are not in the repository: docs/design.md says
in the project's own words what they say."""
REPOSITORY_PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)+\.(?:py|ts|sql|json|c|md|toml)$")
"""A code span that names a file of the repository (`engine/_agent_step.py`)."""
TEST_ID = re.compile(r"^(tests/[\w/.-]+\.(?:py|ts))(?:::([\w]+)(?:\[[^\]]*\])?(?:::(\w+))?)?$")
"""A test named in a code span: `tests/x.py::test_y`, `tests/x.py::TestZ::test_y`."""
PATH_ROOTS: tuple[Path, ...] = (ROOT, ROOT / "pi_workflows", ROOT / "docs")
"""Where a path in the docs may start: the repository, the package, the docs."""
PI_DOCUMENTS = frozenset({"docs/extensions.md"})
"""Pi's own documentation (in its npm package), which the Pi users' guide cites."""
FENCE = re.compile(r"^\s*(```+|~~~+)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)")
PI_WORKFLOWS = re.compile(r"(?:(?<=[\s`(\"'=])|^|(?<=bin/))pi-workflows(?=\s|$)")
SLASH_WORKFLOW = re.compile(r"(?:(?<=[\s`(\"'])|^)/workflow(?![\w-])(?:\s+(?P<sub>[a-z][a-z|-]*))?")
SEPARATORS = re.compile(r"\s(?:\|\||\||&&|;)\s")
PLACEHOLDERS = frozenset({"...", "…", "COMMAND", "SUBCOMMAND"})
TOP_LEVEL = frozenset(main.commands)
ROOT_OPTIONS_WITH_VALUE = frozenset({"--state-dir"})
SHELLS = frozenset({"sh", "bash", "console", "shell", "zsh"})
SHORT_SPAN = 6
"""Words in a code span that still reads as a command, not a quoted message."""


@dataclass(frozen=True)
class Code:
    """A code span or one line of a code block, and where it is. `strict`: an unknown
    word after `pi-workflows` is a wrong command, not prose (a shell block's line, a
    short span); in a message quoted in a span or a diagram it is prose."""

    page: Path
    line: int
    text: str
    block: bool
    strict: bool


@dataclass(frozen=True)
class Mention:
    """A CLI command named in the docs: its resolved path (or the problem with it)."""

    path: tuple[str, ...]
    problem: str | None


# --- reading Markdown ------------------------------------------------------------


def paragraphs(text: str) -> Iterator[tuple[int, str]]:
    """Prose outside code blocks, one paragraph (joined lines) at a time, with its first
    line number: code spans and links may wrap."""
    lines: list[str] = []
    start = 0
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            continue
        if opened:
            fence = opened.group(1)
        if opened or not line.strip() or HEADING.match(line):
            if lines:
                yield start, " ".join(lines)
            lines = []
            continue
        if not lines:
            start = number
        lines.append(line.strip())
    if lines:
        yield start, " ".join(lines)


def block_lines(text: str) -> Iterator[tuple[int, str, str]]:
    """Every line inside a fenced code block, with the block's language."""
    fence: str | None = None
    language = ""
    for number, line in enumerate(text.splitlines(), 1):
        opened = FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            else:
                yield number, line, language
        elif opened:
            fence = opened.group(1)
            language = line.strip()[len(fence) :].strip()


def code_spans(paragraph: str) -> Iterator[str]:
    """The inline code spans of a paragraph (a run of N backticks closes with N)."""
    index = 0
    while True:
        opening = re.compile(r"`+").search(paragraph, index)
        if opening is None:
            return
        ticks = opening.group(0)
        closing = re.compile(rf"(?<!`){ticks}(?!`)").search(paragraph, opening.end())
        if closing is None:
            return
        yield paragraph[opening.end() : closing.start()].strip()
        index = closing.end()


def without_code(paragraph: str) -> str:
    """The paragraph with its code spans blanked, so `[x](y)` in code is no link."""
    return re.sub(r"(`+)(.+?)(?<!`)\1(?!`)", lambda m: "`" + "x" * len(m.group(2)) + "`", paragraph)


def code_of(page: Path) -> Iterator[Code]:
    """Every code span and code-block line of a page."""
    text = page.read_text(encoding="utf-8")
    for number, paragraph in paragraphs(text):
        for span in code_spans(paragraph):
            yield Code(page, number, span, block=False, strict=_reads_as_command(span))
    for number, line, language in block_lines(text):
        yield Code(page, number, line, block=True, strict=language in SHELLS)


def _reads_as_command(span: str) -> bool:
    """A short span with no sentence punctuation (`pi-workflows server is stopped; ...`
    quotes a message)."""
    return len(span.split()) <= SHORT_SPAN and re.search(r"[;:,.]\s", f"{span} ") is None


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: the rendered text, lower case, punctuation
    dropped (letters, digits, `_` and `-` stay), spaces as hyphens."""
    text = LINK.sub(lambda m: m.group("text"), heading)
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The heading anchors of a Markdown page, numbered as GitHub numbers repeats."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    fence: str | None = None
    for line in page.read_text(encoding="utf-8").splitlines():
        opened = FENCE.match(line)
        if fence is not None:
            if opened and opened.group(1)[0] == fence[0] and len(opened.group(1)) >= len(fence):
                fence = None
            continue
        if opened:
            fence = opened.group(1)
            continue
        heading = HEADING.match(line)
        if heading is None:
            continue
        base = slug(heading.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def link_problems(page: Path, root: Path = ROOT) -> list[str]:
    """Every relative link of the page that does not resolve inside the repository."""
    problems: list[str] = []
    for number, paragraph in paragraphs(page.read_text(encoding="utf-8")):
        for link in LINK.finditer(without_code(paragraph)):
            target = link.group("target").strip("<>")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
                continue  # https:, mailto: and the like
            problem = _target_problem(page, target, root)
            if problem is not None:
                problems.append(f"{page.relative_to(root)}:{number}: ({target}) {problem}")
    return problems


def _target_problem(page: Path, target: str, root: Path) -> str | None:
    path_part, _, anchor = target.partition("#")
    file = page if not path_part else (page.parent / path_part).resolve()
    if not file.is_relative_to(root):
        return "points outside the repository"
    if not file.exists():
        return "names no file in the repository"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"names no heading of {file.relative_to(root)}"
    return None


# --- the CLI ------------------------------------------------------------------------


def leaf_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """The path of every command that runs something (groups only hold them)."""
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from leaf_commands(command, (*prefix, name))
        elif not command.hidden:
            yield (*prefix, name)


def options_of(command: click.Command) -> set[str]:
    names = {"--help", "-h"}
    for param in command.params:
        names.update(param.opts)
        names.update(param.secondary_opts)
    return names


def _clean(token: str) -> str:
    return token.strip("[]()\"'`.,:;")


def resolve(tokens: list[str], strict: bool = True) -> list[Mention]:
    """The commands a token list names (`run pause|resume` names two), with a problem
    when a word is no command (`strict`; else it is prose) or an option is not the
    command's."""
    index = 0
    while index < len(tokens) and tokens[index].startswith("-"):
        index += 2 if _clean(tokens[index]) in ROOT_OPTIONS_WITH_VALUE else 1
    return _walk(main, (), tokens[index:], strict)


def _walk(
    command: click.Command, path: tuple[str, ...], rest: list[str], strict: bool
) -> list[Mention]:
    if isinstance(command, click.Group):
        word = _clean(rest[0]) if rest else ""
        if not word or word.startswith("-") or word in PLACEHOLDERS or "<" in word:
            return [Mention(path, None)] if path else []
        names = word.split("|")
        if not strict and not all(name in command.commands for name in names):
            return []
        mentions: list[Mention] = []
        for name in names:
            sub = command.commands.get(name)
            if sub is None:
                mentions.append(Mention((*path, name), f"no command {' '.join((*path, name))!r}"))
            else:
                mentions.extend(_walk(sub, (*path, name), rest[1:], strict))
        return mentions
    known = options_of(command)
    for token in rest:
        word = _clean(token)
        if not word.startswith("-") or word in ("-", "--"):
            continue
        for option in word.split("|"):
            if option.split("=")[0] not in known:
                return [Mention(path, f"{' '.join(path)} has no option {option!r}")]
    return [Mention(path, None)]


def cli_mentions(code: Code) -> Iterator[Mention]:
    """The CLI commands a code span or line names: after `pi-workflows`, and a span that
    starts with a top-level command (`run wait RUN_ID`), and after a `|` or `&&` there."""
    text = code.text
    if code.block:
        text = re.sub(r"(^|\s)#.*$", "", text)  # a shell comment
    starts = [(match.end(), code.strict) for match in PI_WORKFLOWS.finditer(text)]
    if not code.block and text.split(" ", 1)[0] in TOP_LEVEL and " " in text:
        starts.insert(0, (0, False))  # `run wait RUN_ID`: a command if its words are
    for start, strict in starts:
        # A command ends at `)`, a backtick or a shell separator; a separated command
        # that starts with a top-level command (`... | run logs RUN_ID`) is one too.
        segments = SEPARATORS.split(re.split(r"[)`]", text[start:])[0])
        for position, segment in enumerate(segments):
            tokens = segment.split()
            if position > 0 and (not tokens or tokens[0] not in TOP_LEVEL):
                break
            yield from resolve(tokens, strict and position == 0)


def all_cli_mentions() -> list[tuple[Code, Mention]]:
    return [
        (code, mention)
        for page in PAGES
        for code in code_of(page)
        for mention in cli_mentions(code)
    ]


# --- the Pi extension -------------------------------------------------------------


def workflow_subcommands() -> set[str]:
    """The `/workflow` subcommands the extension's parser takes (`case "NAME":`)."""
    source = COMMANDS_TS.read_text(encoding="utf-8")
    body = source[source.index("export function parseWorkflowArgs") :]
    body = body[: body.index("\n}\n")]
    names = {name for name in re.findall(r'case "([a-z-]*)":', body) if name}
    assert names, 'parseWorkflowArgs names its subcommands as `case "NAME":` no more'
    return names


def pi_commands() -> set[str]:
    """The slash commands the extension registers (`pi.registerCommand("NAME", ...)`)."""
    return set(re.findall(r'registerCommand\("([\w-]+)"', INDEX_TS.read_text(encoding="utf-8")))


def workflow_mentions(pages: tuple[Path, ...] = PAGES) -> list[tuple[Code, str]]:
    """Every `/workflow SUB` in code, alternatives (`pause|resume`) apart."""
    found: list[tuple[Code, str]] = []
    for page in pages:
        for code in code_of(page):
            for match in SLASH_WORKFLOW.finditer(code.text):
                sub = match.group("sub")
                for name in (sub or "help").split("|"):
                    if name:
                        found.append((code, name))
    return found


def _where(code: Code) -> str:
    page = code.page.relative_to(ROOT) if code.page.is_relative_to(ROOT) else code.page.name
    return f"{page}:{code.line}: `{code.text[:80]}`"


# --- the tests ----------------------------------------------------------------------


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves_inside_the_repository(page: Path) -> None:
    assert link_problems(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_speaks_of_issue_numbers(page: Path) -> None:
    found = [
        f"{page.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        for match in ISSUE_WORDS.finditer(line)
    ]
    assert found == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_points_to_design_documents_outside_the_repository(page: Path) -> None:
    found = [
        f"{page.relative_to(ROOT)}:{number}: {match.group(0)!r}"
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        for match in OUTSIDE_DOCUMENTS.finditer(line)
    ]
    assert found == []


def test_every_file_and_test_named_in_the_docs_exists() -> None:
    assert named_file_problems(PAGES) == []


def named_file_problems(pages: tuple[Path, ...]) -> list[str]:
    """Files and tests named in code spans that do not exist: `engine/_agent_step.py`,
    `tests/server/test_x.py::test_y`, and a following `::test_z` of the same file."""
    problems: list[str] = []
    for page in pages:
        test_file: Path | None = None
        for code in code_of(page):
            if code.block:
                continue
            text = code.text.strip()
            test = TEST_ID.match(text)
            if test is not None:
                test_file = ROOT / test.group(1)
                names = [name for name in (test.group(2), test.group(3)) if name]
            elif text.startswith("::") and test_file is not None:
                names = [text[2:].split("[")[0]]
            elif REPOSITORY_PATH.match(text) and text not in PI_DOCUMENTS:
                if not any((root / text).exists() for root in PATH_ROOTS):
                    problems.append(f"{_where(code)}: no such file")
                continue
            else:
                continue
            if test_file is None or not test_file.exists():
                problems.append(f"{_where(code)}: no such file")
                continue
            source = test_file.read_text(encoding="utf-8")
            problems.extend(
                f"{_where(code)}: no {name} in {test_file.relative_to(ROOT)}"
                for name in names
                if not re.search(rf"^\s*(?:(?:async )?def|class) {name}\b|^{name} = ", source, re.M)
            )
    return problems


def test_every_cli_command_named_in_the_docs_exists() -> None:
    problems = [f"{_where(code)}: {m.problem}" for code, m in all_cli_mentions() if m.problem]
    assert problems == []


def test_every_cli_command_is_in_the_docs() -> None:
    named = {mention.path for _, mention in all_cli_mentions() if mention.problem is None}
    missing = [" ".join(path) for path in leaf_commands(main) if path not in named]
    assert missing == []


def test_every_workflow_command_named_in_the_docs_exists() -> None:
    known = workflow_subcommands()
    unknown = [
        f"{_where(code)}: /workflow {name}"
        for code, name in workflow_mentions()
        if name not in known
    ]
    assert unknown == []


def test_every_workflow_command_and_pi_command_is_in_the_docs() -> None:
    named = {name for _, name in workflow_mentions()}
    assert sorted(workflow_subcommands() - named) == []
    text = "\n".join(code.text for page in PAGES for code in code_of(page))
    missing = [
        name
        for name in sorted(pi_commands())
        if not re.search(rf"(?<![\w/.-])/{name}(?![\w-])", text)
    ]
    assert missing == []


# --- the checker catches what it is for ----------------------------------------------


def test_the_checker_finds_a_broken_link_an_unknown_command_and_a_wrapped_span(
    tmp_path: Path,
) -> None:
    root = tmp_path.resolve()
    (root / "docs").mkdir()
    (root / "docs" / "guide.md").write_text("# Install the extension\n", encoding="utf-8")
    page = root / "docs" / "probe.md"
    page.write_text(
        "# A heading, with `code`\n\nSee [it](#a-heading-with-code), [no](#nowhere),\n"
        "[gone](missing.md), [up](../../x.md) and [guide](guide.md#install-the-extension).\n\n"
        "Run `pi-workflows run recover RUN_ID --confirm` or `pi-workflows\nrun frobnicate`,\n"
        "`run pause|resume RUN_ID` and `/workflow adopt-all`.\n\n"
        "See `engine/_nowhere.py`, `tests/test_docs.py::test_nothing_like_this` and\n"
        "`::test_the_checker_finds_a_broken_link_an_unknown_command_and_a_wrapped_span`.\n\n```sh\n"
        "[not](a-link.md) pi-workflows run wait RUN_ID --json  # pi-workflows run nope\n```\n",
        encoding="utf-8",
    )
    problems = link_problems(page, root)
    mentions = [m for code in code_of(page) for m in cli_mentions(code)]
    assert [p.split(": ", 1)[1] for p in problems] == [
        "(#nowhere) names no heading of docs/probe.md",
        "(missing.md) names no file in the repository",
        "(../../x.md) points outside the repository",
    ]
    assert [(m.path, m.problem) for m in mentions] == [
        (("run", "recover"), "run recover has no option '--confirm'"),
        (("run", "frobnicate"), "no command 'run frobnicate'"),
        (("run", "pause"), None),
        (("run", "resume"), None),
        (("run", "wait"), None),
    ]
    assert [p.split(": ", 2)[2] for p in named_file_problems((page,))] == [
        "no such file",
        "no test_nothing_like_this in tests/test_docs.py",
    ]
    assert [name for _, name in workflow_mentions((page,))] == ["adopt-all"]
    assert "adopt-all" not in workflow_subcommands()
    assert slug("Run views: `run show` and **pages**") == "run-views-run-show-and-pages"
