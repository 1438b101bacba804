"""`usage_of`: the neutral `Usage` of what a provider SDK returned, by duck typing.

```python
usage_of(resp)                # anthropic Message, openai ChatCompletion or Response
usage_of(resp.usage)          # their usage objects, or the same as plain dicts
usage_of(stream_final)        # a stream's final message (it carries .usage too)
```

The core imports no vendor SDK (nor the adapters), so the three usage shapes are told apart
by their fields: ``prompt_tokens`` is Chat Completions' (cache reads and writes counted inside
it), ``input_tokens_details`` is the Responses API's (cache reads and writes counted inside
``input_tokens``), and ``input_tokens`` / ``output_tokens`` alone is Anthropic's (cache reads
and writes counted apart). The adapters, summarizers and integrations read usage through it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agentctx.messages import MOST_TOKENS, Usage

__all__ = [
    "ACCEPTED",
    "UNSTATED",
    "Unpriced",
    "billed_usage",
    "read_usage",
    "states_counts_only",
    "usage_inside",
    "usage_of",
]

ACCEPTED = (
    "a Usage, an AssistantMessage, an SDK response (anthropic Message, openai ChatCompletion "
    "or Response, a stream's final message) or its usage (anthropic Usage, openai "
    "CompletionUsage or ResponseUsage)"
)


def _get(obj: object, key: str) -> object:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _count(obj: object, key: str) -> int:
    """The token count ``key`` holds (`_tokens`)."""
    return _tokens(_get(obj, key))


def _tokens(value: object) -> int:
    """``value`` as a token count: a whole number (a JSON float such as ``1200.0`` too),
    else 0 (none, negative, NaN, past any request)."""
    if type(value) is int:
        return value if 0 < value <= MOST_TOKENS else 0
    if type(value) is float and 0 < value <= MOST_TOKENS:
        return int(value)
    return 0


def _has(obj: object, key: str) -> bool:
    return type(_get(obj, key)) in (int, float)


def _inside(prompt: int, output: int, cached: int, written: int, written_1h: int = 0) -> Usage:
    """Usage of a prompt count that holds its cache reads and writes (OpenAI's): what they
    claim past the prompt is not taken (the prompt is what was billed)."""
    cached = min(cached, prompt)
    written = min(written, prompt - cached)
    return Usage(prompt - cached - written, output, cached, written, min(written_1h, written))


def usage_inside(
    prompt: object, output: object, cached: object, written: object, written_1h: object = 0
) -> Usage:
    """`Usage` from counts of a framework that holds cache reads and writes inside its prompt
    count (LangChain's ``usage_metadata``, pydantic-ai's ``RequestUsage``), read as
    `usage_of` reads OpenAI's: a count that is no token count is 0, and what the cache counts
    claim past the prompt is not taken."""
    return _inside(*map(_tokens, (prompt, output, cached, written, written_1h)))


def _from_fields(usage: object) -> Usage | None:
    """Usage from one provider's usage object (or dict); None if it has no token fields."""
    if _has(usage, "prompt_tokens"):  # Chat Completions: cached tokens inside prompt_tokens
        details = _get(usage, "prompt_tokens_details")
        # Claude behind LiteLLM names them as Anthropic does.
        cached = _count(details, "cached_tokens") or _count(usage, "cache_read_input_tokens")
        written = _count(details, "cache_write_tokens") or _count(
            usage, "cache_creation_input_tokens"
        )
        return _inside(
            _count(usage, "prompt_tokens"), _count(usage, "completion_tokens"), cached, written
        )
    if not (_has(usage, "input_tokens") or _has(usage, "output_tokens")):
        return None
    details = _get(usage, "input_tokens_details")
    if details is not None:  # Responses: cache reads and writes inside input_tokens
        cached = _count(details, "cached_tokens")
        written = _count(details, "cache_write_tokens")
        return _inside(
            _count(usage, "input_tokens"), _count(usage, "output_tokens"), cached, written
        )
    written = _count(usage, "cache_creation_input_tokens")  # Anthropic: counted apart
    written_1h = _count(_get(usage, "cache_creation"), "ephemeral_1h_input_tokens")
    return Usage(
        _count(usage, "input_tokens"),
        _count(usage, "output_tokens"),
        _count(usage, "cache_read_input_tokens"),
        written,
        min(written_1h, written),
    )


_STATED = (
    "prompt_tokens",
    "completion_tokens",
    "input_tokens",
    "output_tokens",
    "cache_read_input_tokens",
    "cache_creation_input_tokens",
)
_STATED_INSIDE = {
    "prompt_tokens_details": ("cached_tokens", "cache_write_tokens"),
    "input_tokens_details": ("cached_tokens", "cache_write_tokens"),
    "cache_creation": ("ephemeral_1h_input_tokens",),
}


def states_counts_only(usage: object) -> bool:
    """Whether every token count a provider's usage (object or dict, or a reply carrying one)
    states is one (`_is_count`): `usage_of` reads one that is not as 0, silently."""
    inner = _get(usage, "usage")
    if inner is not None and inner is not usage and not states_counts_only(inner):
        return False
    for key in _STATED:
        value = _get(usage, key)
        if value is not None and not _is_count(value):
            return False
    for key, names in _STATED_INSIDE.items():
        details = _get(usage, key)
        if details is not None and not all(
            (value := _get(details, name)) is None or _is_count(value) for name in names
        ):
            return False
    return True


@dataclass(frozen=True, slots=True)
class Unpriced:
    """The usage of a reply whose price is not known: its counts as read (`read_usage`), a
    count that was no token count as 0. `billed_usage` reads it as billed, at
    ``cost_usd=None``."""

    usage: Usage = field(default_factory=Usage)


UNSTATED = Unpriced()
"""The usage of a reply that came but states none that can be read."""


def read_usage(usage: object) -> tuple[Usage, bool]:
    """A reply's usage (a provider's usage object or dict) as `usage_of` reads it (``Usage()``
    when it states none), and whether its price can be known: ``False`` when it states no
    usage, or a count that is no token count (read as 0, it would price the reply too low)."""
    try:
        counts = usage_of(usage)
        known = counts is not None and states_counts_only(usage)
    except Exception:  # an object of any shape: its fields may raise
        counts, known = None, False
    return counts or Usage(), known


def billed_usage(value: object) -> tuple[Usage, bool] | None:
    """What a reply that could not be used reports it was billed (`SummarizerError.usage`),
    and whether that is known: ``None`` when nothing says a reply came (``value`` is
    ``None``); else `usage_of` of it, with the counts of a `Usage` it holds read the same way
    (one that is no token count is 0), and ``False`` when a count was no token count or the
    usage could not be read at all: the reply was billed, for an amount no one told."""
    if value is None:
        return None
    if isinstance(value, Unpriced):
        read = billed_usage(value.usage)
        return (read[0] if read is not None else Usage()), False
    usage, stated = (value, True) if isinstance(value, Usage) else read_usage(value)
    fields = (
        usage.input_tokens,
        usage.output_tokens,
        usage.cache_read_tokens,
        usage.cache_write_tokens,
        usage.cache_write_1h_tokens,
    )
    known = stated and all(_is_count(v) for v in fields)
    written = _tokens(usage.cache_write_tokens)
    counts = Usage(
        _tokens(usage.input_tokens),
        _tokens(usage.output_tokens),
        _tokens(usage.cache_read_tokens),
        written,
        min(_tokens(usage.cache_write_1h_tokens), written),
    )
    # Each count may be one, and their sum past any request (as `check_result` refuses it).
    known = known and counts.prompt_tokens + counts.output_tokens <= MOST_TOKENS
    return counts, known


def _is_count(value: object) -> bool:
    """Whether ``value`` is a token count as it stands (0 too), read as `_tokens` reads it."""
    if type(value) is float and not value.is_integer() or isinstance(value, bool):
        return False
    return value == 0 or _tokens(value) > 0


def usage_of(response: object) -> Usage | None:
    """The `Usage` ``response`` reports (see the module docs for what is accepted), or None
    when it carries none (e.g. a chat stream's completion without ``include_usage``)."""
    if isinstance(response, Usage):
        return response
    usage = _from_fields(response)
    if usage is not None:
        return usage
    inner = _get(response, "usage")
    if inner is None or inner is response:
        return None
    return inner if isinstance(inner, Usage) else _from_fields(inner)
