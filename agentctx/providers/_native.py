"""A wrapped loop refuses a session that compacts with another API's native compaction.

A native compaction summarizer (`AnthropicCompactionSummarizer`,
`OpenAICompactionSummarizer`) splices the provider's own opaque item, which only that API
takes back: under a loop on another API, the session would run until the first splice and
then fail on every call. Such a summarizer says which API's items it makes in its
``native_provider`` attribute (the `OpaqueBlock.provider` of what it splices):

```python
class MyNativeSummarizer:
    native_provider = "anthropic"   # agentctx.adapters.anthropic.PROVIDER
```

`wrap` and `as_middleware` check the manager's strategy when they are made, and each call's
`NativeChecked` compactor checks it again (an OpenAI client carries both of OpenAI's APIs, and
a strategy may be replaced): `ConfigError` before anything is compacted or paid for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentctx.adapters.anthropic import PROVIDER as ANTHROPIC
from agentctx.adapters.openai_chat import PROVIDER as OPENAI_CHAT
from agentctx.adapters.openai_responses import PROVIDER as OPENAI_RESPONSES
from agentctx.errors import ConfigError
from agentctx.providers._convert import Compactor, Outgoing

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping

    from agentctx.manager import ContextManager

__all__ = ["NativeChecked", "check_native", "native_providers"]

# The opaque items each wrapped API's requests carry back, and its name in the errors.
_CARRIES: Mapping[str, str] = {
    "anthropic": ANTHROPIC,
    "openai-chat": OPENAI_CHAT,
    "openai-responses": OPENAI_RESPONSES,
}
_NAMES: Mapping[str, str] = {
    "anthropic": "Anthropic Messages",
    "openai-chat": "OpenAI Chat Completions",
    "openai-responses": "OpenAI Responses",
}
_FITS = {ANTHROPIC: "an Anthropic client", OPENAI_RESPONSES: "OpenAI's responses.create"}
_KNOWN = frozenset(_CARRIES.values())

# A Chain in a fallback in a Chain is 4 deep: deeper is an object making up its attributes
# (a mock), whose walk would not end.
_DEPTH = 8


def native_providers(strategy: object) -> dict[str, str]:
    """The providers whose native items ``strategy`` may splice, each with the type name of
    what declares it (``native_provider``): the strategy, the strategies it runs
    (``strategies``, as a `Chain`'s; ``fallback``, as `LlmCompaction`'s) and their
    summarizers (``summarizer``, followed through a wrapper that exposes the one it wraps)."""
    found: dict[str, str] = {}
    seen: set[int] = set()
    todo: list[tuple[object, int]] = [(strategy, 0)]
    while todo:
        node, depth = todo.pop()
        if id(node) in seen or depth > _DEPTH:
            continue
        seen.add(id(node))
        provider = _attribute(node, "native_provider")
        # (An object making up its attributes says anything, hashable or not.)
        if isinstance(provider, str) and provider in _KNOWN:
            found.setdefault(provider, type(node).__name__)
        inner = [_attribute(node, "summarizer"), _attribute(node, "fallback")]
        chained = _attribute(node, "strategies")
        if isinstance(chained, tuple | list):
            inner += chained
        todo += [(n, depth + 1) for n in inner if n is not None]
    return found


def _attribute(node: object, name: str) -> object:
    # Any user strategy is walked: one whose property raises is no native one, and a check
    # must not break a setup that works.
    try:
        return getattr(node, name, None)
    except Exception:
        return None


def check_native(manager: ContextManager, apis: Collection[str]) -> None:
    """`ConfigError` when ``manager``'s strategy splices native items that none of ``apis``
    (the wrapped loop's request formats, as `Compactor.provider` names them: ``anthropic``,
    ``openai-chat``, ``openai-responses``) can carry back."""
    carried = {_CARRIES[api] for api in apis}
    for provider, who in native_providers(manager.strategy).items():
        if provider not in carried:
            names = " or ".join(_NAMES[api] for api in apis)
            fits = _FITS.get(provider, f"a loop that sends {provider!r} items")
            raise ConfigError(
                f"the session compacts with {who}, whose briefing is a native compaction "
                f"item ({provider!r}) that {names} requests cannot carry: every call after "
                f"its first splice would fail. Use it with {fits}, or compact with a "
                "summarizer whose briefing is text (any API takes it)"
            )


class NativeChecked(Compactor):
    """A `Compactor` whose every request first checks the session's strategy with
    `check_native` for its own API (again only when the strategy was replaced)."""

    _checked: object = None  # the strategy last found fit

    async def _compacted(self, kwargs: dict[str, Any], count: bool) -> Outgoing:
        """`Compactor._compacted` (what `request` and `to_send` make), or `ConfigError`
        before anything is compacted when the session splices another API's native
        compaction."""
        strategy = self.manager.strategy
        if strategy is not self._checked:
            check_native(self.manager, (self.provider,))
            self._checked = strategy
        return await super()._compacted(kwargs, count)
