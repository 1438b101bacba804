from __future__ import annotations

import pytest

from agentctx import ConfigError
from agentctx.ledger import (
    DropThinking,
    Keep,
    Ledger,
    ReplaceArguments,
    ReplaceResult,
    ReplaceSpan,
    anchor,
    protected_positions,
    render,
    shown_positions,
)
from agentctx.messages import (
    AssistantMessage,
    SummaryMessage,
    TextBlock,
    ThinkingBlock,
    ToolResultMessage,
    canonical_json,
    text_of,
)

from .helpers import assistant, call, result, tool_turn, user


def history() -> list:  # type: ignore[type-arg]
    return [
        user("task"),
        assistant(call("a", path="x.py"), thinking="t1"),
        result("a", "long output"),
        assistant(text="done"),
        user("next"),
        assistant(call("b")),
        result("b", "b out"),
    ]


def full_ledger(raw: list) -> Ledger:  # type: ignore[type-arg]
    ledger = Ledger()
    ledger.add(ReplaceResult(anchor(raw, 2), (TextBlock("[cleared]"),), "test", "ctx-1"))
    ledger.add(ReplaceArguments(anchor(raw, 1), "a", {"path": "x.py", "note": "cut"}, "test"))
    ledger.add(DropThinking(anchor(raw, 1), "test"))
    ledger.add(Keep(anchor(raw, 6), "test"))
    return ledger


def test_render_applies_decisions_and_is_pure() -> None:
    raw = history()
    ledger = full_ledger(raw)
    first = render(raw, ledger)
    second = render(raw, ledger)
    assert [canonical_json(m) for m in first.messages] == [
        canonical_json(m) for m in second.messages
    ]
    a1 = first.messages[1]
    assert isinstance(a1, AssistantMessage)
    assert not any(isinstance(b, ThinkingBlock) for b in a1.content)
    assert a1.tool_calls[0].arguments == {"path": "x.py", "note": "cut"}
    r = first.messages[2]
    assert isinstance(r, ToolResultMessage) and text_of(r.content) == "[cleared]"
    assert first.messages[6] is raw[6]
    assert raw == history()  # raw untouched


def test_span_replaces_and_nests() -> None:
    raw = history()
    ledger = Ledger()
    ledger.add(ReplaceSpan(anchor(raw, 1), 3, anchor(raw, 2), (SummaryMessage("s1"),), "t"))
    view = render(raw, ledger)
    assert [type(m).__name__ for m in view.messages][:3] == [
        "UserMessage",
        "SummaryMessage",
        "AssistantMessage",
    ]
    assert view.origins[:3] == [0, 1, 3]
    outer = ReplaceSpan(anchor(raw, 1), 4, anchor(raw, 3), (SummaryMessage("s2"),), "t")
    ledger.add(outer)
    assert ledger.spans == (outer,)
    with pytest.raises(ConfigError, match="partly overlaps"):
        ledger.add(ReplaceSpan(anchor(raw, 3), 6, anchor(raw, 5), (SummaryMessage("x"),), "t"))


def test_suffix_render_matches_full_render() -> None:
    raw = history()
    ledger = full_ledger(raw)
    full = render(raw, ledger)
    tail = render(raw, ledger, 4)
    assert full.messages[4:] == tail.messages
    assert full.origins[4:] == tail.origins


def test_json_round_trip_renders_identically() -> None:
    raw = history()
    ledger = full_ledger(raw)
    ledger.add(ReplaceSpan(anchor(raw, 4), 5, anchor(raw, 4), (SummaryMessage("s"),), "t"))
    again = Ledger.from_json(ledger.to_json())
    assert again.decisions == ledger.decisions
    assert render(raw, again).messages == render(raw, ledger).messages


def test_stale_decisions_are_dropped() -> None:
    raw = history()
    ledger = full_ledger(raw)
    edited = list(raw)
    edited[2] = result("a", "different output")
    dropped = ledger.drop_stale(edited)
    assert [type(d).__name__ for d in dropped] == ["ReplaceResult"]
    assert len(ledger) == 3
    v = ledger.version
    assert [type(d).__name__ for d in ledger.drop_from(5)] == ["Keep"]
    assert ledger.version == v + 1


def test_rendering_again_gives_the_same_objects_so_their_estimates_stay() -> None:
    from agentctx.tokens import MessageCounter

    raw = [user("task"), *tool_turn(0, lines=300), *tool_turn(1, lines=300), user("go on")]
    ledger = Ledger()
    ledger.add(ReplaceResult(anchor(raw, 2), (TextBlock("[cleared 0]"),), "mask"), raw)
    first = render(raw, ledger).messages
    counter = MessageCounter()
    counter.refine(first)
    ledger.add(ReplaceResult(anchor(raw, 4), (TextBlock("[cleared 1]"),), "mask"), raw)
    second = render(raw, ledger).messages
    assert second[2] is first[2]  # decided before: the same object, its estimate kept
    assert second[4] is not first[4] and counter.refine(second) == 1  # only the new one
    # the same decisions on another message at that index (a rewind): rendered anew
    other = [*raw[:2], result("c0_0", "other output"), *raw[3:]]
    again = render(other, ledger).messages
    assert again[2] is not first[2] and again[2] == first[2]
    # decisions dropped: the raw message again
    ledger.drop_from(4)
    assert render(raw, ledger).messages[4] is raw[4]


def test_a_preview_is_the_object_the_view_shows_once_the_decision_is_taken() -> None:
    raw = [user("task"), *tool_turn(0, lines=30), *tool_turn(1, lines=30), user("go on")]
    ledger = Ledger()
    cleared = ReplaceResult(anchor(raw, 2), (TextBlock("[cleared 0]"),), "mask")
    preview = ledger.preview(cleared, raw)
    assert text_of(preview.content) == "[cleared 0]" and ledger.preview(cleared, raw) is preview
    assert render(raw, ledger).messages[2] is raw[2] and len(ledger) == 0  # nothing taken
    ledger.add(cleared, raw)
    assert render(raw, ledger).messages[2] is preview
    # another decision than the one previewed: rendered anew
    other = ReplaceResult(anchor(raw, 4), (TextBlock("[other]"),), "mask")
    ledger.preview(ReplaceResult(anchor(raw, 4), (TextBlock("[cleared 1]"),), "mask"), raw)
    ledger.add(other, raw)
    assert text_of(render(raw, ledger).messages[4].content) == "[other]"


def test_end_is_past_the_last_message_a_decision_touches() -> None:
    raw = history()
    ledger = Ledger()
    assert ledger.end == 0
    ledger.add(ReplaceResult(anchor(raw, 2), (TextBlock("[cleared]"),), "test"))
    assert ledger.end == 3
    ledger.add(ReplaceSpan(anchor(raw, 3), 5, anchor(raw, 4), (SummaryMessage("s"),), "t"))
    assert ledger.end == 5
    ledger.drop_from(4)
    assert ledger.end == 3


def test_a_clean_append_grows_the_view_without_a_render(monkeypatch: pytest.MonkeyPatch) -> None:
    """The common append (`ViewState._append_as_is`) gives what a render of it would."""
    import agentctx.view as view_module
    from agentctx.tokens import MessageCounter

    counter = MessageCounter()
    state = view_module.ViewState(counter)
    state.append([user("task"), *tool_turn(0, lines=50)])
    state.ledger.add(ReplaceResult(anchor(state.raw, 2), (TextBlock("[cleared]"),), "t"))
    state.rebuild()
    rendered: list[int] = []
    real_render = view_module.render
    monkeypatch.setattr(
        view_module, "render", lambda *a, **k: rendered.append(1) or real_render(*a, **k)
    )
    state.append([*tool_turn(1, lines=50), assistant(text="done"), user("next")])
    assert rendered == []
    assert state.view == render(state.raw, state.ledger).messages
    assert state.origins == render(state.raw, state.ledger).origins
    assert abs(state.tokens - counter.count_many(state.view)) <= len(state.view)  # rounding
    state.append([assistant(call("c0_0"))])  # a reused id, a batch left open: rendered
    assert rendered == [1]
    assert state.view == render(state.raw, state.ledger).messages


def _state_after(raw: list, decisions: list) -> object:  # type: ignore[type-arg]
    """A settled view of ``raw``, then ``decisions`` taken and the view read once."""
    import agentctx.view as view_module
    from agentctx.tokens import MessageCounter

    state = view_module.ViewState(MessageCounter())
    state.append(raw)
    for d in decisions:
        state.ledger.add(d, state.raw)
    state.refresh()
    return state


def _rendered_anew(state: object) -> tuple[list, list, list]:  # type: ignore[type-arg]
    full = render(state.raw, state.ledger)  # type: ignore[attr-defined]
    return full.messages, full.origins, full.repairs


async def test_reading_the_view_after_each_take_renders_only_the_batch_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Found with docs/custom-strategy.md's own example (take, read ``ctx.view``, count,
    result after result): each read rendered the view again from the result taken, so
    clearing 4,000 old results of an 8,000-message session took 27 s of one `prepare`.
    A per-message decision in the settled view is now patched into it, its tool batch alone."""
    import agentctx.view as view_module
    from agentctx import Budget, ContextManager
    from agentctx.strategy import CompactionContext, Quiet

    raw = [user("task")]
    for k in range(300):
        raw += [assistant(call(f"c{k}", "search", q=f"q{k}")), result(f"c{k}", "hit " * 200)]
    raw.append(assistant(text="done"))
    rendered: list[int] = []
    real_render = view_module.render

    def counting(*a: object, **k: object) -> object:
        out = real_render(*a, **k)  # type: ignore[arg-type]
        rendered.append(len(out.messages))
        return out

    class ClearOldest:
        async def compact(self, ctx: CompactionContext) -> Quiet | None:
            if ctx.prompt_tokens <= ctx.budget.limit:
                return Quiet(ctx.budget.limit)
            monkeypatch.setattr(view_module, "render", counting)
            for j, m in enumerate(list(ctx.view)):
                if isinstance(m, ToolResultMessage) and ctx.undecided(j) is not None:
                    at = anchor(ctx.raw, ctx.origins[j])
                    ctx.take(ReplaceResult(at, (TextBlock("[cleared]"),), "old"))
                    _ = ctx.view
                    if ctx.prompt_tokens <= ctx.budget.target_tokens:
                        break
            return None

    async with ContextManager(Budget(context_window=40_000), strategy=ClearOldest()) as ctx:
        view = await ctx.prepare(raw)
    cleared = sum(
        1 for m in view if isinstance(m, ToolResultMessage) and text_of(m.content) == "[cleared]"
    )
    assert cleared > 100
    assert sum(rendered) < 10 * cleared  # was about 600 messages a take
    assert view == render(raw, ctx._state.ledger).messages


def test_per_message_decisions_in_the_settled_view_are_patched_as_a_render_gives() -> None:
    raw = [user("task"), assistant(call("a", path="x.py"), thinking="t1"), result("a", "out")]
    raw += [*tool_turn(1, lines=5, width=2), assistant(text="done"), user("next")]
    state = _state_after(raw, [])
    before = state.tokens  # type: ignore[attr-defined]
    decisions = [
        ReplaceResult(anchor(raw, 4), (TextBlock("[cleared]"),), "t"),
        DropThinking(anchor(raw, 1), "t"),
        ReplaceArguments(anchor(raw, 1), "a", {"path": "[cut]"}, "t"),
        Keep(anchor(raw, 7), "t"),
    ]
    for d in decisions:
        state.ledger.add(d, raw)  # type: ignore[attr-defined]
    assert state._patch(decisions) is True  # type: ignore[attr-defined]
    state._rendered = (state.ledger.version, len(state.ledger))  # type: ignore[attr-defined]
    messages, origins, repairs = _rendered_anew(state)
    assert state.view == messages and state.origins == origins and not repairs  # type: ignore[attr-defined]
    assert state.shown == [0, 2, 3, 5, 6, 7]  # type: ignore[attr-defined]
    assert state.tokens < before  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "case",
    ["result in the unsettled batch", "blank beside other blocks", "inside a span", "stub added"],
)
def test_a_decision_the_patch_cannot_take_renders_as_before(case: str) -> None:
    """Where the in-place patch does not apply, `refresh` renders from the decision, and the
    view is what rendering it all gives, with its sums and shown messages."""
    raw = [user("task"), *tool_turn(0, lines=5), *tool_turn(1, lines=5)]
    if case == "result in the unsettled batch":
        raw += [assistant(call("open1"), call("open2")), result("open1", "x")]
        decisions = [ReplaceResult(anchor(raw, len(raw) - 1), (TextBlock("[c]"),), "t")]
    elif case == "blank beside other blocks":
        decisions = [ReplaceResult(anchor(raw, 2), (TextBlock("a"), TextBlock(" ")), "t")]
    elif case == "inside a span":
        raw += [assistant(text="ok"), user("next"), *tool_turn(2, lines=5)]
        span = ReplaceSpan(anchor(raw, 1), 3, anchor(raw, 2), (SummaryMessage("s"),), "t")
        decisions = [span, ReplaceResult(anchor(raw, 4), (TextBlock("[c]"),), "t")]
    else:
        raw[2:3] = []  # the first call's result missing: repair adds a stub after it
        decisions = [ReplaceArguments(anchor(raw, 1), "c0_0", {"path": "[cut]"}, "t")]
    state = _state_after(raw, [])
    for d in decisions:
        state.ledger.add(d, state.raw)  # type: ignore[attr-defined]
    assert state._patch(state.ledger.decisions) is False  # type: ignore[attr-defined]
    state.refresh()  # type: ignore[attr-defined]
    messages, origins, _ = _rendered_anew(state)
    assert state.view == messages and state.origins == origins  # type: ignore[attr-defined]


def test_a_restored_ledger_renders_arguments_every_wire_format_can_write() -> None:
    """Found by the hostile-history generator (a second worker resuming from SQLite): a
    ledger read back gave cut-down arguments as a read-only mapping, which the OpenAI
    adapters' JSON could not write (a TypeError converting the view)."""
    import json

    from agentctx.adapters import to_anthropic, to_openai_chat, to_openai_responses

    raw = [user("task"), assistant(call("a", path="x.py", content="y" * 500)), result("a")]
    ledger = Ledger()
    ledger.add(ReplaceArguments(anchor(raw, 1), "a", {"path": "x.py", "content": "[cut]"}, "t"))
    restored = Ledger.from_json(ledger.to_json())
    for kept in (ledger, restored):
        view = render(raw, kept).messages
        assert view[1].tool_calls[0].arguments == {"path": "x.py", "content": "[cut]"}
        json.dumps(to_anthropic(view))
        chat = to_openai_chat(view)
        assert json.loads(chat[1]["tool_calls"][0]["function"]["arguments"])["content"] == "[cut]"
        json.dumps(to_openai_responses(view))


def test_arguments_in_a_read_only_mapping_convert_to_every_wire_format() -> None:
    import json
    from types import MappingProxyType

    from agentctx.adapters import to_anthropic, to_openai_chat, to_openai_responses
    from agentctx.messages import AssistantMessage, ToolCall

    frozen = ToolCall("a", "read", MappingProxyType({"path": "x.py", "lines": [1, 2]}))
    view = [user("task"), AssistantMessage((frozen,), "tool_use"), result("a")]
    assert json.loads(json.dumps(to_anthropic(view)))[1]["content"][0]["input"]["path"] == "x.py"
    chat = to_openai_chat(view)
    assert json.loads(chat[1]["tool_calls"][0]["function"]["arguments"])["lines"] == [1, 2]
    json.dumps(to_openai_responses(view))


def test_every_view_shows_the_ends_of_the_newest_turn_and_what_the_running_loop_signed() -> None:
    """`shown_positions`: the invariants' messages; `protected_positions` adds the rest of
    the newest complete turn (a rewind restores it whole)."""
    history = [user("the task"), user("question 1"), *tool_turn(0), assistant(text="answer 1")]
    history += [user("question 2"), assistant(call("c1"), thinking="plan"), result("c1", "out")]
    # the task 0; the newest complete turn 1-4 (question 1, its step 2-3, answer 1); the
    # latest user message 5, then the running loop: 6 carries signed reasoning, 7 does not
    assert shown_positions(history) == {0, 1, 4, 5, 6}
    assert protected_positions(history) == {0, 1, 2, 3, 4, 5, 6}
