from __future__ import annotations

import pytest

from agentctx import UnsupportedMessageError
from agentctx.messages import (
    AssistantMessage,
    ImageBlock,
    OpaqueBlock,
    RedactedThinkingBlock,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
    canonical_json,
    check_history,
    fingerprint,
    from_dict,
    to_dict,
)


def every_kind() -> list[object]:
    return [
        UserMessage((TextBlock("hi", {"cache_control": {"type": "ephemeral"}}),), {"ts": 1}),
        UserMessage((ImageBlock("image/png", "aGk="), OpaqueBlock("anthropic", {"type": "doc"}))),
        AssistantMessage(
            (
                ThinkingBlock("hmm", "c2ln"),
                RedactedThinkingBlock("ZW5j"),
                TextBlock("ok"),
                ToolCall("c1", "read", {"path": "a.py", "nested": {"x": [1, 2]}}),
                OpaqueBlock("anthropic", {"type": "server_tool_use", "id": "s1"}),
            ),
            "tool_use",
            Usage(10, 5, 100, 20),
            "claude-x",
            {"id": "msg_1"},
        ),
        ToolResultMessage("c1", (TextBlock("out"),), "read", True, {"ts": 2}),
        SummaryMessage("summary", {"kind": "briefing"}),
    ]


@pytest.mark.parametrize("message", every_kind())
def test_round_trip_is_lossless(message: object) -> None:
    d = to_dict(message)  # type: ignore[arg-type]
    back = from_dict(d)
    assert back == message
    assert canonical_json(back) == canonical_json(message)  # type: ignore[arg-type]
    assert fingerprint(back) == fingerprint(message)  # type: ignore[arg-type]


def test_fingerprint_distinguishes_content_and_is_cached() -> None:
    a = UserMessage.of("one")
    b = UserMessage.of("two")
    assert fingerprint(a) != fingerprint(b)
    assert fingerprint(a) == fingerprint(UserMessage.of("one"))
    assert a._fp == fingerprint(a)


def test_messages_are_frozen() -> None:
    m = UserMessage.of("x")
    with pytest.raises(AttributeError):
        m.content = ()  # type: ignore[misc]


def test_usage_prompt_tokens_and_sum() -> None:
    u = Usage(input_tokens=10, output_tokens=3, cache_read_tokens=100, cache_write_tokens=7)
    assert u.prompt_tokens == 117
    assert (u + u).cache_read_tokens == 200


def test_unknown_role_and_block_are_typed_errors() -> None:
    with pytest.raises(UnsupportedMessageError, match="role 'system'"):
        from_dict({"role": "system", "content": []})
    with pytest.raises(UnsupportedMessageError, match="block type 'video'"):
        from_dict({"role": "user", "content": [{"type": "video"}]})
    with pytest.raises(UnsupportedMessageError, match="text"):
        from_dict({"role": "user", "content": [{"type": "text"}]})


def test_check_history_names_the_index() -> None:
    with pytest.raises(UnsupportedMessageError) as info:
        check_history([UserMessage.of("x"), {"role": "user"}], offset=10)
    assert info.value.index == 11
    assert "dict" in str(info.value)


def test_invalid_surrogates_fingerprint() -> None:
    m = ToolResultMessage.of("c", "bad \udcff bytes")
    assert len(fingerprint(m)) == 32
