"""Wire formats of the fake OpenAI server: Chat Completions and Responses bodies, SSE
streams and error bodies. Pure functions of a `Reply` and the request; no I/O."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from agentctx.testing._validate import sign
from agentctx.testing._wire import (
    Billing,
    Ids,
    canonical,
    dumps,
    json_pieces,
    pieces,
    sse,
    stop_reason,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from agentctx.testing._reply import Reply

__all__ = [
    "OPENAI_ERRORS",
    "chat_chunks",
    "chat_completion",
    "chat_segments",
    "chat_usage",
    "encrypt",
    "openai_error",
    "responses_events",
    "responses_items",
    "responses_object",
    "responses_output",
    "responses_segments",
    "responses_stream_error",
    "responses_usage",
]

# --------------------------------------------------------------------------- OpenAI Chat


def chat_segments(body: Mapping[str, Any]) -> list[str]:
    segments = [canonical({"model": body.get("model"), "tools": body.get("tools")})]
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            message = {**message, "content": [{"type": "text", "text": content}]}
        segments.append(canonical(message))
    return segments


def chat_finish_reason(reply: Reply) -> str:
    reason = stop_reason(reply)
    return {
        "end_turn": "stop",
        "max_tokens": "length",
        "tool_use": "tool_calls",
        "refusal": "stop",
        "stop_sequence": "stop",
        "pause_turn": "stop",
    }.get(reason, reason)


def chat_usage(billing: Billing) -> dict[str, Any]:
    return {
        "prompt_tokens": billing.prompt_tokens,
        "completion_tokens": billing.output_tokens,
        "total_tokens": billing.prompt_tokens + billing.output_tokens,
        "prompt_tokens_details": {
            "cached_tokens": billing.cache_read,
            "cache_write_tokens": billing.cache_write,
            "audio_tokens": 0,
        },
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _chat_tool_calls(reply: Reply, tool_ids: Sequence[str]) -> list[dict[str, Any]]:
    return [
        {
            "id": cid,
            "type": "function",
            "function": {"name": c.name, "arguments": dumps(dict(c.arguments))},
        }
        for c, cid in zip(reply.calls, tool_ids, strict=True)
    ]


def chat_completion(
    reply: Reply,
    tool_ids: Sequence[str],
    *,
    chat_id: str,
    model: str,
    created: int,
    usage: dict[str, Any],
) -> dict[str, Any]:
    refusing = stop_reason(reply) == "refusal"
    message: dict[str, Any] = {
        "role": "assistant",
        "content": None if refusing or (reply.calls and not reply.answer) else reply.answer,
        "refusal": reply.answer if refusing else None,
        "annotations": [],
    }
    if reply.calls:
        message["tool_calls"] = _chat_tool_calls(reply, tool_ids)
    return {
        "id": chat_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": chat_finish_reason(reply),
            }
        ],
        "usage": usage,
        "service_tier": "default",
        "system_fingerprint": "fp_fake",
    }


def chat_chunks(completion: Mapping[str, Any], *, include_usage: bool) -> list[bytes]:
    """The SSE stream of a finished ``completion``, ending with ``data: [DONE]``."""
    base = {
        k: completion[k] for k in ("id", "created", "model", "service_tier", "system_fingerprint")
    }
    base["object"] = "chat.completion.chunk"
    message = completion["choices"][0]["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        data: dict[str, Any] = {
            **base,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }
        if include_usage:
            data["usage"] = None
        return sse(data)

    first: dict[str, Any] = {"role": "assistant", "content": "", "refusal": None}
    if message["content"] is None:
        first["content"] = None
    chunks = [chunk(first)]
    chunks += [chunk({"content": p}) for p in pieces(message["content"] or "")]
    chunks += [chunk({"refusal": p}) for p in pieces(message["refusal"] or "")]
    for index, call in enumerate(message.get("tool_calls", [])):
        head = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [head]}))
        for piece in json_pieces(call["function"]["arguments"]):
            chunks.append(
                chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            )
    chunks.append(chunk({}, completion["choices"][0]["finish_reason"]))
    if include_usage:
        chunks.append(sse({**base, "choices": [], "usage": completion["usage"]}))
    chunks.append(sse("[DONE]"))
    return chunks


def openai_error(
    message: str,
    error_type: str,
    param: str | None = None,
    code: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    return {
        "error": {
            "message": message,
            "type": error_type,
            "param": param,
            "code": code,
            **(extra or {}),
        }
    }


OPENAI_ERRORS = {
    400: ("invalid_request_error", "Invalid request"),
    401: ("invalid_request_error", "Incorrect API key provided."),
    403: ("invalid_request_error", "You are not allowed to access this resource."),
    404: ("invalid_request_error", "Not found"),
    429: ("requests", "Rate limit reached for requests. Please try again later."),
    500: (
        "server_error",
        "The server had an error while processing your request. Sorry about that!",
    ),
    503: ("server_error", "The server is overloaded or not ready yet."),
}


# --------------------------------------------------------------------------- OpenAI Responses


def responses_items(body: Mapping[str, Any]) -> list[Any]:
    """A request's ``input`` as a list of items (a string is one user message)."""
    value = body.get("input")
    if value is None:
        return []
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    return list(value) if isinstance(value, list) else [value]


def responses_segments(body: Mapping[str, Any], history: Sequence[Any]) -> list[str]:
    head = {
        "model": body.get("model"),
        "tools": body.get("tools"),
        "instructions": body.get("instructions"),
    }
    segments = [canonical(head)]
    for item in history:
        if not isinstance(item, dict):
            segments.append(canonical(item))
            continue
        # ids and status do not reach the model; a string content renders as one text part
        item = {k: v for k, v in item.items() if k not in ("id", "status")}
        item.setdefault("type", "message")
        if isinstance(item.get("content"), str):
            kind = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": kind, "text": item["content"]}]
        segments.append(canonical(item))
    return segments


def encrypt(summary: str) -> str:
    """Opaque reasoning content the fake server can verify when it comes back."""
    payload = base64.b64encode(summary.encode("utf-8")).decode()
    return f"fake:{payload}.{sign(payload)}"


def responses_output(
    reply: Reply, ids: Ids, tool_ids: Sequence[str], *, encrypted: bool
) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.thinking is not None:
        items.append(
            {
                "id": ids.new("rs"),
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": reply.thinking}],
                "encrypted_content": encrypt(reply.thinking) if encrypted else None,
            }
        )
    if reply.answer or not reply.calls:
        part: dict[str, Any] = (
            {"type": "refusal", "refusal": reply.answer}
            if stop_reason(reply) == "refusal"
            else {"type": "output_text", "text": reply.answer, "annotations": [], "logprobs": []}
        )
        items.append(
            {
                "id": ids.new("msg"),
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        )
    for call, cid in zip(reply.calls, tool_ids, strict=True):
        items.append(
            {
                "id": ids.new("fc"),
                "type": "function_call",
                "status": "completed",
                "arguments": dumps(dict(call.arguments)),
                "call_id": cid,
                "name": call.name,
            }
        )
    return items


def responses_usage(billing: Billing, reasoning_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": billing.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": billing.cache_read,
            "cache_write_tokens": billing.cache_write,
        },
        "output_tokens": billing.output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": billing.prompt_tokens + billing.output_tokens,
    }


def responses_object(
    reply: Reply,
    body: Mapping[str, Any],
    output: list[dict[str, Any]],
    *,
    resp_id: str,
    created: int,
    usage: dict[str, Any],
) -> dict[str, Any]:
    reason = stop_reason(reply)
    incomplete = {"max_tokens": "max_output_tokens", "content_filter": "content_filter"}.get(reason)
    return {
        "id": resp_id,
        "object": "response",
        "created_at": created,
        "status": "incomplete" if incomplete else "completed",
        "background": False,
        "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": body.get("model"),
        "output": output,
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "previous_response_id": body.get("previous_response_id"),
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "service_tier": "default",
        "store": body.get("store", True),
        "temperature": body.get("temperature", 1.0),
        "text": {"format": {"type": "text"}},
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools", []),
        "top_p": body.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": body.get("metadata") or {},
    }


def responses_events(response: Mapping[str, Any]) -> list[bytes]:
    """The SSE stream of a finished ``response``, with sequence numbers."""
    events: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append(sse({"type": kind, "sequence_number": len(events), **fields}, kind))

    pending = {
        **response,
        "status": "in_progress",
        "output": [],
        "usage": None,
        "incomplete_details": None,
    }
    emit("response.created", response=pending)
    emit("response.in_progress", response=pending)
    for index, item in enumerate(response["output"]):
        at = {"item_id": item["id"], "output_index": index}
        if item["type"] == "reasoning":
            emit("response.output_item.added", output_index=index, item={**item, "summary": []})
            for k, part in enumerate(item["summary"]):
                emit(
                    "response.reasoning_summary_part.added",
                    **at,
                    summary_index=k,
                    part={"type": "summary_text", "text": ""},
                )
                for piece in pieces(part["text"]):
                    emit(
                        "response.reasoning_summary_text.delta", **at, summary_index=k, delta=piece
                    )
                emit(
                    "response.reasoning_summary_text.done", **at, summary_index=k, text=part["text"]
                )
                emit("response.reasoning_summary_part.done", **at, summary_index=k, part=part)
        elif item["type"] == "message":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "content": []},
            )
            for k, part in enumerate(item["content"]):
                refusal = part["type"] == "refusal"
                key, kind = (
                    ("refusal", "response.refusal") if refusal else ("text", "response.output_text")
                )
                emit("response.content_part.added", **at, content_index=k, part={**part, key: ""})
                for piece in pieces(part[key]):
                    emit(
                        f"{kind}.delta",
                        **at,
                        content_index=k,
                        delta=piece,
                        **({} if refusal else {"logprobs": []}),
                    )
                emit(
                    f"{kind}.done",
                    **at,
                    content_index=k,
                    **{key: part[key]},
                    **({} if refusal else {"logprobs": []}),
                )
                emit("response.content_part.done", **at, content_index=k, part=part)
        elif item["type"] == "function_call":
            emit(
                "response.output_item.added",
                output_index=index,
                item={**item, "status": "in_progress", "arguments": ""},
            )
            for piece in json_pieces(item["arguments"]):
                emit("response.function_call_arguments.delta", **at, delta=piece)
            emit(
                "response.function_call_arguments.done",
                **at,
                name=item["name"],
                arguments=item["arguments"],
            )
        emit("response.output_item.done", output_index=index, item=item)
    final = "response.incomplete" if response["status"] == "incomplete" else "response.completed"
    emit(final, response=response)
    return events


def responses_stream_error(error_type: str, message: str, sequence_number: int) -> bytes:
    return sse(
        {
            "type": "error",
            "code": error_type,
            "message": message,
            "param": None,
            "sequence_number": sequence_number,
        },
        "error",
    )
