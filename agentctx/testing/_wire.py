"""Wire formats of the fake servers: response bodies, SSE streams, error bodies, and the
simulated prefix cache. Pure functions of a `Reply` and the request; no I/O."""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentctx.testing._validate import sign

if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence

    from agentctx.testing._reply import Reply

__all__ = [
    "ANTHROPIC_ERRORS",
    "CREATED_BASE",
    "Billing",
    "Ids",
    "PrefixCache",
    "anthropic_content",
    "anthropic_error",
    "anthropic_events",
    "anthropic_message",
    "anthropic_segments",
    "anthropic_usage",
    "call_ids",
    "canonical",
    "dumps",
    "estimate_tokens",
    "json_pieces",
    "output_estimate",
    "pieces",
    "sse",
    "stop_reason",
]

CREATED_BASE = 1_750_000_000  # fixed clock for `created` fields, so bodies are reproducible


def dumps(value: object) -> str:
    """Compact JSON as the real APIs send it: UTF-8 text, a lone surrogate (a scripted reply
    can hold one, as a reply decoded from JSON can) as its escape, which is all UTF-8 can
    carry of it."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, separators=(",", ":"))  # every non-ASCII character escaped
    return text


def canonical(value: object) -> str:
    """The form a prompt segment is compared in: key order and cache_control do not count,
    as they do not change what the model is shown."""
    return json.dumps(_strip(value), ensure_ascii=False, separators=(",", ":"), sort_keys=True)


def _strip(value: object) -> object:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def estimate_tokens(text: str) -> int:
    """The fake servers' token count: ``ceil(len(text) / 4)`` (characters, not bytes)."""
    return math.ceil(len(text) / 4)


@dataclass(frozen=True, slots=True)
class Billing:
    """Token numbers a fake server reported for one request, split the Anthropic way:
    ``input_tokens`` is uncached input; the whole prompt is `prompt_tokens`."""

    input_tokens: int
    cache_read: int
    cache_write: int
    output_tokens: int

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_read + self.cache_write


class Ids:
    """Deterministic ids, counted per prefix: ``msg_fake000001``, ``toolu_fake000001``, ..."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}

    def new(self, prefix: str, sep: str = "_") -> str:
        n = self._counts[prefix] = self._counts.get(prefix, 0) + 1
        return f"{prefix}{sep}fake{n:06d}"


class PrefixCache:
    """Simulated prompt cache: which leading segments of a prompt an earlier request shared.

    A prompt is a list of canonical segments (the tools/system head, then one per message);
    every prefix of every stored prompt is remembered by a rolling hash, with an expiry when
    ``ttl`` is set (refreshed on every hit, as Anthropic's cache does).
    """

    def __init__(self, ttl: float | None = None) -> None:
        self.ttl = ttl
        self._expiry: dict[bytes, float] = {}

    def clear(self) -> None:
        self._expiry.clear()

    def lookup(self, segments: Sequence[str], *, store: bool) -> tuple[int, int]:
        """Return ``(cached_tokens, total_tokens)``; with ``store``, remember this prompt."""
        now = time.monotonic()
        expiry = math.inf if self.ttl is None else now + self.ttl
        digest = b""
        cached = total = 0
        matching = True
        for segment in segments:
            digest = hashlib.sha256(digest + segment.encode("utf-8", "surrogatepass")).digest()
            tokens = estimate_tokens(segment)
            total += tokens
            if matching and self._expiry.get(digest, -1.0) >= now:
                cached += tokens
            else:
                matching = False
            if store or matching:
                self._expiry[digest] = expiry
        return cached, total

    def lookup_breakpoints(
        self, segments: Sequence[str], points: Sequence[int], lookback: int = 20
    ) -> tuple[int, int, int]:
        """Explicit breakpoints (segment indices holding a ``cache_control``): return
        ``(cached, written, total)`` tokens. A breakpoint reads the longest stored prefix ending
        at most ``lookback`` segments before it, and writes the prefix it ends."""
        now = time.monotonic()
        expiry = math.inf if self.ttl is None else now + self.ttl
        digests: list[bytes] = []
        ends: list[int] = []  # tokens of each prefix
        digest, total = b"", 0
        for segment in segments:
            digest = hashlib.sha256(digest + segment.encode("utf-8", "surrogatepass")).digest()
            total += estimate_tokens(segment)
            digests.append(digest)
            ends.append(total)
        hit = -1
        for point in points:
            for k in range(point, max(point - lookback, -1), -1):
                if self._expiry.get(digests[k], -1.0) >= now:
                    hit = max(hit, k)
                    break
        if hit >= 0:
            self._expiry[digests[hit]] = expiry
        for point in points:
            self._expiry[digests[point]] = expiry
        cached = ends[hit] if hit >= 0 else 0
        written = max(0, (ends[max(points)] if points else 0) - cached)
        return cached, written, total


# --------------------------------------------------------------------------- shared pieces


def pieces(text: str) -> list[str]:
    """Split text the way a stream delivers it: word by word, whitespace attached."""
    return re.findall(r"\s*\S+\s*", text) or ([text] if text else [])


def json_pieces(text: str, size: int = 12) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def stop_reason(reply: Reply) -> str:
    aliases = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
    return aliases.get(reply.stop_reason, reply.stop_reason)


def output_estimate(reply: Reply) -> int:
    out = reply.answer + (reply.thinking or "")
    out += "".join(c.name + dumps(dict(c.arguments)) for c in reply.calls)
    return max(1, estimate_tokens(out))


def call_ids(reply: Reply, ids: Ids, prefix: str) -> list[str]:
    return [c.id or ids.new(prefix) for c in reply.calls]


def sse(data: object, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    body = data if isinstance(data, str) else dumps(data)
    return f"{head}data: {body}\n\n".encode()


# --------------------------------------------------------------------------- Anthropic


def anthropic_segments(body: Mapping[str, Any]) -> list[str]:
    system = body.get("system")
    if isinstance(system, str):
        system = [{"type": "text", "text": system}]
    head = {"model": body.get("model"), "system": system, "tools": body.get("tools")}
    segments = [canonical(head)]
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, str):
            content = [{"type": "text", "text": content}]
        segments.append(canonical({"role": message.get("role"), "content": content}))
    return segments


def anthropic_content(reply: Reply, tool_ids: Sequence[str]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if reply.thinking is not None:
        blocks.append(
            {"type": "thinking", "thinking": reply.thinking, "signature": sign(reply.thinking)}
        )
    if reply.answer:
        blocks.append({"type": "text", "text": reply.answer})
    for call, cid in zip(reply.calls, tool_ids, strict=True):
        blocks.append(
            {"type": "tool_use", "id": cid, "name": call.name, "input": dict(call.arguments)}
        )
    return blocks


def anthropic_usage(billing: Billing, ttl: str = "5m") -> dict[str, Any]:
    return {
        "input_tokens": billing.input_tokens,
        "cache_creation_input_tokens": billing.cache_write,
        "cache_read_input_tokens": billing.cache_read,
        "cache_creation": {
            "ephemeral_5m_input_tokens": billing.cache_write if ttl != "1h" else 0,
            "ephemeral_1h_input_tokens": billing.cache_write if ttl == "1h" else 0,
        },
        "output_tokens": billing.output_tokens,
        "service_tier": "standard",
    }


def anthropic_message(
    reply: Reply, content: list[dict[str, Any]], *, msg_id: str, model: str, usage: dict[str, Any]
) -> dict[str, Any]:
    return {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(reply),
        "stop_sequence": None,
        "usage": usage,
    }


def anthropic_events(message: Mapping[str, Any]) -> list[bytes]:
    """The SSE stream of a finished ``message``, in the real event order."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events = [sse({"type": "message_start", "message": start}, "message_start")]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        empty: dict[str, Any] = {
            "text": {"text": ""},
            "thinking": {"thinking": "", "signature": ""},
        }.get(kind, {"input": {}} if kind == "tool_use" else {})
        events.append(
            sse(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {**block, **empty},
                },
                "content_block_start",
            )
        )
        if index == 0:
            events.append(sse({"type": "ping"}, "ping"))
        for delta in _anthropic_deltas(block):
            events.append(
                sse(
                    {"type": "content_block_delta", "index": index, "delta": delta},
                    "content_block_delta",
                )
            )
        events.append(sse({"type": "content_block_stop", "index": index}, "content_block_stop"))
    final_usage = {
        k: usage[k]
        for k in (
            "input_tokens",
            "cache_creation_input_tokens",
            "cache_read_input_tokens",
            "output_tokens",
        )
    }
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events.append(
        sse({"type": "message_delta", "delta": delta, "usage": final_usage}, "message_delta")
    )
    events.append(sse({"type": "message_stop"}, "message_stop"))
    return events


def _anthropic_deltas(block: Mapping[str, Any]) -> Iterable[dict[str, Any]]:
    kind = block["type"]
    if kind == "text":
        for piece in pieces(block["text"]):
            yield {"type": "text_delta", "text": piece}
    elif kind == "thinking":
        for piece in pieces(block["thinking"]):
            yield {"type": "thinking_delta", "thinking": piece}
        yield {"type": "signature_delta", "signature": block["signature"]}
    elif kind == "tool_use":
        yield {"type": "input_json_delta", "partial_json": ""}
        for piece in json_pieces(dumps(block["input"])):
            yield {"type": "input_json_delta", "partial_json": piece}


def anthropic_error(error_type: str, message: str, request_id: str) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": request_id,
    }


ANTHROPIC_ERRORS = {
    400: ("invalid_request_error", "Invalid request"),
    401: ("authentication_error", "invalid x-api-key"),
    403: (
        "permission_error",
        "Your API key does not have permission to use the specified resource.",
    ),
    404: ("not_found_error", "Not found"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
    500: ("api_error", "Internal server error"),
    503: ("api_error", "Service unavailable"),
    529: ("overloaded_error", "Overloaded"),
}
