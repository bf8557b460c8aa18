"""Every link of the documentation resolves: README.md, every ``docs/*.md`` and ``bench/README.md``.

- A relative link or image names a file or folder of the repository (``/path`` from the repository root,
  anything else from the page's folder); it may not leave the repository, nor name a file git ignores.
- An anchor (``#anchor`` in the page, ``page.md#anchor`` in another) matches a heading of its target by
  GitHub's slug rules: the heading's text lowercased, every character but letters, digits, ``-``, ``_``
  and spaces dropped, each space a ``-``; a repeated slug gets ``-1``, ``-2``, ... An ``id``/``name``
  attribute of an HTML tag is an anchor too. A file that is not Markdown takes only GitHub's line
  anchors (``#L10``, ``#L10-L20``).
- An ``http(s)`` link is not fetched (the tests run offline); it must be a well-formed URL.

Links inside code (fenced blocks and code spans) are text, not links, and are not checked. The README
stays an orientation: at most 400 lines, with its two set-up commands.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[2]


def documentation(root: Path) -> list[Path]:
    """The pages whose links are checked."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), root / "bench" / "README.md"]


# ------------------------------------------------------------------------------------------ parsing

_FENCE = re.compile(r"^\s*(`{3,}|~{3,})")
_CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.DOTALL)
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(([^)]*)\)")
_TITLE = re.compile(r"\"[^\"]*\"|'[^']*'|\([^)]*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)", re.MULTILINE)
_AUTOLINK = re.compile(r"<((?:https?|mailto):[^>\s]*)>")
_HTML_ATTRIBUTE = re.compile(r"<(?:a|img|source)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']*)[\"']", re.I)
_HTML_ANCHOR = re.compile(r"<[a-z][^>]*?\b(?:id|name)\s*=\s*[\"']([^\"']+)[\"']", re.I)
_ATX_HEADING = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT_UNDERLINE = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_LINE_ANCHOR = re.compile(r"L\d+(?:C\d+)?(?:-L\d+(?:C\d+)?)?")


def prose_lines(text: str) -> list[str]:
    """The page's lines with fenced code blocks blanked (so line numbers stay)."""
    lines, fence = text.splitlines(), ""
    for number, line in enumerate(lines):
        match = _FENCE.match(line)
        if fence:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = ""
            lines[number] = ""
        elif match:
            fence = match.group(1)
            lines[number] = ""
    return lines


def without_code_spans(text: str) -> str:
    return _CODE_SPAN.sub(lambda span: "code", text)


def _destination(inside: str) -> str:
    """The target of an inline link from what its parentheses hold: ``<target>``, or ``target``
    followed by an optional title; anything else is returned whole (and then names nothing)."""
    inside = inside.strip()
    if inside.startswith("<") and ">" in inside:
        return inside[1 : inside.index(">")]
    target, _, title = inside.partition(" ")
    return target if not title.strip() or _TITLE.fullmatch(title.strip()) else inside


def links(text: str) -> list[str]:
    """Every link and image target of a Markdown page, in order, outside code."""
    prose = without_code_spans("\n".join(prose_lines(text)))
    found = [(m.start(), _destination(m.group(1))) for m in _INLINE_LINK.finditer(prose)]
    found += [(m.start(), m.group(1)) for m in _REFERENCE.finditer(prose)]
    found += [(m.start(), m.group(1)) for m in _AUTOLINK.finditer(prose)]
    found += [(m.start(), m.group(1)) for m in _HTML_ATTRIBUTE.finditer(prose)]
    return [target.removeprefix("<").removesuffix(">") for _, target in sorted(found)]


def heading_text(raw: str) -> str:
    """A heading as GitHub renders its text: links and images by their text, tags and emphasis gone,
    code spans as written."""
    parts = re.split(r"(`+.+?`+)", raw)
    rendered = []
    for part in parts:
        if part.startswith("`"):
            rendered.append(part.strip("`").strip())
            continue
        part = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", part)
        part = re.sub(r"<[^>]+>", "", part)
        part = re.sub(r"(?<!\w)(\*{1,3}|_{1,3})(\S(?:.*?\S)?)\1(?!\w)", r"\2", part)
        rendered.append(part)
    return "".join(rendered).strip()


def slugify(heading: str) -> str:
    """GitHub's slug of a heading's text (github-slugger): lowercase, only letters, digits, ``-``, ``_``
    and spaces kept, each space a ``-``."""
    return re.sub(r"[^\w\- ]", "", heading_text(heading).lower()).replace(" ", "-")


def headings(text: str) -> list[str]:
    """The texts of a page's headings (ATX and setext), in order, outside code."""
    lines, found = prose_lines(text), []
    for number, line in enumerate(lines):
        atx = _ATX_HEADING.match(line)
        if atx:
            found.append(atx.group(2) or "")
            continue
        previous = lines[number - 1] if number else ""
        if (
            _SETEXT_UNDERLINE.match(line)
            and previous.strip()
            and not re.match(r"^ {0,3}([#>|]|[-*+] |\d+[.)] )", previous)
            and not previous.startswith("    ")
        ):
            found.append(previous.strip())
    return found


def anchors(text: str) -> set[str]:
    """The anchors a page offers: its headings' slugs, repeated ones numbered as GitHub does, and the
    ``id``/``name`` attributes of its HTML tags."""
    taken: dict[str, int] = {}
    slugs = set()
    for heading in headings(text):
        slug = original = slugify(heading)
        while slug in taken:
            taken[original] += 1
            slug = f"{original}-{taken[original]}"
        taken[slug] = 0
        slugs.add(slug)
    prose = without_code_spans("\n".join(prose_lines(text)))
    return slugs | {m.group(1) for m in _HTML_ANCHOR.finditer(prose)}


# ----------------------------------------------------------------------------------------- checking


@dataclass(frozen=True)
class Broken:
    page: str
    target: str
    why: str

    def __str__(self) -> str:
        return f"{self.page}: ({self.target}) {self.why}"


def external_problem(target: str) -> str | None:
    """Why an absolute URL is not well-formed (None when it is)."""
    if re.search(r"\s", target):
        return "has whitespace"
    parts = urlsplit(target)
    if parts.scheme == "mailto":
        return None if re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", parts.path) else "is not an e-mail address"
    if parts.scheme not in ("http", "https"):
        return f"has the scheme {parts.scheme!r}, not http(s)"
    try:
        _ = parts.port  # raises on a bad port
    except ValueError as error:
        return f"has a bad port: {error}"
    label = r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?"
    if not parts.hostname or not re.fullmatch(rf"{label}(?:\.{label})*|[0-9a-f:.]+", parts.hostname):
        return "has no valid host"
    return None


@cache
def ignored_by_git(path: Path, root: Path) -> bool:
    """Whether git ignores ``path`` (a local file such as a test's output, not the repository's); False
    where there is no git checkout to ask."""
    if shutil.which("git") is None or not (root / ".git").exists():
        return False
    done = subprocess.run(
        ["git", "-C", str(root), "check-ignore", "-q", str(path)], capture_output=True, check=False
    )
    return done.returncode == 0


def check_page(page: Path, root: Path) -> list[Broken]:
    """Every broken link of one page."""
    name = page.relative_to(root).as_posix()
    text = page.read_text(encoding="utf-8")
    broken: list[Broken] = []
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            problem = external_problem(target)
            if problem:
                broken.append(Broken(name, target, f"is not a well-formed URL: it {problem}"))
            continue
        path_part, _, anchor = target.partition("#")
        path_part = unquote(path_part.split("?", 1)[0])
        if not path_part:
            destination = page
        elif path_part.startswith("/"):
            destination = root / path_part.lstrip("/")
        else:
            destination = page.parent / path_part
        destination = destination.resolve()
        if not destination.is_relative_to(root.resolve()):
            broken.append(Broken(name, target, "leaves the repository"))
            continue
        if not destination.exists():
            broken.append(Broken(name, target, "names no file of the repository"))
            continue
        if ignored_by_git(destination, root.resolve()):
            broken.append(Broken(name, target, "names a file git ignores, not one of the repository"))
            continue
        if "#" not in target:
            continue
        anchor = unquote(anchor)
        if destination.is_dir():
            broken.append(Broken(name, target, "has an anchor, but names a folder"))
        elif destination.suffix.lower() in (".md", ".markdown"):
            offered = anchors(destination.read_text(encoding="utf-8"))
            if anchor not in offered:
                where = destination.relative_to(root.resolve()).as_posix()
                broken.append(Broken(name, target, f"matches no heading of {where}"))
        elif not _LINE_ANCHOR.fullmatch(anchor):
            broken.append(Broken(name, target, "is not a line anchor (#L10) of a file that is not Markdown"))
    return broken


# ------------------------------------------------------------------------------ the repository's docs


@pytest.mark.parametrize("page", documentation(ROOT), ids=lambda page: page.relative_to(ROOT).as_posix())
def test_every_link_of_the_documentation_resolves(page: Path) -> None:
    assert page.is_file(), f"{page.relative_to(ROOT)} is missing"
    broken = check_page(page, ROOT)
    assert not broken, "broken links:\n" + "\n".join(map(str, broken))


def test_the_readme_links_every_docs_page() -> None:
    readme = {target.partition("#")[0] for target in links((ROOT / "README.md").read_text(encoding="utf-8"))}
    pages = {f"docs/{page.name}" for page in (ROOT / "docs").glob("*.md")}
    assert pages, "docs/ has no page"
    assert pages <= readme, f"pages the README does not link: {sorted(pages - readme)}"


def test_the_readme_is_short_and_keeps_its_two_set_up_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 400, "the README orients; the details belong in docs/"
    section = text.split("\n## Set-up commands\n", 1)[1].split("\n## ", 1)[0]
    commands = [line.strip() for line in section.splitlines() if line.startswith("    ")]
    assert commands == ["make demo", "make test"]


# ------------------------------------------------------------------------------- the checker itself


def test_slugs_follow_githubs_rules() -> None:
    assert slugify("Deploy and faults") == "deploy-and-faults"
    assert slugify("This repository's cluster harness") == "this-repositorys-cluster-harness"
    assert slugify("`node_tax.py`: what a node task costs") == "node_taxpy-what-a-node-task-costs"
    assert slugify("Plan view, approval & reports") == "plan-view-approval--reports"
    assert slugify("A [linked](x.md) **bold** _word_ snake_case") == "a-linked-bold-word-snake_case"
    assert slugify("Fault → what happens · 3.4") == "fault--what-happens--34"
    page = "# Figures\n\n## Figures\n\n```\n# not a heading\n```\n\nFigures\n-------\n\n## Figures-1\n"
    assert anchors(page) == {"figures", "figures-1", "figures-2", "figures-1-1"}


def test_links_in_code_are_not_links() -> None:
    page = "[a](a.md) `[b](b.md)` ![c](img/c.png)\n\n```md\n[d](d.md)\n```\n[e]: e.md\n<https://x.org>\n"
    assert links(page) == ["a.md", "img/c.png", "e.md", "https://x.org"]


def test_the_check_finds_each_kind_of_broken_link(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Set-up\n\n## Set-up\n", encoding="utf-8")
    (tmp_path / "code.py").write_text("x = 1\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Project\n\n## Start here\n\n"
        "[ok](docs/guide.md) [ok](docs/guide.md#set-up) [ok](docs/guide.md#set-up-1) [ok](#start-here)\n"
        "[ok](code.py#L1-L2) [ok](/docs/guide.md) [ok](https://github.com/apache/airflow/issues/1)\n"
        "[missing](docs/gone.md) [no heading](docs/guide.md#set-up-2) [no heading](#nowhere)\n"
        "![missing image](docs/shot.png) [outside](../elsewhere.md) [bad url](https://exa mple.com)\n"
        "[bad url](https://:80/x) [not a line](code.py#main) [bad scheme](ftp://x.org/f)\n",
        encoding="utf-8",
    )
    assert [b.target for b in check_page(readme, tmp_path)] == [
        "docs/gone.md",
        "docs/guide.md#set-up-2",
        "#nowhere",
        "docs/shot.png",
        "../elsewhere.md",
        "https://exa mple.com",
        "https://:80/x",
        "code.py#main",
        "ftp://x.org/f",
    ]


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_a_file_git_ignores_is_not_the_repositorys(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text("output/\n", encoding="utf-8")
    (tmp_path / "output").mkdir()
    (tmp_path / "output" / "shot.png").write_bytes(b"")
    (tmp_path / "kept.png").write_bytes(b"")
    readme = tmp_path / "README.md"
    readme.write_text("![local](output/shot.png) ![kept](kept.png)\n", encoding="utf-8")
    assert [str(b) for b in check_page(readme, tmp_path)] == [
        "README.md: (output/shot.png) names a file git ignores, not one of the repository"
    ]
