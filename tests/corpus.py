"""The corpus of real transcripts the tests read: ``tests/corpus/<format>/``.

Each folder keeps FORMAT.md (the schema and its traps) and SOURCES.md (origin, licence and
checksum of every file; all MIT) beside the files.
"""

from __future__ import annotations

from pathlib import Path

import pytest

__all__ = ["CORPUS", "corpus_file", "corpus_files"]

CORPUS: Path = Path(__file__).resolve().parent / "corpus"


def corpus_files(kind: str) -> list[Path]:
    """The data files of one corpus folder (``pi``, ``claude-code``, ...), sorted by name.

    FORMAT.md and SOURCES.md are left out.
    """
    folder = CORPUS / kind
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix != ".md")


def corpus_file(kind: str, name: str) -> Path:
    """One corpus file; fails the calling test when it is missing."""
    path = CORPUS / kind / name
    if not path.is_file():
        pytest.fail(f"corpus file {path} not found")
    return path
