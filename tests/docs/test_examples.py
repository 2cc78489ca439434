"""The documentation's examples that are not run as Python: ```python notest blocks compile, CLI commands run.

The ```python blocks themselves run as tests of their own (conftest.py at the repository root). Here:
- every ```python notest block (a real provider, a real cluster) is compiled, so its syntax holds;
- every `skynet-dspy ...` command of a ```bash / ```sh / ```shell / ```console block runs as written, from the
  repository root (a temporary folder where the root's files are linked), against the scripted model server: it must
  exit 0 and print no warning. A synopsis with placeholders belongs in a ```text block.
Fences are read with markdown-it, the parser pytest-markdown-docs uses, so both see the same blocks.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from markdown_examples import like_the_root
from markdown_it import MarkdownIt

from skynet_dspy.devserver import scripted_server

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELLS = {"bash", "sh", "shell", "console"}
PYTHONS = {"python", "py", "python3"}


@dataclass(frozen=True)
class Fence:
    page: Path
    line: int  # 1-based line of the fence's first code line
    language: str
    options: frozenset[str]
    code: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def fences(page: Path) -> list[Fence]:
    found = []
    for token in MarkdownIt("commonmark").parse(page.read_text(encoding="utf-8")):
        if token.type == "fence" and token.map:
            language, *options = token.info.split() or [""]
            found.append(Fence(page, token.map[0] + 2, language, frozenset(options), token.content))
    return found


def commands(fence: Fence) -> list[str]:
    """The `skynet-dspy ...` command lines of a shell block (a trailing backslash continues a line)."""
    lines, pending = [], ""
    for raw in fence.code.splitlines():
        line = pending + raw.strip().removeprefix("$ ")
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line.startswith("skynet-dspy "):
            lines.append(line)
    return lines


ALL = [fence for page in PAGES for fence in fences(page)]
NOTEST = [fence for fence in ALL if fence.language in PYTHONS and "notest" in fence.options]
COMMANDS = [(fence, command) for fence in ALL if fence.language in SHELLS for command in commands(fence)]


def test_the_documentation_has_examples_of_each_kind():
    assert len(PAGES) > 10 and ROOT / "docs" / "contract.md" in PAGES
    assert NOTEST, "no ```python notest block found: the marker or the parser changed"
    assert any("check" in command for _, command in COMMANDS) and any("score" in c for _, c in COMMANDS)


@pytest.mark.parametrize("fence", NOTEST, ids=[fence.where for fence in NOTEST])
def test_a_notest_block_compiles(fence: Fence):
    compile(fence.code, fence.where, "exec", dont_inherit=True)


@pytest.fixture(scope="module")
def model_url():
    with scripted_server() as server:
        yield server.url


@pytest.mark.parametrize(("fence", "command"), COMMANDS, ids=[f"{fence.where} {c[:60]}" for fence, c in COMMANDS])
def test_a_command_runs_without_warnings(fence: Fence, command: str, model_url: str, tmp_path: Path):
    like_the_root(tmp_path)
    words = shlex.split(command, comments=True)
    script = Path(sys.executable).with_name("skynet-dspy")
    program = [str(script)] if script.exists() else [sys.executable, "-m", "skynet_dspy"]
    env = {**os.environ, "OPENAI_API_BASE": model_url, "OPENAI_API_KEY": "sk-local-docs-example"}
    done = subprocess.run([*program, *words[1:]], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    said = f"{fence.where}: {command}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 0, said
    assert "warning" not in done.stderr.lower(), said
    assert "[warn]" not in done.stdout and "warning(s)" not in done.stdout, said


def _anchors(page: Path) -> set[str]:
    """The heading anchors MkDocs gives `page` (its toc extension's slugs)."""
    from markdown.extensions.toc import slugify

    return {slugify(token.content, "-") for tokens in [MarkdownIt("commonmark").parse(page.read_text("utf-8"))]
            for before, token in zip(tokens, tokens[1:], strict=False) if before.type == "heading_open"}


def test_every_page_the_code_cites_exists_with_its_anchor():
    # Docstrings and comments cite the documentation as docs/<page>.md#<anchor> (the metric contract above all).
    cited = set()
    for source in [*(ROOT / "skynet_dspy").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]:
        cited.update(re.findall(r"docs/([\w./-]+\.md)(?:#([\w-]+))?", source.read_text(encoding="utf-8")))
    assert ("contract.md", "return-value") in cited
    broken = [f"docs/{page}#{anchor}" for page, anchor in sorted(cited)
              if not (ROOT / "docs" / page).is_file() or (anchor and anchor not in _anchors(ROOT / "docs" / page))]
    assert broken == []


def test_the_readme_fits_on_a_few_screens_and_its_links_into_the_site_resolve():
    # mkdocs build --strict checks the links inside docs/; the README is outside it, read on GitHub.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 200
    links = re.findall(r"\]\((docs/[^)#\s]+\.md)(?:#([\w-]+))?\)", readme)
    assert len({page for page, _ in links}) >= 12  # every page of the site is linked from the README
    broken = [f"{page}#{anchor}" for page, anchor in links
              if not (ROOT / page).is_file() or (anchor and anchor not in _anchors(ROOT / page))]
    assert broken == []
