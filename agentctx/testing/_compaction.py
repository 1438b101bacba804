"""Provider-native compaction on the fake servers: Anthropic's ``compaction`` request
parameter of ``POST /v1/messages`` and OpenAI's ``POST /v1/responses/compact``, their
validation and their response bodies. Pure functions; no I/O.

Anthropic (beta ``compact-2026-09-04``): a request with ``compaction: {"type": "summarize",
"instructions"?}`` summarizes its ``messages`` and answers with one assistant message holding
only a ``compaction`` block (``content``: the summary, ``signature``: the server's, sent back
verbatim; ``content: null`` when the compaction failed, which later requests treat as a
no-op) and ``stop_reason: "compaction"``; its cost is in ``usage`` and in one ``compaction``
entry of ``usage.iterations``. The API refuses the parameter without the beta, with
``context_management``, ``stop_sequences``, a forced ``tool_choice`` or an output format,
and a compaction block that comes back with a signature it did not issue.

OpenAI: ``POST /v1/responses/compact`` takes ``model``, ``input`` (or
``previous_response_id``), ``instructions`` and the prompt-cache settings, nothing else, and
answers ``{"object": "response.compaction", "output": [every user message of the input...,
one compaction item], "usage"}``; the item's ``encrypted_content`` is opaque and checked when
it comes back in a later request's input.

A scripted `Reply` gives the summary: its ``answer`` is the compaction's content (encrypted
for OpenAI); an empty answer is a failed compaction (Anthropic ``content: null``, OpenAI no
compaction item).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentctx.testing._openai_wire import encrypt
from agentctx.testing._validate import Invalid, sign, signature_ok
from agentctx.testing._wire import stop_reason

if TYPE_CHECKING:
    from collections.abc import Mapping

    from agentctx.testing._reply import Reply
    from agentctx.testing._wire import Ids

__all__ = [
    "ANTHROPIC_BETA",
    "COMPACT_PATH",
    "anthropic_blocks_problem",
    "anthropic_compaction_message",
    "anthropic_request_problem",
    "compact_request_problem",
    "compacted_response",
]

ANTHROPIC_BETA = "compact-2026-09-04"
"""The ``anthropic-beta`` value the ``compaction`` parameter needs."""

COMPACT_PATH = "/v1/responses/compact"

_COMPACT_PARAMS = frozenset(
    {
        "model",
        "input",
        "instructions",
        "previous_response_id",
        "prompt_cache_key",
        "prompt_cache_options",
        "prompt_cache_retention",
        "service_tier",
        "image",
    }
)


# --------------------------------------------------------------------------- Anthropic


def anthropic_request_problem(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """Why the API refuses the ``compaction`` parameter of this request; ``None`` if it has
    none or it is fine."""
    if "compaction" not in body:
        return None
    betas = {b.strip() for b in headers.get("anthropic-beta", "").split(",")}
    if ANTHROPIC_BETA not in betas:
        return "compaction: Extra inputs are not permitted"
    config = body["compaction"]
    if config is None:
        return None
    if not isinstance(config, dict):
        return "compaction: Input should be a valid dictionary"
    if config.get("type") != "summarize":
        return "compaction.type: Input should be 'summarize'"
    instructions = config.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        return "compaction.instructions: Input should be a valid string"
    for key in config:
        if key not in ("type", "instructions"):
            return f"compaction.{key}: Extra inputs are not permitted"
    if body.get("context_management") is not None:
        return "`compaction` cannot be combined with `context_management`."
    if body.get("stop_sequences"):
        return "`stop_sequences` cannot be used with `compaction`: a compaction samples no reply."
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
        return "`tool_choice` cannot force a tool with `compaction`: a compaction calls none."
    output = body.get("output_config")
    if body.get("output_format") is not None or (
        isinstance(output, dict) and output.get("format") is not None
    ):
        return "An output format cannot be used with `compaction`: a compaction has no reply."
    return None


def anthropic_blocks_problem(body: Mapping[str, Any], *, check_signatures: bool) -> str | None:
    """Why the API refuses a ``compaction`` block in this request's ``messages`` (an empty
    summary, or a signature this server did not issue); ``None`` if all are fine."""
    for i, message in enumerate(body.get("messages") or ()):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for j, block in enumerate(content):
            if not isinstance(block, dict) or block.get("type") != "compaction":
                continue
            where = f"messages.{i}.content.{j}"
            summary = block.get("content")
            if summary is None:  # a failed compaction: a no-op
                continue
            if not isinstance(summary, str):
                return f"{where}.compaction.content: Input should be a valid string"
            if not summary:
                return f"{where}.compaction.content: String should have at least 1 character"
            if check_signatures and not signature_ok(summary, block.get("signature")):
                return f"{where}: Invalid `signature` in `compaction` block"
    return None


def anthropic_compaction_message(
    reply: Reply,
    *,
    msg_id: str,
    model: str,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """The response to a compaction request: one ``compaction`` block, signed."""
    summary = reply.answer
    block: dict[str, Any] = {"type": "compaction", "content": summary or None}
    if summary:
        block["signature"] = sign(summary)
    refused = stop_reason(reply) == "refusal"
    iteration = {
        "type": "compaction",
        **{k: usage[k] for k in ("input_tokens", "output_tokens", "cache_read_input_tokens")},
        "cache_creation_input_tokens": usage["cache_creation_input_tokens"],
        "cache_creation": usage["cache_creation"],
    }
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [] if refused else [block],
        "stop_reason": "refusal" if refused else "compaction",
        "stop_sequence": None,
        "usage": {**usage, "iterations": [iteration]},
    }


# --------------------------------------------------------------------------- OpenAI


def compact_request_problem(body: Mapping[str, Any]) -> Invalid | None:
    """Why ``POST /v1/responses/compact`` refuses this body (before the item rules, which
    are those of ``/v1/responses``); ``None`` if it is fine."""
    for key in body:
        if key not in _COMPACT_PARAMS:
            return Invalid(f"Unknown parameter: '{key}'.", key, "unknown_parameter")
    if body.get("input") is None and body.get("previous_response_id") is None:
        return Invalid(
            "Missing required parameter: 'input'.", "input", "missing_required_parameter"
        )
    return None


def compacted_response(
    reply: Reply,
    history: list[Any],
    *,
    ids: Ids,
    created: int,
    usage: dict[str, Any],
) -> dict[str, Any]:
    """The ``response.compaction`` object: the user messages of ``history`` (the expanded
    input), then one compaction item whose content only this server can read."""
    output: list[dict[str, Any]] = []
    for item in history:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        if item.get("role") != "user":
            continue
        content = item.get("content")
        if isinstance(content, str):
            content = [{"type": "input_text", "text": content}]
        output.append(
            {
                "id": ids.new("msg"),
                "type": "message",
                "status": "completed",
                "role": "user",
                "content": content,
            }
        )
    if reply.answer:
        output.append(
            {"id": ids.new("cmp"), "type": "compaction", "encrypted_content": encrypt(reply.answer)}
        )
    return {
        "id": ids.new("resp"),
        "object": "response.compaction",
        "created_at": created,
        "output": output,
        "usage": usage,
    }
