"""Fake Anthropic and OpenAI HTTP servers for tests: real sockets, real wire formats.

```python
from agentctx.testing.servers import FakeAnthropic, Reply

async with FakeAnthropic([Reply.rate_limited(2), Reply.text("Done.")]) as server:
    client = anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0)
    ...
    assert server.requests[-1].json["messages"] == expected
    assert server.requests[-1].usage.cache_read > 0
```

Each server listens on 127.0.0.1 at an ephemeral port, in a thread of its own (so it works
with sync and async clients and may be started in one task and stopped in another, as
pytest-asyncio fixtures do). Use it as a context manager (``with`` or ``async with``), or
call `start` and `close`.

Every request is validated like the real API first: an invalid transcript (an orphan tool
result, a tool call without its result, an empty text block, ...) gets the provider's HTTP 400
body naming the problem, and the reply queue is left untouched. A valid request is answered
with the next queued `Reply`, or ``default`` when the queue is empty.

Prompt caching is simulated for every request, as if caching covered the whole prompt
(Anthropic's automatic caching): the prompt is split into segments (one for model + tools +
system/instructions, then one per message or input item, compared in canonical JSON with
``cache_control`` ignored); ``cache_read`` is the token count of the longest run of leading
segments that an earlier request also started with, ``cache_write`` the rest, and uncached
``input_tokens`` is 0. Tokens are estimated as ``ceil(len(canonical_json) / 4)``. Requests
answered with an error, a hang or an immediate reset leave the cache untouched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agentctx.testing import _compaction as native
from agentctx.testing import _openai_wire as owire
from agentctx.testing import _wire as wire
from agentctx.testing._base import FakeServer, RecordedRequest, Rendered
from agentctx.testing._reply import FakeToolCall, Reply, ReplyKind
from agentctx.testing._validate import (
    Invalid,
    cache_marks,
    message_marks,
    validate_anthropic,
    validate_chat,
    validate_responses,
)
from agentctx.testing._wire import Billing

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = [
    "Billing",
    "FakeAnthropic",
    "FakeOpenAI",
    "FakeServer",
    "FakeToolCall",
    "RecordedRequest",
    "Reply",
    "ReplyKind",
]


class FakeAnthropic(FakeServer):
    """A fake Anthropic API: ``POST /v1/messages`` (streamed or not) and
    ``POST /v1/messages/count_tokens``. A message request with ``compaction`` (beta
    ``compact-2026-09-04``) is a compaction request, answered with a signed ``compaction``
    block (see `agentctx.testing._compaction`).

    ``async with FakeAnthropic() as server:`` then
    ``anthropic.AsyncAnthropic(base_url=server.url, api_key="test", max_retries=0)``.

    Options: ``replies`` (the initial queue) and ``default`` (a `Reply`, or a function of the
    parsed request body returning one, called in the server thread); ``validate=False`` skips
    request validation; ``check_signatures=False`` accepts thinking blocks whose signature
    this server did not issue (the real API rejects them; use `signature_for` to make valid
    ones); ``context_window`` answers "prompt is too long" above that many estimated tokens;
    ``caching=False`` reports everything as uncached input; ``caching="breakpoints"`` caches
    only at explicit ``cache_control`` breakpoints, as the API does without automatic caching
    (a breakpoint writes the prefix it ends and reads the longest cached prefix ending at most
    20 segments — here, messages — before it; the rest is uncached input); ``cache_ttl``
    (seconds) expires cached prefixes not hit for that long; ``require_auth=False`` accepts
    requests without an API key or ``anthropic-version`` header.

    Validation (HTTP 400 ``invalid_request_error``, with the real API's wording where known):
    ``model`` and ``max_tokens`` present; roles ``user``/``assistant``; consecutive
    same-role messages merged into one turn, as the API does; the first turn is a user turn;
    non-empty content except a final assistant message; non-empty, non-whitespace text
    blocks; no trailing whitespace in a final assistant message; block types allowed for the
    role; ``tool_use`` ids unique in the whole request ("tool_use ids must be unique") and
    matching ``^[a-zA-Z0-9_-]+$``; every ``tool_use``
    answered by a ``tool_result`` at the start of the immediately following user turn; no
    ``tool_result`` without a ``tool_use`` in the previous assistant turn, none twice;
    ``tools`` defined when the transcript has tool blocks; thinking blocks signed by this
    server; with ``thinking`` enabled, the assistant turn of an in-flight tool loop starts
    with its thinking block; at most 4 ``cache_control`` breakpoints, none on a thinking
    block; thinking budget rules.
    """

    _request_id_header = "request-id"

    def _endpoints(self) -> Sequence[str]:
        return ("/v1/messages", "/v1/messages/count_tokens")

    def _auth_problem(self, headers: Mapping[str, str]) -> tuple[int, str] | None:
        if "x-api-key" not in headers and "authorization" not in headers:
            return 401, "x-api-key header is required"
        if "anthropic-version" not in headers:
            return 400, "anthropic-version: header is required"
        return None

    def _check(self, path: str, body: Any) -> Invalid | None:
        invalid = validate_anthropic(
            body,
            check_signatures=self.check_signatures,
            count_tokens=path.endswith("/count_tokens"),
        )
        problem = native.anthropic_blocks_problem(body, check_signatures=self.check_signatures)
        return invalid or (Invalid(problem) if problem else None)

    def _check_headers(self, path: str, body: Any, headers: Mapping[str, str]) -> Invalid | None:
        if path.endswith("/count_tokens"):  # counting accepts and ignores `compaction`
            return None
        problem = native.anthropic_request_problem(body, headers)
        return Invalid(problem) if problem else None

    def _count_tokens(self, path: str, body: Any) -> dict[str, Any] | None:
        if not path.endswith("/count_tokens"):
            return None
        return {"input_tokens": sum(map(wire.estimate_tokens, wire.anthropic_segments(body)))}

    def _segments(self, path: str, body: Any) -> list[str]:
        return wire.anthropic_segments(body)

    def _cache_points(self, body: Any) -> list[int] | None:
        head = cache_marks({"system": body.get("system"), "tools": body.get("tools")})
        messages = body.get("messages")
        marked = [bool(head), *map(message_marks, messages if isinstance(messages, list) else [])]
        return [i for i, part in enumerate(marked) if part]

    def _too_long(self, path: str, total: int, window: int) -> Invalid:
        return Invalid(f"prompt is too long: {total} tokens > {window} maximum")

    def _render(self, path: str, body: Any, reply: Reply, billing: Billing) -> Rendered:
        cache_control = body.get("cache_control")
        ttl = cache_control.get("ttl", "5m") if isinstance(cache_control, dict) else "5m"
        if body.get("compaction") is not None:
            compacted = native.anthropic_compaction_message(
                reply,
                msg_id=self._ids.new("msg"),
                model=str(body.get("model")),
                usage=wire.anthropic_usage(billing, ttl),
            )
            return Rendered(compacted, wire.anthropic_events(compacted))
        content = wire.anthropic_content(reply, wire.call_ids(reply, self._ids, "toolu"))
        message = wire.anthropic_message(
            reply,
            content,
            msg_id=self._ids.new("msg"),
            model=str(body.get("model")),
            usage=wire.anthropic_usage(billing, ttl),
        )
        return Rendered(message, wire.anthropic_events(message))

    def _error_json(
        self, status: int, error_type: str | None, message: str | None, extra: Mapping[str, object]
    ) -> tuple[int, dict[str, Any], str]:
        default_type, default_message = wire.ANTHROPIC_ERRORS.get(status, ("api_error", "Error"))
        text = message or default_message
        payload = wire.anthropic_error(error_type or default_type, text, self._ids.new("req"))
        payload["error"].update(extra)
        return status, payload, text

    def _invalid_json(self, invalid: Invalid) -> dict[str, Any]:
        return wire.anthropic_error("invalid_request_error", invalid.message, self._ids.new("req"))

    def _stream_fault(self, reply: Reply, path: str, sent: int) -> bytes:
        if reply.kind == "malformed":
            return b"event: content_block_delta\ndata: " + reply.body + b"\n\n"
        error = {
            "type": "error",
            "error": {
                "type": reply.error_type or "api_error",
                "message": reply.message or "Internal server error",
            },
        }
        return wire.sse(error, "error")


class FakeOpenAI(FakeServer):
    """A fake OpenAI API: ``POST /v1/chat/completions`` and ``POST /v1/responses`` (each
    streamed or not), ``POST /v1/responses/input_tokens``, and ``POST /v1/responses/compact``
    (the input's user messages and one encrypted compaction item, checked when it comes back;
    see `agentctx.testing._compaction`).

    ``async with FakeOpenAI() as server:`` then
    ``openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="test", max_retries=0)``.

    Options as for `FakeAnthropic`. `Reply.overloaded` is answered HTTP 503 (OpenAI has no
    529). Responses with ``store`` not false are kept, so ``previous_response_id`` works.

    Validation (HTTP 400 in OpenAI's error shape, ``param`` and ``code`` filled in):
    Chat: ``model`` present, non-empty ``messages``, known roles, content present
    (an assistant's may be null only with ``tool_calls``), ``function.arguments`` a string;
    an assistant message with ``tool_calls`` followed by one ``tool`` message per
    ``tool_call_id`` before any other message; a ``tool`` message only as such an answer;
    no ``tool_call_id`` answered twice anywhere in the request (the API's "Duplicate value
    for 'tool_call_id'": a call id repeated within a batch or on a later turn).
    Responses: every ``function_call_output.call_id`` matches an earlier
    ``function_call.call_id``, every ``function_call`` has exactly one output (a ``call_id``
    carried by two calls cannot be paired: "Duplicate function_call_output for call_id"),
    reasoning ``encrypted_content`` issued by this server comes back unmodified.
    """

    _request_id_header = "x-request-id"

    def _init_state(self) -> None:
        self._stored: dict[str, list[Any]] = {}  # stored responses, for previous_response_id

    def _endpoints(self) -> Sequence[str]:
        return (
            "/v1/chat/completions",
            "/v1/responses",
            "/v1/responses/input_tokens",
            native.COMPACT_PATH,
        )

    def _auth_problem(self, headers: Mapping[str, str]) -> tuple[int, str] | None:
        if not headers.get("authorization", "").startswith("Bearer "):
            return 401, (
                "You didn't provide an API key. You need to provide your API key in an "
                "Authorization header using Bearer auth."
            )
        return None

    def _history(self, body: Any) -> list[Any] | None:
        previous = body.get("previous_response_id")
        with self._lock:
            before = self._stored.get(previous, None) if previous else []
        return None if before is None else [*before, *owire.responses_items(body)]

    def _check(self, path: str, body: Any) -> Invalid | None:
        if path == "/v1/chat/completions":
            return validate_chat(body)
        if path == "/v1/responses/input_tokens":
            body = {"model": None, **body}  # counting takes no model
        if path == native.COMPACT_PATH and (invalid := native.compact_request_problem(body)):
            return invalid
        history = self._history(body)
        if history is None:
            return Invalid(
                f"Previous response with id '{body['previous_response_id']}' not found.",
                "previous_response_id",
                "previous_response_not_found",
            )
        return validate_responses(body, history, check_signatures=self.check_signatures)

    def _count_tokens(self, path: str, body: Any) -> dict[str, Any] | None:
        if path != "/v1/responses/input_tokens":
            return None
        tokens = sum(map(wire.estimate_tokens, self._segments(path, body)))
        return {"object": "response.input_tokens", "input_tokens": tokens}

    def _segments(self, path: str, body: Any) -> list[str]:
        if path == "/v1/chat/completions":
            return owire.chat_segments(body)
        return owire.responses_segments(body, self._history(body) or [])

    def _too_long(self, path: str, total: int, window: int) -> Invalid:
        if path.startswith("/v1/responses"):
            return Invalid(
                "Your input exceeds the context window of this model. Please adjust your input "
                "and try again.",
                "input",
                "context_length_exceeded",
            )
        return Invalid(
            f"This model's maximum context length is {window} tokens. However, your messages "
            f"resulted in {total} tokens. Please reduce the length of the messages.",
            "messages",
            "context_length_exceeded",
        )

    def _render(self, path: str, body: Any, reply: Reply, billing: Billing) -> Rendered:
        created = wire.CREATED_BASE + self._count
        if path == native.COMPACT_PATH:
            compacted = native.compacted_response(
                reply,
                self._history(body) or [],
                ids=self._ids,
                created=created,
                usage=owire.responses_usage(billing, 0),
            )
            return Rendered(compacted, [])
        tool_ids = wire.call_ids(reply, self._ids, "call")
        if path == "/v1/chat/completions":
            completion = owire.chat_completion(
                reply,
                tool_ids,
                chat_id=self._ids.new("chatcmpl", "-"),
                model=str(body.get("model")),
                created=created,
                usage=owire.chat_usage(billing),
            )
            options = body.get("stream_options")
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            return Rendered(completion, owire.chat_chunks(completion, include_usage=include_usage))
        include = body.get("include") or []
        output = owire.responses_output(
            reply, self._ids, tool_ids, encrypted="reasoning.encrypted_content" in include
        )
        reasoning = wire.estimate_tokens(reply.thinking or "")
        response = owire.responses_object(
            reply,
            body,
            output,
            resp_id=self._ids.new("resp"),
            created=created,
            usage=owire.responses_usage(billing, reasoning),
        )
        if body.get("store", True) is not False:
            history = [*(self._history(body) or []), *output]
            with self._lock:
                self._stored[response["id"]] = history
        return Rendered(response, owire.responses_events(response))

    def _error_json(
        self, status: int, error_type: str | None, message: str | None, extra: Mapping[str, object]
    ) -> tuple[int, dict[str, Any], str]:
        if status == 529:
            status = 503
        fallback = ("server_error" if status >= 500 else "invalid_request_error", "Error")
        default_type, default_message = owire.OPENAI_ERRORS.get(status, fallback)
        text = message or default_message
        code = {429: "rate_limit_exceeded", 401: "invalid_api_key"}.get(status)
        merged: dict[str, object] = {"code": code, **extra} if code else dict(extra)
        return status, owire.openai_error(text, error_type or default_type, extra=merged), text

    def _invalid_json(self, invalid: Invalid) -> dict[str, Any]:
        return owire.openai_error(
            invalid.message, "invalid_request_error", invalid.param, invalid.code
        )

    def _stream_fault(self, reply: Reply, path: str, sent: int) -> bytes:
        if reply.kind == "malformed":
            prefix = (
                b"" if path == "/v1/chat/completions" else b"event: response.output_text.delta\n"
            )
            return prefix + b"data: " + reply.body + b"\n\n"
        error_type = reply.error_type or "server_error"
        message = reply.message or "The server had an error while processing your request."
        if path == "/v1/chat/completions":
            return wire.sse(owire.openai_error(message, error_type))
        return owire.responses_stream_error(error_type, message, sent)
