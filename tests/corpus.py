"""Where the shared corpus of real transcripts lives, for tests that read it.

The corpus sits next to the repository (``../shared/corpus``), never inside it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

__all__ = ["CORPUS", "corpus_file", "corpus_files"]

CORPUS: Path = Path(__file__).resolve().parents[1].parent / "shared" / "corpus"


def corpus_files(kind: str) -> list[Path]:
    """The data files of one corpus folder (``pi``, ``claude-code``, ...), sorted by name.

    FORMAT.md and SOURCES.md are left out. Empty when the corpus is not there.
    """
    folder = CORPUS / kind
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix != ".md")


def corpus_file(kind: str, name: str) -> Path:
    """One corpus file; fails the calling test when the corpus is not next to the repo."""
    path = CORPUS / kind / name
    if not path.is_file():
        pytest.fail(f"corpus file {path} not found (the corpus belongs at ../shared/corpus)")
    return path
