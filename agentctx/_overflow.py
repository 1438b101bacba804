"""A provider's refusal of a prompt longer than its context window, read from the SDK error.

Read by the error's HTTP status and its message, as each API words it (no SDK is imported):

- Anthropic: ``prompt is too long: 208310 tokens > 200000 maximum``, and with the output
  counted, ``input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000``;
- OpenAI Chat Completions (and servers speaking its API, such as vLLM): ``This model's
  maximum context length is 128000 tokens. However, your messages resulted in 130255
  tokens``, ``... you requested 16610 tokens (14138 in the messages, 226 in the functions,
  and 2246 in the completion)`` (the prompt is the messages and the functions) or ``...
  you requested 32818 tokens in the messages`` or ``... your request has 4314 input tokens``
  (vLLM), ``... (128000 of text input, 2000 in the output)`` (OpenRouter); a bare ``you
  requested 81920 tokens`` (DeepSeek) may count the output too, and is read as no count; an
  output limit too large for what the prompt leaves (vLLM's ``'max_tokens' ... is too
  large``) is no refusal of the prompt;
- OpenAI Responses: ``Your input exceeds the context window of this model``, which says no
  number;
- Gemini: ``The input token count (1214865) exceeds the maximum number of tokens allowed
  (1048576)`` (its SDK's error gives the status as ``code``), and on Vertex AI ``the input
  token count is 1251952 but model only supports up to 1048576``.

The frameworks' own errors for it are read the same way, whatever their status: LangChain's
``ContextOverflowError`` (which its Anthropic and OpenAI packages raise as the SDK's error too)
and pydantic-ai's ``ModelContextWindowExceededError``; they are known by class name, as no
framework is imported here. When their message gives no count, none is taken. So is a group
of them (pydantic-ai's ``FallbackExceptionGroup``, every model refusing the prompt): the
largest count any of them gives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Overflow", "overflow_of"]

_MOST_CHARS = 4_000  # an error's text is read this far: the wording comes first
_MOST_TOKENS = 1 << 40  # no window is this large: a number past it is no count

_NUMBER = r"(\d[\d,]{0,20})"
_ANTHROPIC = re.compile(rf"prompt is too long: {_NUMBER} tokens > {_NUMBER} maximum")
_ANTHROPIC_WITH_OUTPUT = re.compile(
    rf"input length and `?max_tokens`? exceed context limit: {_NUMBER} \+ {_NUMBER} > {_NUMBER}"
)
_OPENAI_WINDOW = re.compile(rf"maximum context length is {_NUMBER} tokens")
_OPENAI_PROMPT = re.compile(
    rf"{_NUMBER} (?:tokens )?in the messages|resulted in {_NUMBER} tokens"
    rf"|has {_NUMBER} input tokens|{_NUMBER} of text input"
)
_OPENAI_FUNCTIONS = re.compile(rf"{_NUMBER} in the functions")
_OPENAI_OUTPUT = re.compile(rf"{_NUMBER} in the (?:completion|output)")
# vLLM's refusal of an output limit past what the window leaves: the prompt fit.
_OUTPUT_TOO_LARGE = re.compile(r"max_(?:completion_)?tokens'? (?:or '\w+' )?is too large")
_GEMINI = re.compile(
    rf"input token count \(?{_NUMBER}?\)? ?exceeds the maximum number of tokens allowed"
    rf" \(?{_NUMBER}\)?"
)
_VERTEX = re.compile(
    rf"input token count is {_NUMBER} but (?:the )?model only supports up to {_NUMBER}"
)
_NO_NUMBER = re.compile(r"exceeds the context window|context_length_exceeded")
_FRAMEWORK_ERRORS = frozenset(("ContextOverflowError", "ModelContextWindowExceededError"))


@dataclass(frozen=True, slots=True)
class Overflow:
    """A prompt the provider refused as longer than its context window.

    Attributes:
        prompt_tokens: the prompt's tokens as the provider counted them, when it says.
        window: the most prompt tokens the provider takes for that request, when it says
            (the window less the output asked for, where the message gives that).
        output: the output the request asked for, when the message says.
    """

    prompt_tokens: int | None
    window: int | None
    output: int | None = None


def _number(text: str | None) -> int | None:
    if text is None:
        return None
    value = int(text.replace(",", ""))
    return value if 0 < value < _MOST_TOKENS else None


def _with_output(prompt: int | None, window: int | None, output: int | None) -> Overflow:
    room = window - output if window is not None and output is not None else window
    return Overflow(prompt, room if room is not None and room > 0 else None, output)


def overflow_of(error: object) -> Overflow | None:
    """``error`` read as a provider's refusal of a prompt over its context window (an HTTP
    400 whose message says so, as each API words it, or a framework's error for it), or
    ``None`` for any other error."""
    if isinstance(error, ExceptionGroup):
        return _of_group(error)
    if not isinstance(error, Exception):
        return None
    named = any(c.__name__ in _FRAMEWORK_ERRORS for c in type(error).__mro__)
    status = getattr(error, "status_code", None)
    if status is None and type(code := getattr(error, "code", None)) is int:
        status = code  # Gemini's SDK
    if not named and status != 400:
        return None
    try:
        text = str(error)[:_MOST_CHARS]
    except Exception:  # an error whose text cannot be made says nothing
        return Overflow(None, None) if named else None
    if _OUTPUT_TOO_LARGE.search(text):
        return None
    if found := _ANTHROPIC.search(text):
        return Overflow(_number(found[1]), _number(found[2]))
    if found := _GEMINI.search(text) or _VERTEX.search(text):
        return Overflow(_number(found[1]), _number(found[2]))
    if found := _ANTHROPIC_WITH_OUTPUT.search(text):
        return _with_output(_number(found[1]), _number(found[3]), _number(found[2]))
    if window_found := _OPENAI_WINDOW.search(text):
        found = _OPENAI_PROMPT.search(text)
        prompt = _number(next(filter(None, found.groups()))) if found else None
        functions = _OPENAI_FUNCTIONS.search(text)
        if prompt is not None and functions is not None:
            prompt += _number(functions[1]) or 0
        output = _OPENAI_OUTPUT.search(text)
        return _with_output(
            prompt, _number(window_found[1]), _number(output[1]) if output else None
        )
    if (
        named
        or _NO_NUMBER.search(text)
        or getattr(error, "code", None) == "context_length_exceeded"
    ):
        return Overflow(None, None)
    return None


def _of_group(group: ExceptionGroup[Exception]) -> Overflow | None:
    """A group of errors read as one refusal when each of them is one (several models
    refusing the same prompt, each counting it its own way): the largest count given."""
    found = [overflow_of(e) for e in group.exceptions]
    if not found or None in found:
        return None
    counted = [f for f in found if f is not None and f.prompt_tokens is not None]
    return max(counted, key=lambda f: f.prompt_tokens or 0) if counted else found[0]


_MOST_FLOOR = 300.0  # tokens: no provider bills an image a floor above this (258, 255, 85)


def floor_share(excess: float, images: Sequence[tuple[float, bool]]) -> float:
    """The part of ``excess``, a refusal's tokens that no calibration explains, that the
    images marked ``True`` in ``images`` (each image's estimate, and whether compaction keeps
    it) carry, read as a floor the provider bills every image at and the estimates fall short
    of (Gemini bills each image 258 tokens, OpenAI's high detail at least 255, its low detail
    85): the floor ``F`` with ``sum(max(0, F - estimate)) == excess``, of which each kept
    image carries ``F`` less its estimate. Many small images cost a refused prompt its
    excess, one at a time. A floor past any provider's (large images billed far over their
    estimate, tile by tile) is taken as the highest one: the rest of the excess is left to
    the images compaction may leave out."""
    estimates = sorted(e for e, _ in images)
    floor, below = 0.0, 0.0  # below: the sum of the estimates under the floor
    for k, estimate in enumerate(estimates):
        below += estimate
        floor = (excess + below) / (k + 1)
        if k + 1 == len(estimates) or floor <= estimates[k + 1]:
            break
    floor = min(floor, _MOST_FLOOR)
    return min(excess, sum(max(0.0, floor - e) for e, kept in images if kept))
