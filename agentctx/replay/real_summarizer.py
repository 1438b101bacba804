"""``--summarizer``: which real model `agentctx replay` sends its summary requests to.

```python
spec = SummarizerSpec.parse("openai-compatible:qwen2.5-7b@http://127.0.0.1:8000/v1")
spec.check()                     # raises when the SDK is missing or the key is not set
summarizer = spec.build()        # an SDK summarizer; close it with `await summarizer.aclose()`
```

Three forms:

- ``anthropic:MODEL``: `AnthropicSummarizer`, key from ``ANTHROPIC_API_KEY``;
- ``openai:MODEL``: `OpenAIChatSummarizer` on api.openai.com, key from ``OPENAI_API_KEY``;
- ``openai-compatible:MODEL@URL``: `OpenAIChatSummarizer` on any Chat Completions server at
  ``URL`` (vLLM, llama.cpp, Ollama: ``http://127.0.0.1:8000/v1``), the output cap sent as
  ``max_tokens``; key from ``OPENAI_API_KEY`` if set, else none (a local server needs none).

The SDKs are the ``anthropic`` and ``openai`` extras; a missing one is a `MissingExtraError`
that names the extra when the summarizer is built.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal
from urllib.parse import urlsplit

from agentctx.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping

    from agentctx.providers.anthropic_summarizer import AnthropicSummarizer
    from agentctx.providers.openai_summarizer import OpenAIChatSummarizer

__all__ = ["PROVIDERS", "SummarizerSpec"]

Provider = Literal["anthropic", "openai", "openai-compatible"]

PROVIDERS: tuple[Provider, ...] = ("anthropic", "openai", "openai-compatible")
"""The providers ``--summarizer`` knows, in the order the help lists them."""

_KEYS: dict[Provider, str] = {
    "anthropic": "ANTHROPIC_API_KEY",
    "openai": "OPENAI_API_KEY",
    "openai-compatible": "OPENAI_API_KEY",
}


# To the last "@": a password may hold "/", "@", "?", even a line break. (An "@" that is no
# password's hides what precedes it too: a line that says less, never one that says a key.)
_USERINFO = re.compile(r"://.*@", re.DOTALL)
_QUERY = re.compile(r"\?.*", re.DOTALL)  # an API key rides there too


def _shown(text: str) -> str:
    """``text`` with a URL's user, password and query as ``***``: error lines and reports
    are shared."""
    return _QUERY.sub("?***", _USERINFO.sub("://***@", text))


@dataclass(frozen=True, slots=True)
class SummarizerSpec:
    """A parsed ``--summarizer`` value: provider, model and, for a compatible server, URL."""

    provider: Provider
    model: str
    base_url: str | None = None

    @classmethod
    def parse(cls, text: str) -> SummarizerSpec:
        """Parse ``anthropic:MODEL``, ``openai:MODEL`` or ``openai-compatible:MODEL@URL``;
        a `ConfigError` says what is wrong with anything else."""
        provider, sep, rest = text.partition(":")
        forms = "anthropic:MODEL, openai:MODEL or openai-compatible:MODEL@URL"
        if not sep or provider not in PROVIDERS:
            raise ConfigError(f"not a summarizer: {_shown(text)!r} (expected {forms})")
        base_url: str | None = None
        if provider == "openai-compatible":
            # The URL starts at the last '@' before a scheme: a model name may hold an '@'.
            lower = rest.lower()
            at = max(lower.rfind("@http://"), lower.rfind("@https://"))
            if at < 0:
                raise ConfigError(
                    f"not a summarizer: {_shown(text)!r} (openai-compatible needs MODEL@URL, e.g. "
                    "openai-compatible:qwen2.5-7b@http://127.0.0.1:8000/v1)"
                )
            rest, base_url = rest[:at], rest[at + 1 :]
            try:
                url = urlsplit(base_url)
                url.port  # noqa: B018 - read for the ValueError of a port that is no number
            except ValueError as e:  # (its text may quote the password: not shown)
                raise ConfigError(
                    f"not a summarizer: {_shown(text)!r} (its URL cannot be read)"
                ) from e
            if not url.hostname:
                raise ConfigError(f"not a summarizer: {_shown(text)!r} (its URL names no host)")
        if not rest.strip():
            raise ConfigError(
                f"not a summarizer: {_shown(text)!r} (no model name; expected {forms})"
            )
        return cls(provider, rest.strip(), base_url)

    def __str__(self) -> str:
        """The spec, a URL's user, password and query shown as ``***`` (it reaches reports)."""
        at = f"@{self.base_url}" if self.base_url is not None else ""
        return _shown(f"{self.provider}:{self.model}{at}")

    @property
    def key_variable(self) -> str:
        """The environment variable the API key is read from."""
        return _KEYS[self.provider]

    def check(self, environ: Mapping[str, str] | None = None) -> None:
        """Before any replay starts: raise `MissingExtraError` when the provider's SDK is not
        installed, `ConfigError` when the provider needs a key and ``environ`` (default
        ``os.environ``) has none (a compatible server needs none)."""
        if self.provider == "anthropic":
            import agentctx.providers.anthropic_summarizer
        else:
            import agentctx.providers.openai_summarizer  # noqa: F401
        env = os.environ if environ is None else environ
        if self.provider != "openai-compatible" and not env.get(self.key_variable):
            raise ConfigError(
                f"--summarizer {self}: set {self.key_variable} to the API key "
                "(replies already in the summary cache cost nothing, but the key is checked "
                "first)"
            )

    def build(
        self, environ: Mapping[str, str] | None = None
    ) -> AnthropicSummarizer | OpenAIChatSummarizer:
        """A new SDK summarizer for this spec, owning its client (close it with ``aclose``)."""
        env = os.environ if environ is None else environ
        key = env.get(self.key_variable) or None
        if self.provider == "anthropic":
            from agentctx.providers.anthropic_summarizer import AnthropicSummarizer

            return AnthropicSummarizer(self.model, api_key=key)
        from agentctx.providers.openai_summarizer import OpenAIChatSummarizer

        if self.provider == "openai":
            return OpenAIChatSummarizer(self.model, api_key=key)
        return OpenAIChatSummarizer(
            self.model,
            api_key=key or "none",
            base_url=self.base_url,
            token_limit_param="max_tokens",
        )
