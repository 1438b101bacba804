from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from agentctx.boundaries import (
    EMPTY_TEXT,
    LEADING_TEXT,
    MISSING_RESULT_TEXT,
    CompleteTurns,
    answered_call_ids,
    in_flight_start,
    latest_user_index,
    needs_no_repair,
    newest_complete_turn,
    repair,
    repaired_message,
    safe_cut,
    task_index,
    turn_starts,
    validate,
)
from agentctx.messages import (
    AssistantMessage,
    Message,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    text_of,
)

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
    # An answer, then more calls with no user message between: still the turn's answer.
    h += [assistant(text="b is done"), assistant(call("c")), result("c")]
    assert newest_complete_turn(h) == (4, 8)
    turns = CompleteTurns()
    turns.update(h)
    assert turns.newest == (4, 8)


_KINDS = {
    "user": lambda: user("q"),
    "answer": lambda: assistant(text="a"),
    "call": lambda: assistant(call("c")),
    "result": lambda: result("c"),
    "summary": lambda: SummaryMessage("s"),
    "developer": lambda: UserMessage((TextBlock("be concise"),), {"role": "developer"}),
}


@given(st.lists(st.lists(st.sampled_from(sorted(_KINDS)), max_size=6), max_size=8))
def test_the_tracked_complete_turn_is_the_scanned_one_after_every_append(
    appends: list[list[str]],
) -> None:
    # The manager keeps the newest complete turn in O(new messages) a call; a decision reads it
    # from there, so it must always say what a scan of the whole history says.
    history: list[Message] = []
    turns = CompleteTurns()
    for kinds in appends:
        history += [_KINDS[k]() for k in kinds]
        turns.update(history)
        assert turns.newest == newest_complete_turn(history)
        assert turns.latest_user == latest_user_index(history)


@given(
    st.lists(
        st.tuples(st.booleans(), st.lists(st.sampled_from(sorted(_KINDS)), max_size=6)),
        max_size=8,
    ),
    st.data(),
)
def test_the_views_complete_turn_is_the_scanned_one_after_appends_and_rewinds(
    steps: list[tuple[bool, list[str]]], data: st.DataObject
) -> None:
    # The view reads the newest complete turn only when a strategy asks (a decision), from
    # every message appended since it last did; a rewind keeps what it read before the cut
    # when the messages cut changed none of it (`CompleteTurns.cut`), else starts it over.
    from agentctx.ledger import shown_positions
    from agentctx.tokens import MessageCounter
    from agentctx.view import ViewState

    state = ViewState(MessageCounter())
    for rewind, kinds in steps:
        if rewind and state.raw:
            state.truncate(data.draw(st.integers(0, len(state.raw) - 1)))
        if data.draw(st.booleans()):  # read (or not) before what comes next
            assert state.complete_turn() == newest_complete_turn(state.raw)
            assert state.latest_user() == latest_user_index(state.raw)
        state.append([_KINDS[k]() for k in kinds])
        if data.draw(st.booleans()):
            assert state.complete_turn() == newest_complete_turn(state.raw)
            assert state.shown_positions() == shown_positions(state.raw)
    assert state.complete_turn() == newest_complete_turn(state.raw)
    assert state.latest_user() == latest_user_index(state.raw)


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
    assert out[-1] == UserMessage.of(EMPTY_TEXT)  # a turn stays a turn


def test_validate_reports_anthropic_first_message_rule() -> None:
    h = [assistant(text="hi"), user("x")]
    assert any("first message" in p for p in validate(h, "anthropic"))
    assert validate(h, "openai") == []
    assert validate([SummaryMessage("s"), assistant(text="x")]) == []
    assert validate([]) == ["empty message list"]


def test_blank_text_is_left_out_and_an_empty_message_holds_a_placeholder() -> None:
    blank_call = AssistantMessage((TextBlock(" \n"), ToolCall("a", "read", {})), "tool_use")
    h = [user("task"), blank_call, result("a"), UserMessage.of("\n\t"), assistant(text="ok")]
    assert any("non-whitespace" in p for p in validate(h, "anthropic"))
    out, origins, repairs = repair(h)
    assert validate(out) == [] and validate(out, "openai") == []
    assert out[1] == AssistantMessage((ToolCall("a", "read", {}),), "tool_use")
    assert out[3] == UserMessage.of(EMPTY_TEXT) == repaired_message(h[3])
    assert origins == [0, 1, 2, 3, 4]
    assert [(r.kind, r.index) for r in repairs] == [("empty_text", 1), ("empty_message", 3)]
    blank_summary = [user("task"), SummaryMessage("  "), assistant(text="ok")]
    out, _, repairs = repair(blank_summary)
    assert out == [blank_summary[0], blank_summary[2]]
    assert [r.kind for r in repairs] == ["empty_summary"]


def test_blank_blocks_beside_others_are_left_out_of_a_tool_result() -> None:
    """Anthropic rejects a blank text block in a tool result's list; a lone blank block is
    a tool's empty output, which its adapter sends as an empty string, and stays."""
    beside = ToolResultMessage("a", (TextBlock("out"), TextBlock(" \n"), TextBlock("")), "read")
    alone = ToolResultMessage("b", (TextBlock(""),), "read")
    h = [user("task"), assistant(call("a"), call("b")), beside, alone, assistant(text="ok")]
    assert any("tool result" in p for p in validate(h, "anthropic"))
    assert validate(h, "openai") == []
    out, origins, repairs = repair(h)
    assert validate(out) == [] and origins == [0, 1, 2, 3, 4]
    assert out[2] == ToolResultMessage("a", (TextBlock("out"),), "read")
    assert out[3] is alone
    assert [(r.kind, r.index) for r in repairs] == [("empty_text", 2)]
    assert answered_call_ids(h[1:4], set()) is None
    assert answered_call_ids([h[1], out[2], alone], set()) == ["a", "b"]


def test_duplicate_call_ids_are_renamed_with_their_results() -> None:
    h = [
        user("task"),
        assistant(call("call_0")),
        result("call_0", "first"),
        user("again"),
        assistant(call("call_0"), call("call_0")),  # on a later turn, and twice in a batch
        result("call_0", "second"),
        result("call_0", "third"),
        result("call_0", "one too many"),
    ]
    assert any("tool_use ids must be unique" in p for p in validate(h, "anthropic"))
    assert any("Duplicate value for 'tool_call_id'" in p for p in validate(h, "openai"))
    out, _, repairs = repair(h)
    assert validate(out) == [] and validate(out, "openai") == []
    renamed = out[4]
    assert isinstance(renamed, AssistantMessage)
    assert [c.id for c in renamed.tool_calls] == ["call_0-2", "call_0-3"]
    pairs = [(m.tool_call_id, text_of(m.content)) for m in out if isinstance(m, ToolResultMessage)]
    assert pairs == [("call_0", "first"), ("call_0-2", "second"), ("call_0-3", "third")]
    assert [(r.kind, r.tool_call_id, r.new_id) for r in repairs] == [
        ("duplicate_call_id", "call_0", "call_0-2"),
        ("duplicate_call_id", "call_0", "call_0-3"),
        ("duplicate_result", "call_0", None),
    ]
    # a later raw id equal to a renamed one is renamed in turn; a missing result's stub
    # carries the new id
    more = [*h[:7], user("x"), assistant(call("call_0-2"))]
    out, _, _ = repair(more)
    assert [c.id for c in out[-2].tool_calls] == ["call_0-2-2"]  # type: ignore[union-attr]
    assert isinstance(out[-1], ToolResultMessage) and out[-1].tool_call_id == "call_0-2-2"


def test_renamed_ids_stay_within_openai_length_limit() -> None:
    long_id = "x" * 40
    out, _, _ = repair([user("t"), assistant(call(long_id)), result(long_id)] * 2)
    ids = [m.tool_call_id for m in out if isinstance(m, ToolResultMessage)]
    assert ids == [long_id, "x" * 38 + "-2"]
    longer = "y" * 50  # already over the limit: only made unique
    out, _, _ = repair([user("t"), assistant(call(longer)), result(longer)] * 2)
    assert out[-1].tool_call_id == longer + "-2"  # type: ignore[union-attr]


def test_a_history_starting_with_an_assistant_message_gets_a_leading_summary() -> None:
    h = [result("ghost"), assistant(call("a")), result("a"), user("task")]
    out, origins, repairs = repair(h)
    assert out[0] == SummaryMessage(LEADING_TEXT) and out[1:] == h[1:]
    assert origins == [1, 1, 2, 3]
    assert [r.kind for r in repairs] == ["orphan_result", "leading_assistant"]
    assert [r.origin for r in repairs] == [0, 1]  # a left-out message is named too
    assert validate(out) == []
    # the placeholder is not a user message: the task is still the first real one
    assert task_index(out) == 3 and turn_starts(out) == [3]
    # a suffix that continues a view is not a view start
    tail, _, repairs = repair(h[1:3], continues=set())
    assert tail == h[1:3] and repairs == []


def test_repairing_a_suffix_as_a_continuation_matches_the_full_repair() -> None:
    h = [
        AssistantMessage.of("hello"),
        user("task"),
        assistant(call("call_0")),
        result("call_0"),
        user(" "),
        assistant(call("call_0"), call("call_1")),
        result("call_0"),
        result("call_1"),
        assistant(call("call_1")),
    ]
    full, full_origins, _ = repair(h)
    settled = [
        cut
        for cut in range(1, len(h))
        if not isinstance(h[cut], ToolResultMessage)
        and not (isinstance(h[cut - 1], AssistantMessage) and h[cut - 1].tool_calls)  # type: ignore[union-attr]
    ]
    assert settled == [1, 2, 4, 5, 8]
    for cut in settled:
        head, head_origins, _ = repair(h[:cut])
        ids = {c.id for m in head if isinstance(m, AssistantMessage) for c in m.tool_calls}
        tail, tail_origins, _ = repair(h[cut:], range(cut, len(h)), continues=ids)
        assert head + tail == full and head_origins + tail_origins == full_origins


_PIECES = {
    "user": lambda k: user(f"q{k}"),
    "blank user": lambda k: user(" "),
    "answer": lambda k: assistant(text="a"),
    "call a": lambda k: assistant(call("a")),
    "call a b": lambda k: assistant(call("a"), call("b")),
    "call a a": lambda k: assistant(call("a"), call("a")),
    "call old": lambda k: assistant(call("old")),
    "result a": lambda k: result("a"),
    "result b": lambda k: result("b"),
    "result old": lambda k: result("old"),
    "result a blank": lambda k: ToolResultMessage("a", (TextBlock(""),)),  # an empty output
    "result a with blank": lambda k: ToolResultMessage("a", (TextBlock("x"), TextBlock(" "))),
    "summary": lambda k: SummaryMessage("s"),
    "blank summary": lambda k: SummaryMessage(""),
}


@given(st.lists(st.sampled_from(sorted(_PIECES)), max_size=8), st.booleans())
def test_messages_said_to_need_no_repair_come_back_from_repair_as_they_are(
    pieces: list[str], old_used: bool
) -> None:
    messages = [_PIECES[p](k) for k, p in enumerate(pieces)]
    used = {"old"} if old_used else set()
    fixed, origins, repairs = repair(messages, range(len(messages)), continues=used)
    ids = answered_call_ids(messages, used)
    assert needs_no_repair(messages, used) == (ids is not None)
    if ids is not None:
        assert fixed == messages and origins == list(range(len(messages))) and repairs == []
        assert all(a is b for a, b in zip(fixed, messages, strict=True))
        # the ids a view adds to those it uses, in order
        assert ids == [
            c.id for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls
        ]


@given(st.lists(st.sampled_from(sorted(_PIECES)), max_size=8))
def test_a_view_that_opens_with_no_repair_needed_comes_back_as_it_is(pieces: list[str]) -> None:
    # What `render` skips `repair` for when the messages open the view (no ``continues``):
    # they need no repair and do not start with an assistant message.
    messages = [_PIECES[p](k) for k, p in enumerate(pieces)]
    fixed, origins, repairs = repair(messages, range(len(messages)))
    if needs_no_repair(messages, frozenset()) and not (
        messages and isinstance(messages[0], AssistantMessage)
    ):
        assert fixed == messages and origins == list(range(len(messages))) and repairs == []
        assert all(a is b for a, b in zip(fixed, messages, strict=True))


def test_the_common_appends_need_no_repair() -> None:
    step = [assistant(call("a"), call("b")), result("a"), result("b")]
    assert needs_no_repair(step, {"old"})
    assert needs_no_repair([*step, assistant(text="done"), user("next")], set())
    assert not needs_no_repair(step[:2], set())  # a batch still open gets a stub
    assert not needs_no_repair(step, {"a"})  # a reused id is renamed
    assert not needs_no_repair([result("a")], set())  # answers nothing new: dropped
    assert answered_call_ids(step, {"old"}) == ["a", "b"]
    twice = [assistant(call("a"), call("a")), result("a"), result("a")]
    assert answered_call_ids(twice, set()) is None  # a repeated id is renamed


def test_a_system_or_developer_message_is_neither_the_task_nor_the_latest_user_message() -> None:
    """Found by hostile testing: a harness's developer reminder after the user's question
    (an OpenAI Chat or Responses message the adapters carry as a `UserMessage` with its
    role) was taken for the latest user message, and the question was summarized away."""
    reminder = UserMessage((TextBlock("reminder: be concise"),), {"role": "developer"})
    rules = UserMessage((TextBlock("rules"),), {"role": "system"})
    h = [rules, user("task"), assistant(call("a")), result("a"), user("question"), reminder]
    assert task_index(h) == 1 and latest_user_index(h) == 4
    assert task_index([rules, reminder]) == 0 and latest_user_index([rules, reminder]) == 1


def test_a_system_or_developer_message_starts_no_turn() -> None:
    # Found by a hostile run: the latest user message skipped such an instruction while the
    # newest complete turn began at it, so the tiers dropped it mid-turn as a step and, once
    # the turn was answered, it was the turn's question, gone from every view.
    developer = _KINDS["developer"]
    h = [user("task"), assistant(call("a")), result("a"), developer(), assistant(call("b"))]
    h += [result("b"), assistant(text="done")]
    assert newest_complete_turn(h) == (0, 7)
    assert latest_user_index(h) == 0
    # With no user message before it, it is the turn's question, as it is the latest user.
    only = [developer(), assistant(text="a"), developer(), assistant(text="b")]
    assert newest_complete_turn(only) == (2, 4)
    for history in (h, only):
        turns = CompleteTurns()
        turns.update(history)
        assert turns.newest == newest_complete_turn(history)


def test_a_loop_steered_by_an_instruction_starts_where_it_starts_once_it_goes_on() -> None:
    # Found by a hostile run: a system message right after results made the loop start
    # after the instruction before it, so the tiers dropped the running loop's signed
    # reasoning; one call later the history went on, the loop started after the task
    # again, and that reasoning was missing from every view.
    developer = _KINDS["developer"]
    thinking = AssistantMessage((ThinkingBlock("plan", "sig"), call("a")), "tool_use")
    h = [user("task"), thinking, result("a"), developer(), assistant(call("b")), result("b")]
    h.append(developer())
    assert in_flight_start(h) == 1  # the reasoning at 1 is the running loop's
    h += [assistant(call("c")), result("c")]
    assert in_flight_start(h) == 1
