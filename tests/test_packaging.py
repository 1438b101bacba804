"""The release artefacts: an sdist with the package and what its test suite reads (tests,
benchmarks, docs, examples, scripts; nothing untracked), a wheel built from it, and
`agentctx replay` run from a clean virtualenv."""

from __future__ import annotations

import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import agentctx

ROOT = Path(__file__).resolve().parents[1]
WHEELHOUSE = ROOT / ".venv" / "wheelhouse"  # filled by scripts/test: anyio, structlog and deps


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # sdist first, then the wheel from the unpacked sdist: a file the sdist misses fails here.
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    return out


def _only(folder: Path, pattern: str) -> Path:
    (path,) = folder.glob(pattern)
    return path


def test_sdist_holds_the_package_and_what_its_tests_read(dist: Path) -> None:
    """Found by a hostile run (BT 5): the sdist held the tests but not the benchmarks, docs
    and examples they read, so its own suite could not run from it."""
    sdist = _only(dist, "py_agentctx-*.tar.gz")
    assert sdist.name == f"py_agentctx-{agentctx.__version__}.tar.gz"
    with tarfile.open(sdist) as tar:
        prefix = f"py_agentctx-{agentctx.__version__}/"
        names = {n.removeprefix(prefix) for n in tar.getnames() if n != prefix.rstrip("/")}
    top = {n.split("/")[0] for n in names}
    # hatchling always adds .gitignore (it is tracked), pyproject.toml and PKG-INFO.
    assert top == {
        "agentctx", "tests", "benchmarks", "docs", "examples", "scripts", "mkdocs.yml",
        "README.md", "LICENSE", "pyproject.toml", "PKG-INFO", ".gitignore"
    }  # fmt: skip
    for needed in (
        "benchmarks/peers.py",
        "docs/index.md",
        "scripts/test",
        "agentctx/py.typed",
        "agentctx/replay/data/README.md",
        "tests/corpus/pi/SOURCES.md",
        "tests/test_packaging.py",
    ):
        assert needed in names
    if (ROOT / ".git").exists():
        tracked = set(
            subprocess.run(
                ["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True
            ).stdout.splitlines()
        )
        files = {n for n in names if "." in n.rsplit("/", 1)[-1] or n in ("LICENSE",)}
        untracked = sorted(files - tracked - {"PKG-INFO"})
        assert untracked == []


def test_wheel_is_typed_and_ships_the_demo_transcript(dist: Path) -> None:
    wheel = _only(dist, "py_agentctx-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        metadata = zf.read(f"py_agentctx-{agentctx.__version__}.dist-info/METADATA").decode()
    assert "agentctx/py.typed" in names
    assert any(n.startswith("agentctx/replay/data/") and n.endswith(".jsonl") for n in names)
    assert not any(n.startswith("tests/") for n in names)
    assert f"Version: {agentctx.__version__}" in metadata
    assert "License-Expression: MIT" in metadata
    assert "Provides-Extra: anthropic" in metadata
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires and not any("pytest" in line or "ruff" in line for line in requires)


def test_replay_runs_from_a_clean_virtualenv(dist: Path, tmp_path: Path) -> None:
    if not WHEELHOUSE.is_dir():
        pytest.fail(f"{WHEELHOUSE} is missing: run ./scripts/test, which fills it")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    wheel = _only(dist, "py_agentctx-*.whl")
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-qq", "--no-index",
         "--find-links", str(WHEELHOUSE), str(wheel)],
        check=True,
    )  # fmt: skip
    version = subprocess.run(
        [venv / "bin" / "agentctx", "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == f"agentctx {agentctx.__version__}"
    done = subprocess.run(
        [venv / "bin" / "agentctx", "replay"], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert "fewer" in done.stdout and "prefix-cache breaks" in done.stdout
    # The clean environment has no extras: no SDK, no rich, no tokenizer.
    missing = subprocess.run(
        [python, "-c", "import importlib.util as u; "
         "print([m for m in ('anthropic', 'openai', 'rich', 'tiktoken') if u.find_spec(m)])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert missing.stdout.strip() == "[]"
