"""Nothing in the repository points to a file that is not in it.

Every tracked text file is scanned for three kinds of pointer: markdown links (`[text](path#anchor)`),
mentions of a docs page (`docs/<page>.md`, optionally followed by the quoted section it cites, as check
docstrings do: `docs/model.md "RoPE with YaRN"`), and cited markdown file names (`<name>.md`,
`<dir>/<name>.md`). Each must name a file of the repository, and an anchor or a quoted section a heading of
that page. Public URLs are not followed; a path under a folder this repository does not have is another
project's (nccl-tests' `doc/...`), and a name written as a string literal is a file the code makes.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".txt", ".cfg", ".ini", ".jinja", ".json", ".html", ".js",
                 ".css", ".sh"}
SKIP_DIRS = {".git", ".nox", "build", "dist", "__pycache__", "node_modules", ".venv"}
# Run records kept as evidence: their `reference` strings are what the checks said when the run was made.
RECORDS = re.compile(r"^fixtures/.*/(results\.json|junit\.xml|fingerprint\.json)$")
SELF = "tests/test_repo_links.py"  # its negative controls hold broken pointers on purpose

_MD_LINK = re.compile(r"\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_DOCS_PAGE = re.compile(r"(?<![\w./-])(docs/[\w./-]*?\.md)((?:\s+\"[^\"\n]+\"(?:,\s*\"[^\"\n]+\")*)?)")
_MD_NAME = re.compile(r"(?<![\w/.:-])((?:[\w.-]+/)*[\w.-]*[A-Za-z0-9_]\.md)\b")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)
_QUOTED = re.compile(r"\"([^\"\n]+)\"")
_EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)


@dataclass(frozen=True)
class BadPointer:
    file: str
    line: int
    target: str
    why: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.target!r} {self.why}"


def repo_files(root: Path) -> list[str]:
    """Tracked files and untracked ones git does not ignore (a checkout being worked on), else the tree."""
    try:
        out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                             capture_output=True, text=True, check=True).stdout
        files = [f for f in out.split("\0") if f]
    except (OSError, subprocess.CalledProcessError):
        files = []
    if not files:
        files = [str(p.relative_to(root)) for p in root.rglob("*")
                 if p.is_file() and not SKIP_DIRS.intersection(p.relative_to(root).parts)]
    return sorted(f for f in files if (root / f).is_file())


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def headings(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    return {h.strip() for h in _HEADING.findall(text)}


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def scan(root: Path) -> list[BadPointer]:
    files = [f for f in repo_files(root) if Path(f).suffix in TEXT_SUFFIXES and not RECORDS.match(f) and f != SELF]
    present = set(repo_files(root))
    names = {Path(f).name for f in present}
    tops = {Path(f).parts[0] for f in present}
    bad: list[BadPointer] = []

    def exists(rel: str, base: Path) -> Path | None:
        for candidate in (base / rel, root / rel):
            resolved = candidate.resolve()
            if resolved.is_relative_to(root) and (resolved.is_file() or resolved.is_dir()):
                inside = str(resolved.relative_to(root))
                if resolved.is_dir() or inside in present:
                    return resolved
        return None

    for f in files:
        path = root / f
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        base = path.parent
        in_links: list[tuple[int, int]] = []  # spans of markdown link targets, judged once as links
        if path.suffix == ".md":
            for m in _MD_LINK.finditer(text):
                target = m.group(1)
                in_links.append(m.span(1))
                if _EXTERNAL.match(target):
                    continue
                rel, _, anchor = target.partition("#")
                page = exists(rel, base) if rel else path
                if page is None:
                    bad.append(BadPointer(f, _line_of(text, m.start()), target, "links to a file that is not in "
                                          "the repository"))
                elif anchor and page.suffix == ".md" and anchor not in {slug(h) for h in headings(page)}:
                    bad.append(BadPointer(f, _line_of(text, m.start()), target, f"links to #{anchor}, which no "
                                          f"heading of {page.relative_to(root)} has"))

        def linked(pos: int, spans: list[tuple[int, int]] = in_links) -> bool:
            return any(a <= pos < b for a, b in spans)

        for m in _DOCS_PAGE.finditer(text):
            if linked(m.start()):
                continue
            page = root / m.group(1)
            if str(Path(m.group(1))) not in present:
                bad.append(BadPointer(f, _line_of(text, m.start()), m.group(1), "names a docs page that is not "
                                      "in the repository"))
                continue
            have = {h.lower() for h in headings(page)}
            for section in _QUOTED.findall(m.group(2)):
                if section.lower() not in have:
                    bad.append(BadPointer(f, _line_of(text, m.start()), f"{m.group(1)} \"{section}\"",
                                          f"cites a section that {m.group(1)} has no heading for"))
        for m in _MD_NAME.finditer(text):
            cited = m.group(1)
            if linked(m.start()) or cited.startswith("docs/"):
                continue  # judged above
            quote = text[m.start() - 1:m.start()]
            if quote in ("'", '"') and text[m.end():m.end() + 1] == quote:
                continue  # a string literal: a file the code writes or reads at run time
            if "/" in cited and cited.split("/")[0] not in tops and not (base / cited.split("/")[0]).exists():
                continue  # another project's layout
            found = exists(cited, base) if "/" in cited else (cited in names or None)
            if not found:
                bad.append(BadPointer(f, _line_of(text, m.start()), cited, "cites a file that is not in the "
                                      "repository"))
    return bad


def test_every_pointer_names_a_file_of_the_repository() -> None:
    bad = scan(ROOT)
    assert not bad, f"{len(bad)} pointer(s) to what the repository does not hold:\n  " + "\n  ".join(map(str, bad))


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


def test_scan_reports_a_missing_page_a_missing_section_and_a_missing_anchor(tmp_path: Path) -> None:
    missing_note = "DESIGN" + "_NOTES.md"  # spelled apart so this file does not cite it itself
    root = _tree(tmp_path, {
        "docs/model.md": "# Model\n\n## RoPE with YaRN\n\ntext\n",
        "README.md": "See [the model](docs/model.md#rope-with-yarn) and [gone](docs/gone.md) and "
                     "[bad anchor](docs/model.md#no-such-heading).\n",
        "pkg/check.py": f'"""Reference: docs/model.md "RoPE with YaRN"; docs/model.md "Sinks"; {missing_note}"""\n',
    })
    found = {(b.file, b.target): b.why for b in scan(root)}
    assert found == {
        ("README.md", "docs/gone.md"): "links to a file that is not in the repository",
        ("README.md", "docs/model.md#no-such-heading"): "links to #no-such-heading, which no heading of "
                                                        "docs/model.md has",
        ("pkg/check.py", 'docs/model.md "Sinks"'): "cites a section that docs/model.md has no heading for",
        ("pkg/check.py", missing_note): "cites a file that is not in the repository",
    }, found


def test_scan_accepts_what_exists_and_public_urls(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "docs/model.md": "# Model\n\n## Tokenizer: o200k_harmony\n\n[up](../README.md) [here](#model)\n",
        "README.md": "[docs](docs/model.md) [vLLM](https://docs.vllm.ai/en/latest/index.md) ci/README.md\n",
        "ci/README.md": "see README.md\n",
        "pkg/check.py": '"""Reference: docs/model.md "Tokenizer: o200k_harmony"; https://x.org/docs/a.md"""\n',
    })
    assert scan(root) == []
