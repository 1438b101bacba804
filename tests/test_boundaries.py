from __future__ import annotations

from agentctx.boundaries import (
    MISSING_RESULT_TEXT,
    in_flight_start,
    newest_complete_turn,
    repair,
    safe_cut,
    turn_starts,
    validate,
)
from agentctx.messages import SummaryMessage, ToolResultMessage, text_of

from .helpers import assistant, call, result, user


def test_turns_and_in_flight_loop() -> None:
    h = [
        user("task"),
        assistant(call("a")),
        result("a"),
        assistant(text="done"),
        user("more"),
        assistant(call("b")),
        result("b"),
    ]
    assert turn_starts(h) == [0, 4]
    assert in_flight_start(h) == 5
    assert newest_complete_turn(h) == (0, 4)


def test_safe_cut_never_splits_a_parallel_batch() -> None:
    h = [
        user("task"),
        assistant(call("a"), call("b"), call("c")),
        result("a"),
        result("b"),
        result("c"),
        assistant(text="ok"),
    ]
    for i in range(len(h) + 1):
        j = safe_cut(h, i)
        assert j <= i
        assert not validate(h[:j] or [user("x")]) or j == 0
        assert j == len(h) or not isinstance(h[j], ToolResultMessage)
    assert safe_cut(h, 4) == 1


def test_valid_history_is_untouched() -> None:
    h = [user("task"), assistant(call("a")), result("a"), assistant(text="done")]
    out, origins, repairs = repair(h)
    assert out == h and origins == [0, 1, 2, 3] and repairs == []
    assert all(x is y for x, y in zip(out, h, strict=True))


def test_missing_results_get_stubs_and_orphans_are_dropped() -> None:
    h = [
        user("task"),
        assistant(call("a"), call("b")),
        result("a"),
        user("stop"),
        result("zzz"),
        assistant(text="ok"),
    ]
    assert validate(h)
    out, origins, repairs = repair(h)
    assert validate(out) == [] and validate(out, "openai") == []
    stub = out[3]
    assert isinstance(stub, ToolResultMessage) and stub.tool_call_id == "b" and stub.is_error
    assert text_of(stub.content) == MISSING_RESULT_TEXT
    assert origins[3] == 1
    assert [r.kind for r in repairs] == ["missing_result", "orphan_result"]


def test_duplicate_result_and_empty_text_are_repaired() -> None:
    h = [user("task"), assistant(call("a"), text=""), result("a"), result("a"), user("")]
    out, _, repairs = repair(h)
    assert [r.kind for r in repairs] == ["duplicate_result", "empty_message"]
    assert validate(out) == []


def test_validate_reports_anthropic_first_message_rule() -> None:
    h = [assistant(text="hi"), user("x")]
    assert any("first message" in p for p in validate(h, "anthropic"))
    assert validate(h, "openai") == []
    assert validate([SummaryMessage("s"), assistant(text="x")]) == []
    assert validate([]) == ["empty message list"]
