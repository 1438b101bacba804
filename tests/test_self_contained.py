"""Nothing in the repository names a file outside it: a fresh clone is all a user has."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Paths that only exist next to the repository where it was developed.
OUTSIDE = re.compile(r"\.\./shared|shared/(?:corpus|reference|seeds)|DESIGN(?:\.md)? §|DESIGN\.md")


def _tracked_text_files() -> list[Path]:
    if (ROOT / ".git").exists():
        names = subprocess.run(
            ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, check=True, capture_output=True, text=True,
        ).stdout.splitlines()  # fmt: skip
        paths = [ROOT / n for n in names]
    else:  # an unpacked sdist
        paths = [p for p in ROOT.rglob("*") if p.is_file()]
    corpus = ROOT / "tests" / "corpus"
    # The corpus files are recorded data (their own paths are the projects' they came from).
    return [
        p
        for p in paths
        if p.is_file()
        and corpus not in p.parents
        and p.suffix in {".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".txt", ".cfg", ""}
    ]


def test_no_file_refers_to_a_path_outside_the_repository() -> None:
    offenders = []
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, IsADirectoryError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line) and path != Path(__file__):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert offenders == []


def test_the_corpus_index_and_every_format_folder_name_their_sources() -> None:
    corpus = ROOT / "tests" / "corpus"
    assert (corpus / "README.md").is_file()
    folders = [p for p in corpus.iterdir() if p.is_dir()]
    assert {f.name for f in folders} == {
        "anthropic-api", "claude-code", "openai-api", "openhands", "pi", "swe-agent"
    }  # fmt: skip
    for folder in folders:
        sources = (folder / "SOURCES.md").read_text(encoding="utf-8")
        assert (folder / "FORMAT.md").is_file()
        for data in folder.iterdir():
            if data.suffix != ".md":
                assert data.name in sources, f"{data} has no entry in {folder}/SOURCES.md"
