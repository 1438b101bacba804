"""Request validation of the fake servers: the transcript rules the real APIs enforce.

Each validator returns the first problem as an `Invalid` (rendered by the server as an HTTP 400
in the provider's error shape) or None. Messages follow the real APIs' wording where it is
known, so a test can match on the same text a production log would show.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeGuard

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

__all__ = [
    "Invalid",
    "sign",
    "signature_ok",
    "validate_anthropic",
    "validate_chat",
    "validate_responses",
]

_KEY = b"agentctx-fake-server"
_ID = re.compile(r"^[a-zA-Z0-9_-]+$")
_TOOL_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,128}$")

_USER_BLOCKS = frozenset(
    {"text", "image", "document", "search_result", "tool_result", "container_upload"}
)
_ASSISTANT_BLOCKS = frozenset(
    {
        "text",
        "thinking",
        "redacted_thinking",
        "tool_use",
        "server_tool_use",
        "mcp_tool_use",
        "mcp_tool_result",
        "compaction",
        "container_upload",
    }
)
_TOOL_RESULT_CONTENT = frozenset({"text", "image", "document", "search_result", "tool_reference"})


@dataclass(frozen=True, slots=True)
class Invalid:
    """Why a request is rejected; ``param`` and ``code`` are OpenAI's error fields."""

    message: str
    param: str | None = None
    code: str | None = None


def sign(text: str) -> str:
    """The fake server's signature of a thinking block or reasoning item: base64 HMAC."""
    return base64.b64encode(
        hmac.digest(_KEY, text.encode("utf-8", "surrogatepass"), hashlib.sha256)
    ).decode()


def signature_ok(text: str, signature: object) -> bool:
    return isinstance(signature, str) and hmac.compare_digest(signature, sign(text))


def _is_obj(value: object) -> TypeGuard[dict[str, Any]]:
    return isinstance(value, dict)


# --------------------------------------------------------------------------- Anthropic


def validate_anthropic(
    body: Any, *, check_signatures: bool = True, count_tokens: bool = False
) -> Invalid | None:
    """Validate a ``POST /v1/messages`` body the way the real API does (``count_tokens``: the
    body of ``POST /v1/messages/count_tokens``, which needs neither ``max_tokens`` nor tools)."""
    if not _is_obj(body):
        return Invalid("Input should be a valid dictionary")
    if "model" not in body:
        return Invalid("model: Field required")
    if not count_tokens:
        max_tokens = body.get("max_tokens")
        if max_tokens is None:
            return Invalid("max_tokens: Field required")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return Invalid("max_tokens: Input should be greater than or equal to 1")
    problem = _anthropic_params(body)
    if problem:
        return Invalid(problem)
    messages = body.get("messages")
    if messages is None:
        return Invalid("messages: Field required")
    if not isinstance(messages, list):
        return Invalid("messages: Input should be a valid list")
    if not messages:
        return Invalid("messages: at least one message is required")
    problem = _anthropic_messages(messages, body, check_signatures, count_tokens)
    return Invalid(problem) if problem else None


def _anthropic_params(body: Mapping[str, Any]) -> str | None:
    system = body.get("system")
    if system is not None and not isinstance(system, str):
        if not isinstance(system, list):
            return "system: Input should be a valid string or list"
        for j, block in enumerate(system):
            if not _is_obj(block) or block.get("type") != "text":
                return f"system.{j}.type: Input should be 'text'"
            if not isinstance(block.get("text"), str) or not block["text"]:
                return "system: text content blocks must be non-empty"
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            return "tools: Input should be a valid list"
        names: set[str] = set()
        for k, tool in enumerate(tools):
            if not _is_obj(tool):
                return f"tools.{k}: Input should be a valid dictionary"
            if tool.get("type") not in (None, "custom"):
                continue  # server tools (web search, code execution, ...) have their own shapes
            name = tool.get("name")
            if not isinstance(name, str) or not _TOOL_NAME.match(name):
                return f"tools.{k}.custom.name: String should match pattern '{_TOOL_NAME.pattern}'"
            if "input_schema" not in tool:
                return f"tools.{k}.custom.input_schema: Field required"
            if name in names:
                return "tools: Tool names must be unique."
            names.add(name)
    thinking = body.get("thinking")
    if _is_obj(thinking) and thinking.get("type") == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            return "thinking.enabled.budget_tokens: Input should be greater than or equal to 1024"
        max_tokens = body.get("max_tokens")
        if isinstance(max_tokens, int) and max_tokens <= budget:
            return "`max_tokens` must be greater than `thinking.budget_tokens`."
    marks = cache_marks(body)
    if len(marks) > 4:
        return f"A maximum of 4 blocks with cache_control may be provided. Found {len(marks)}."
    ttls = [mark.get("ttl", "5m") for mark in marks if _is_obj(mark)]
    first_short = next((i for i, ttl in enumerate(ttls) if ttl != "1h"), len(ttls))
    if "1h" in ttls[first_short:]:
        return (
            "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control "
            "block. Note that blocks are processed in the following order: `tools`, `system`, "
            "`messages`."
        )
    return None


def cache_marks(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The ``cache_control`` breakpoints of a Messages request, in the order the API reads
    them (tools, system, messages), where it reads them: on a tool, a system block, a content
    block or a tool result's inner block (not a tool's schema or a tool call's input); a null
    mark is none."""
    tools, system = body.get("tools"), body.get("system")
    marks = [t["cache_control"] for t in _listed(tools) if _is_obj(t.get("cache_control"))]
    marks += [b["cache_control"] for b in _listed(system) if _is_obj(b.get("cache_control"))]
    for message in _listed(body.get("messages")):
        marks += message_marks(message)
    return marks


def message_marks(message: object) -> list[dict[str, Any]]:
    """The ``cache_control`` breakpoints of one message (`cache_marks`)."""
    marks = []
    for block in _listed(message.get("content") if _is_obj(message) else None):
        if _is_obj(block.get("cache_control")):
            marks.append(block["cache_control"])
        if block.get("type") == "tool_result":
            inner = _listed(block.get("content"))
            marks += [b["cache_control"] for b in inner if _is_obj(b.get("cache_control"))]
    return marks


def _listed(value: object) -> list[dict[str, Any]]:
    return [v for v in value if _is_obj(v)] if isinstance(value, list) else []


def _blocks(content: object) -> list[Any] | None:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return content
    return None


def _anthropic_messages(
    messages: Sequence[Any], body: Mapping[str, Any], check_signatures: bool, count_tokens: bool
) -> str | None:
    last = len(messages) - 1
    seen_ids: set[str] = set()
    uses_tools = False
    # Consecutive messages with the same role are merged into one turn, as the API does;
    # each turn keeps (message index, block index, block) so errors name the original place.
    turns: list[tuple[str, list[tuple[int, int, Any]]]] = []
    for i, message in enumerate(messages):
        if not _is_obj(message):
            return f"messages.{i}: Input should be a valid dictionary"
        role = message.get("role")
        if role not in ("user", "assistant"):
            return f"messages.{i}.role: Input should be 'user' or 'assistant'"
        if "content" not in message:
            return f"messages.{i}.content: Field required"
        blocks = _blocks(message["content"])
        if blocks is None:
            return f"messages.{i}.content: Input should be a valid string or list"
        final_assistant = i == last and role == "assistant"
        if not blocks or (isinstance(message["content"], str) and not message["content"]):
            if final_assistant:
                continue
            return (
                f"messages.{i}: all messages must have non-empty content except for the "
                "optional final assistant message"
            )
        allowed = _USER_BLOCKS if role == "user" else _ASSISTANT_BLOCKS
        for j, block in enumerate(blocks):
            where = f"messages.{i}.content.{j}"
            problem = _anthropic_block(block, where, role, allowed, seen_ids, check_signatures)
            if problem:
                return problem
            uses_tools |= block["type"] in ("tool_use", "tool_result")
        if final_assistant and blocks:
            tail = blocks[-1]
            if tail.get("type") == "text" and tail["text"] != tail["text"].rstrip():
                return "messages: final assistant content cannot end with trailing whitespace"
        located = [(i, j, block) for j, block in enumerate(blocks)]
        if turns and turns[-1][0] == role:
            turns[-1][1].extend(located)
        else:
            turns.append((role, located))
    if not turns:
        return "messages: at least one message is required"
    # A compaction block stands for everything before it, so a request may open with it.
    if turns[0][0] != "user" and turns[0][1][0][2].get("type") != "compaction":
        return 'messages: first message must use the "user" role'
    if uses_tools and not body.get("tools") and not count_tokens:
        return "Requests which include `tool_use` or `tool_result` blocks must define tools."
    return _anthropic_pairing(turns) or _anthropic_thinking(turns, body)


def _anthropic_block(
    block: Any,
    where: str,
    role: str,
    allowed: frozenset[str],
    seen_ids: set[str],
    check_signatures: bool,
) -> str | None:
    if not _is_obj(block) or not isinstance(block.get("type"), str):
        return f"{where}: Input should be a valid dictionary with a 'type'"
    kind = block["type"]
    if kind not in allowed and not (role == "assistant" and kind.endswith("_tool_result")):
        expected = ", ".join(f"'{t}'" for t in sorted(allowed))
        return (
            f"{where}: Input tag '{kind}' found using 'type' does not match any of the "
            f"expected tags: {expected}"
        )
    if kind == "text":
        problem = _text_problem(block, where)
        if problem:
            return problem
    elif kind == "tool_use":
        tool_id = block.get("id")
        if not isinstance(tool_id, str) or not _ID.match(tool_id):
            return f"{where}.tool_use.id: String should match pattern '{_ID.pattern}'"
        if tool_id in seen_ids:  # anywhere in the request, not only within a message
            return f"{where}: tool_use ids must be unique"
        seen_ids.add(tool_id)
        if not isinstance(block.get("name"), str):
            return f"{where}.tool_use.name: Field required"
        if not _is_obj(block.get("input")):
            return f"{where}.tool_use.input: Input should be a valid dictionary"
    elif kind == "tool_result":
        if not isinstance(block.get("tool_use_id"), str):
            return f"{where}.tool_result.tool_use_id: Field required"
        content = block.get("content", "")
        if not isinstance(content, str):
            if not isinstance(content, list):
                return f"{where}.tool_result.content: Input should be a valid string or list"
            for k, part in enumerate(content):
                if not _is_obj(part) or part.get("type") not in _TOOL_RESULT_CONTENT:
                    return f"{where}.tool_result.content.{k}: Input tag does not match"
                if part["type"] == "text":
                    problem = _text_problem(part, f"{where}.tool_result.content.{k}")
                    if problem:
                        return problem
        if "is_error" in block and not isinstance(block["is_error"], bool):
            return f"{where}.tool_result.is_error: Input should be a valid boolean"
        if block.get("is_error") is True and (
            not content.strip() if isinstance(content, str) else not content
        ):
            return f"{where}.tool_result: content cannot be empty if `is_error` is true"
    elif kind in ("thinking", "redacted_thinking") and "cache_control" in block:
        return f"{where}.{kind}.cache_control: Extra inputs are not permitted"
    elif kind == "thinking":
        if not isinstance(block.get("thinking"), str):
            return f"{where}.thinking.thinking: Field required"
        if not isinstance(block.get("signature"), str):
            return f"{where}.thinking.signature: Field required"
        if check_signatures and not signature_ok(block["thinking"], block["signature"]):
            return f"{where}: Invalid `signature` in `thinking` block"
    elif kind == "redacted_thinking" and not isinstance(block.get("data"), str):
        return f"{where}.redacted_thinking.data: Field required"
    return None


def _text_problem(block: Mapping[str, Any], where: str) -> str | None:
    text = block.get("text")
    if not isinstance(text, str):
        return f"{where}.text: Input should be a valid string"
    if not text:
        return f"{where}: text content blocks must be non-empty"
    if not text.strip():
        return f"{where}: text content blocks must contain non-whitespace text"
    return None


def _anthropic_pairing(turns: Sequence[tuple[str, list[tuple[int, int, Any]]]]) -> str | None:
    for t, (role, located) in enumerate(turns):
        if role == "assistant":
            calls = [(i, b["id"]) for i, _j, b in located if b["type"] == "tool_use"]
            if not calls:
                continue
            nxt = turns[t + 1][1] if t + 1 < len(turns) else []
            leading: list[str] = []
            for _i, _j, b in nxt:
                if b["type"] != "tool_result":
                    break  # results after other content do not count as "immediately after"
                leading.append(b["tool_use_id"])
            missing = [cid for _i, cid in calls if cid not in leading]
            if missing:
                index = max(i for i, cid in calls if cid in missing)
                return (
                    f"messages.{index}: `tool_use` ids were found without `tool_result` "
                    f"blocks immediately after: {', '.join(missing)}. Each `tool_use` block "
                    "must have a corresponding `tool_result` block in the next message."
                )
        else:
            prev = turns[t - 1][1] if t > 0 else []
            ids = {b["id"] for _i, _j, b in prev if b["type"] == "tool_use"}
            answered: set[str] = set()
            for i, j, b in located:
                if b["type"] != "tool_result":
                    continue
                cid = b["tool_use_id"]
                if cid not in ids:
                    return (
                        f"messages.{i}.content.{j}: unexpected `tool_use_id` found in "
                        f"`tool_result` blocks: {cid}. Each `tool_result` block must have a "
                        "corresponding `tool_use` block in the previous message."
                    )
                if cid in answered:
                    return (
                        f"messages.{i}.content.{j}: found multiple `tool_result` blocks with "
                        f"id: {cid}"
                    )
                answered.add(cid)
    return None


def _anthropic_thinking(
    turns: Sequence[tuple[str, list[tuple[int, int, Any]]]], body: Mapping[str, Any]
) -> str | None:
    thinking = body.get("thinking")
    enabled = _is_obj(thinking) and thinking.get("type") in ("enabled", "adaptive")
    role, blocks = turns[-1]
    if role == "assistant":  # the final position: a prefill
        i, j, last = blocks[-1]
        if last["type"] in _THINKING:
            return (
                f"messages.{i}.content.{j}: The final block in an assistant message cannot be "
                "`thinking`."
            )
        if not enabled:
            for i, j, block in blocks:
                if block["type"] in _THINKING:
                    return (
                        f"messages.{i}.content.{j}.type: When thinking is disabled, an "
                        "`assistant` message in the final position cannot contain `thinking`. "
                        "Please either enable thinking or remove the thinking blocks."
                    )
        return None
    # In a tool loop (the request ends with tool results) the assistant turn being answered
    # must start with its thinking block: that is what a compactor must never drop. The turn
    # is every assistant message since the user last spoke (results, and text sent after
    # them, continue it): without interleaved thinking only its first step thinks.
    if not enabled or blocks[0][2]["type"] != "tool_result":
        return None
    start = None
    for k in range(len(turns) - 2, -1, -1):
        role, blocks = turns[k]
        if role == "assistant":
            start = k
        elif blocks[0][2]["type"] != "tool_result":
            break
    if start is None:
        return None
    i, j, first = turns[start][1][0]
    if first["type"] in _THINKING:
        return None
    return (
        f"messages.{i}.content.{j}.type: Expected `thinking` or `redacted_thinking`, but found "
        f"`{first['type']}`. When `thinking` is enabled, a final `assistant` message must start "
        "with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` "
        "blocks). We recommend you include thinking blocks from previous turns. To avoid this "
        "requirement, disable `thinking`. Please consult our documentation at "
        "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
    )


_THINKING = ("thinking", "redacted_thinking")


# --------------------------------------------------------------------------- OpenAI Chat

_CHAT_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


def validate_chat(body: Any) -> Invalid | None:
    """Validate a ``POST /v1/chat/completions`` body the way the real API does."""
    if not _is_obj(body):
        return Invalid("We could not parse the JSON body of your request.")
    if "model" not in body:
        return Invalid("you must provide a model parameter")
    messages = body.get("messages")
    if messages is None:
        return Invalid(
            "Missing required parameter: 'messages'.", "messages", "missing_required_parameter"
        )
    if not isinstance(messages, list):
        return Invalid(
            "Invalid type for 'messages': expected an array.", "messages", "invalid_type"
        )
    if not messages:
        return Invalid(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got "
            "an empty array instead.",
            "messages",
            "empty_array",
        )
    pending: list[str] = []
    pending_at = -1
    after_calls = False
    answered_at: dict[str, int] = {}  # tool_call_id -> the tool message that answered it
    for i, message in enumerate(messages):
        if not _is_obj(message):
            return Invalid(f"Invalid type for 'messages[{i}]'.", f"messages[{i}]", "invalid_type")
        role = message.get("role")
        if role not in _CHAT_ROLES:
            return Invalid(
                f"Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', "
                "'function', 'tool', and 'developer'.",
                f"messages[{i}].role",
                "invalid_value",
            )
        if role == "tool":
            problem = _chat_tool_message(message, i, pending, after_calls, answered_at)
            if problem:
                return problem
            pending.remove(message["tool_call_id"])
            answered_at[message["tool_call_id"]] = i
            continue
        if pending:
            return _unanswered(pending, pending_at)
        after_calls = False
        problem = _chat_message(message, i)
        if problem:
            return problem
        calls = message.get("tool_calls") if role == "assistant" else None
        if calls:
            pending = [c["id"] for c in calls]
            pending_at = i
            after_calls = True
    if pending:
        return _unanswered(pending, pending_at)
    return None


def _unanswered(pending: Sequence[str], at: int) -> Invalid:
    return Invalid(
        "An assistant message with 'tool_calls' must be followed by tool messages responding "
        "to each 'tool_call_id'. The following tool_call_ids did not have response messages: "
        + ", ".join(pending),
        f"messages.[{at}].role",
    )


def _chat_tool_message(
    message: Mapping[str, Any],
    i: int,
    pending: Sequence[str],
    after_calls: bool,
    answered_at: Mapping[str, int],
) -> Invalid | None:
    if not after_calls:
        return Invalid(
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding "
            "message with 'tool_calls'.",
            f"messages.[{i}].role",
        )
    cid = message.get("tool_call_id")
    if not isinstance(cid, str):
        return Invalid(
            f"Missing required parameter: 'messages[{i}].tool_call_id'.",
            f"messages[{i}].tool_call_id",
            "missing_required_parameter",
        )
    if cid in answered_at:
        # The API keys tool messages by id over the whole request: an id answered twice,
        # in one batch or on two turns (``call_0`` each turn), is rejected.
        return Invalid(
            f"Invalid parameter: Duplicate value for 'tool_call_id' of '{cid}', in "
            f"messages[{answered_at[cid]}] and messages[{i}].",
            f"messages.[{i}].tool_call_id",
        )
    if cid not in pending:
        return Invalid(
            f"Invalid parameter: 'tool_call_id' of '{cid}' not found in 'tool_calls' of "
            "previous message.",
            f"messages.[{i}].tool_call_id",
        )
    problem = _chat_content(message, i, required=True)
    content = message.get("content")
    # The API takes images in user messages only (the SDK types a tool message's content as
    # a string or text parts).
    if (
        problem is None
        and isinstance(content, list)
        and any(part["type"] == "image_url" for part in content)
    ):
        return Invalid(
            f"Invalid 'messages[{i}]'. Image URLs are only allowed for messages with role "
            "'user', but this message with role 'tool' contains an image URL.",
            f"messages[{i}]",
        )
    return problem


def _chat_message(message: Mapping[str, Any], i: int) -> Invalid | None:
    role = message["role"]
    if role != "assistant":
        return _chat_content(message, i, required=True)
    calls = message.get("tool_calls")
    if calls is not None:
        if not isinstance(calls, list):
            return Invalid(
                f"Invalid type for 'messages[{i}].tool_calls': expected an array.",
                f"messages[{i}].tool_calls",
                "invalid_type",
            )
        if not calls:
            return Invalid(
                f"Invalid 'messages[{i}].tool_calls': empty array. Expected an array with "
                "minimum length 1, but got an empty array instead.",
                f"messages[{i}].tool_calls",
                "empty_array",
            )
        for k, call in enumerate(calls):
            where = f"messages[{i}].tool_calls[{k}]"
            if not _is_obj(call) or not isinstance(call.get("id"), str):
                return Invalid(
                    f"Missing required parameter: '{where}.id'.",
                    f"{where}.id",
                    "missing_required_parameter",
                )
            kind = call.get("type")
            if kind is None:
                return Invalid(
                    f"Missing required parameter: '{where}.type'.",
                    f"{where}.type",
                    "missing_required_parameter",
                )
            if kind not in ("function", "custom"):
                return Invalid(
                    f"Invalid value: '{kind}'. Supported values are: 'function' and 'custom'.",
                    f"{where}.type",
                    "invalid_value",
                )
            if kind == "custom":  # a custom tool's call: free-form input text
                custom = call.get("custom")
                if not (
                    _is_obj(custom)
                    and isinstance(custom.get("name"), str)
                    and isinstance(custom.get("input"), str)
                ):
                    return Invalid(
                        f"Missing required parameter: '{where}.custom'.",
                        f"{where}.custom",
                        "missing_required_parameter",
                    )
                continue
            function = call.get("function")
            if not _is_obj(function) or not isinstance(function.get("name"), str):
                return Invalid(
                    f"Missing required parameter: '{where}.function'.",
                    f"{where}.function",
                    "missing_required_parameter",
                )
            arguments = function.get("arguments")
            if not isinstance(arguments, str):
                got = "an object" if _is_obj(arguments) else type(arguments).__name__
                return Invalid(
                    f"Invalid type for '{where}.function.arguments': expected a string, but got "
                    f"{got} instead.",
                    f"{where}.function.arguments",
                    "invalid_type",
                )
    # An earlier spoken answer goes back by its audio id alone (the audio guide's form).
    audio = message.get("audio")
    if (
        message.get("content") is None
        and not calls
        and message.get("refusal") is None
        and not audio
    ):
        return Invalid(
            "Invalid value for 'content': expected a string, got null.",
            f"messages.[{i}].content",
        )
    if message.get("content") is not None:
        return _chat_content(message, i, required=False)
    return None


def _chat_content(message: Mapping[str, Any], i: int, *, required: bool) -> Invalid | None:
    if "content" not in message or (required and message["content"] is None):
        return Invalid(
            f"Missing required parameter: 'messages[{i}].content'.",
            f"messages[{i}].content",
            "missing_required_parameter",
        )
    content = message["content"]
    if isinstance(content, str):
        return None
    if not isinstance(content, list):
        return Invalid(
            f"Invalid type for 'messages[{i}].content': expected one of a string or array of "
            "objects.",
            f"messages[{i}].content",
            "invalid_type",
        )
    for k, part in enumerate(content):
        if not _is_obj(part) or not isinstance(part.get("type"), str):
            return Invalid(
                f"Invalid type for 'messages[{i}].content[{k}]': expected an object.",
                f"messages[{i}].content[{k}]",
                "invalid_type",
            )
    return None


# --------------------------------------------------------------------------- OpenAI Responses


def validate_responses(
    body: Any, history: Sequence[Any], *, check_signatures: bool = True
) -> Invalid | None:
    """Validate a ``POST /v1/responses`` body; ``history`` is the expanded item list (the
    ``previous_response_id`` chain followed by this request's input)."""
    if not _is_obj(body):
        return Invalid("We could not parse the JSON body of your request.")
    if "model" not in body:
        return Invalid(
            "Missing required parameter: 'model'.", "model", "missing_required_parameter"
        )
    calls: dict[str, int] = {}  # call_id -> how many call items (function, custom) carry it
    answered: set[str] = set()
    built_in: set[tuple[str, str]] = set()  # (type, call_id) of a computer_call, shell_call, ...
    for k, item in enumerate(history):
        if not _is_obj(item):
            return Invalid(f"Invalid type for 'input[{k}]'.", "input", "invalid_type")
        kind = item.get("type", "message")
        if kind in _ID_REQUIRED and not isinstance(item.get("id"), str):
            return Invalid(
                f"Missing required parameter: 'input[{k}].id'.",
                "input",
                "missing_required_parameter",
            )
        if (unknown := _unknown_field(item, k)) is not None:
            return unknown
        if kind == "message":
            if item.get("role") not in ("user", "assistant", "system", "developer"):
                return Invalid(
                    f"Invalid value: '{item.get('role')}'. Supported values are: 'assistant', "
                    "'system', 'developer', and 'user'.",
                    "input",
                    "invalid_value",
                )
            if not isinstance(item.get("content"), str | list):
                return Invalid("Missing required parameter: 'content'.", "input")
        elif kind == "function_call":
            cid = item.get("call_id")
            if not isinstance(cid, str) or not isinstance(item.get("name"), str):
                return Invalid("Missing required parameter: 'call_id'.", "input")
            if not isinstance(item.get("arguments"), str):
                return Invalid(
                    "Invalid type for 'arguments': expected a string.", "input", "invalid_type"
                )
            calls[cid] = calls.get(cid, 0) + 1
        elif kind == "custom_tool_call":
            cid = item.get("call_id")
            if not isinstance(cid, str) or not isinstance(item.get("input"), str):
                return Invalid("Missing required parameter: 'input'.", "input")
            calls[cid] = calls.get(cid, 0) + 1
        elif kind in ("function_call_output", "custom_tool_call_output"):
            cid = item.get("call_id")
            if cid not in calls:
                what = "function call" if kind == "function_call_output" else "custom tool call"
                return Invalid(f"No tool call found for {what} output with call_id {cid}.", "input")
            if cid in answered:
                # Outputs pair with calls by call_id alone: a repeated id (two calls, or one
                # answered twice) cannot be paired, and the API refuses the input.
                return Invalid(
                    f"Duplicate function_call_output for call_id '{cid}'. Each function_call "
                    "must have exactly one matching function_call_output",
                    "input",
                )
            answered.add(cid)
        elif isinstance(kind, str) and isinstance(cid := _call_id_of(item), str):
            # A built-in tool's call and its output (computer_call, computer_call_output, ...)
            # pair by call_id as function calls do.
            if not kind.endswith("_call_output"):
                built_in.add((kind, cid))
            elif (kind.removesuffix("_output"), cid) not in built_in:
                what = kind.removesuffix("_call_output").replace("_", " ")
                return Invalid(f"No tool call found for {what} call output with call_id {cid}.")
        if kind == "reasoning" and not _follows_reasoning(history[k + 1 : k + 2]):
            return Invalid(
                f"Item '{item.get('id')}' of type 'reasoning' was provided without its "
                "required following item.",
                "input",
            )
        if kind in ("reasoning", "compaction") and check_signatures:
            encrypted = item.get("encrypted_content")
            if isinstance(encrypted, str) and encrypted.startswith("fake:"):
                payload, _, mac = encrypted[5:].rpartition(".")
                if not signature_ok(payload, mac):
                    return Invalid(
                        f"The encrypted content for item {item.get('id')} could not be verified.",
                        "input",
                        "invalid_encrypted_content",
                    )
    for cid, times in calls.items():
        if cid not in answered or times > 1:
            return Invalid(f"No tool output found for function call {cid}.", "input")
    outputs = {
        (kind.removesuffix("_output"), _call_id_of(item))
        for item in history
        if isinstance(kind := item.get("type"), str) and kind.endswith("_call_output")
    }
    for kind, cid in sorted(built_in):
        if kind in _ANSWERED_BUILT_INS and (kind, cid) not in outputs:
            what = kind.removesuffix("_call").replace("_", " ")
            return Invalid(f"No tool output found for {what} call {cid}.", "input")
    return None


# Fields the SDK's parsed types add to what ``responses.parse`` returns, kept out of requests
# by the SDK (``__api_exclude__``): the API rejects them as unknown (openai-python issue #2720).
_SDK_ONLY_CALL_FIELDS = frozenset({"parsed_arguments"})
_SDK_ONLY_TEXT_FIELDS = frozenset({"parsed"})


def _unknown_field(item: Mapping[str, Any], k: int) -> Invalid | None:
    """The first field of input item ``k`` (or of its ``output_text`` parts) the API rejects
    as unknown, of those checked."""
    kind = item.get("type", "message")
    if kind == "function_call":
        return _unknown(item, _SDK_ONLY_CALL_FIELDS, f"input[{k}]")
    if kind == "message" and isinstance(item.get("content"), list):
        for j, part in enumerate(item["content"]):
            if _is_obj(part) and part.get("type") == "output_text":
                found = _unknown(part, _SDK_ONLY_TEXT_FIELDS, f"input[{k}].content[{j}]")
                if found is not None:
                    return found
    return None


def _unknown(obj: Mapping[str, Any], rejected: frozenset[str], where: str) -> Invalid | None:
    extra = next((f for f in obj if f in rejected), None)
    if extra is None:
        return None
    return Invalid(
        f"Unknown parameter: '{where}.{extra}'.", f"{where}.{extra}", "unknown_parameter"
    )


def _call_id_of(item: Any) -> object:
    """An item's ``call_id``; a ``local_shell_call_output``'s is its ``id`` (its SDK type has
    no ``call_id``: the API documents ``id`` as the id of the call it answers)."""
    cid = item.get("call_id")
    if cid is None and item.get("type") == "local_shell_call_output":
        return item.get("id")
    return cid


# Built-in tools the client runs, whose call the API refuses without its output.
_ANSWERED_BUILT_INS = frozenset(
    {"computer_call", "local_shell_call", "shell_call", "apply_patch_call"}
)


# Input items whose ``id`` the API requires (the SDK's params mark it ``Required``).
_ID_REQUIRED = frozenset(
    {
        "item_reference",
        "web_search_call",
        "file_search_call",
        "computer_call",
        "code_interpreter_call",
        "image_generation_call",
        "local_shell_call",
        "mcp_call",
        "mcp_list_tools",
        "mcp_approval_request",
    }
)


def _follows_reasoning(after: Sequence[Any]) -> bool:
    """Whether ``after`` (the item after a reasoning item, if any) is what the model made
    with it: not nothing, a function call's output or a message of another role."""
    if not after or not _is_obj(after[0]):
        return False
    kind = after[0].get("type", "message")
    if kind in ("function_call_output", "custom_tool_call_output"):
        return False
    return kind != "message" or after[0].get("role") == "assistant"
