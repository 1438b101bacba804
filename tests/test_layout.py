"""The layout shows the data flow: the core never imports the edge, and the leaves stay leaves."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "agentctx"
EDGE = ("adapters", "providers", "integrations", "importers", "replay", "testing")


def _imports(path: Path) -> set[str]:
    """Every agentctx module ``path`` imports, at any depth (TYPE_CHECKING blocks included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name == "agentctx" or name.startswith("agentctx.")}


def _core_modules() -> list[Path]:
    return [
        path
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in EDGE and path.name != "__main__.py"
    ]


def test_the_core_never_imports_the_edge() -> None:
    offenders = {
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in _core_modules()
        for name in _imports(path)
        if name.split(".")[1:2] and name.split(".")[1] in EDGE
    }
    assert sorted(offenders) == []
    assert len(_core_modules()) > 20  # the walk found the core


def test_errors_is_a_leaf_and_messages_imports_only_errors() -> None:
    assert _imports(PACKAGE / "errors.py") == set()
    assert _imports(PACKAGE / "messages.py") <= {"agentctx.errors"}


def test_import_agentctx_stays_lean() -> None:
    # No vendor SDK, HTTP client, logging backend, tokenizer, event loop, database or
    # strategy but the default at import: each comes when the feature that needs it is used.
    heavy = (
        "anthropic",
        "openai",
        "httpx",
        "structlog",
        "rich",
        "tiktoken",
        "redis",
        "pydantic",
        "asyncio",
        "concurrent.futures",
        "sqlite3",
        "agentctx.strategies.llm",
        "agentctx.strategies.pipeline",
    )
    code = f"import sys, agentctx; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
