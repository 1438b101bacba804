"""A JSON list of a request's messages as a provider takes them, read into neutral messages.

`agentctx.importers.load_transcript` reads a JSON list in agentctx's own form first; a list
that is not, and holds what only a provider's messages hold, is read as Anthropic Messages
``messages`` or OpenAI Chat Completions ``messages`` (leading system messages as the system
prompt), whichever its messages say: ``tool_calls``, a ``system`` role, a ``tool`` message of
text or an ``image_url`` part mean OpenAI; a ``tool_use`` or ``tool_result`` block means
Anthropic. A list that holds both is a `TranscriptFormatError`, as is a message neither
adapter reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentctx.errors import UnsupportedMessageError

if TYPE_CHECKING:
    from agentctx.importers._common import Transcript
    from agentctx.importers.swe_agent import JsonDocument

__all__ = ["provider_form", "read_provider_list"]

_OPENAI_ROLES = frozenset({"system", "developer", "function"})  # and "tool" with text content
_OPENAI_PARTS = frozenset({"image_url", "input_audio", "file", "refusal"})
# (Thinking blocks are agentctx's form too: they tell nothing.)
_ANTHROPIC_BLOCKS = frozenset({"tool_use", "tool_result", "document", "server_tool_use"})
_OWN_BLOCKS = frozenset({"tool_call", "opaque"})  # only agentctx's form has these


def provider_form(value: list[Any]) -> str | None:
    """``"anthropic"``, ``"openai-chat"``, ``"mixed"`` (marks of both), or ``None`` when
    nothing in ``value`` is a provider's form rather than agentctx's, or something is only
    agentctx's (a summary message, a ``tool_call`` block, a tool message of blocks other than
    text parts, or of text parts in a list with no other mark of OpenAI's): then a list that
    does not read is agentctx's, wrong somewhere, and its error says where."""
    openai = anthropic = plain = own_tool = False
    for item in value:
        if not isinstance(item, dict):
            continue
        content = item.get("content")
        role = item.get("role")
        role = role if isinstance(role, str) else None
        if role == "summary":
            return None
        if role == "tool" and isinstance(content, list):
            if _text(content) is None:  # OpenAI's tool content is text parts only
                return None
            # Either form's, then: agentctx's unless the list says OpenAI elsewhere.
            own_tool = True
        openai |= "tool_calls" in item or role in _OPENAI_ROLES
        openai |= role == "tool" and isinstance(content, str)
        plain |= content is None or isinstance(content, str)
        for block in content if isinstance(content, list) else ():
            kind = block.get("type") if isinstance(block, dict) else None
            if not isinstance(kind, str):
                continue
            if kind in _OWN_BLOCKS:
                return None
            openai |= kind in _OPENAI_PARTS
            anthropic |= kind in _ANTHROPIC_BLOCKS
            anthropic |= kind == "image" and isinstance(block.get("source"), dict)
    if openai and anthropic:
        return "mixed"
    if openai:
        return "openai-chat"
    if own_tool:
        return None
    if anthropic or plain:
        return "anthropic"  # plain text messages read the same either way
    return None


def read_provider_list(doc: JsonDocument, value: list[Any], form: str) -> Transcript:
    """``value`` read as ``form`` (`provider_form`); `TranscriptFormatError` at the message
    the adapter refuses."""
    from agentctx.adapters.anthropic import from_anthropic
    from agentctx.adapters.openai_chat import from_openai_chat, split_openai_chat_system
    from agentctx.importers._common import Transcript

    path = doc.src.path
    if form == "mixed":
        raise doc.src.error(1, "a list of one provider's messages, not Anthropic's and OpenAI's")
    try:
        if form == "anthropic":
            return Transcript(path, form, tuple(from_anthropic(value)))
        system, rest = split_openai_chat_system(value)
        texts = [_text(m.get("content")) for m in system]
        messages = tuple(from_openai_chat(rest, start=len(system)))
    except UnsupportedMessageError as e:
        at = () if e.index is None else (e.index,)
        raise doc.error(at, f"{_NAMES[form]} messages ({e})") from None
    if any(t is None for t in texts):
        raise doc.error((0,), f"{_NAMES[form]} messages (a system message's text)")
    return Transcript(path, form, messages, system="\n\n".join(t for t in texts if t) or None)


_NAMES = {"anthropic": "Anthropic Messages", "openai-chat": "OpenAI Chat Completions"}


def _text(content: object) -> str | None:
    """A system message's text: a string, or the text of its text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    return None
