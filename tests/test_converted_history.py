"""`ConvertedHistory`: a wrapped client's history converted one request at a time gives the
messages converting it whole gives, whatever the caller does between requests (appends,
edits in place, equal copies, rewinds, a bad item), and converts only what changed."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentctx.adapters import (
    from_anthropic,
    from_openai_chat,
    from_openai_responses,
    to_anthropic,
    to_openai_chat,
    to_openai_responses,
)
from agentctx.errors import UnsupportedMessageError
from agentctx.messages import AssistantMessage, Message, TextBlock, ThinkingBlock, UserMessage
from agentctx.providers import _history
from agentctx.providers._history import ConvertedHistory
from agentctx.testing import synthetic_session

from .helpers import assistant, call, result, user

PROVIDERS = ("anthropic", "openai-chat", "openai-responses")
WHOLE = {
    "anthropic": from_anthropic,
    "openai-chat": from_openai_chat,
    "openai-responses": from_openai_responses,
}
RENDER = {
    "anthropic": to_anthropic,
    "openai-chat": to_openai_chat,
    "openai-responses": to_openai_responses,
}


def session() -> list[Message]:
    """A synthetic loop with parallel batches, texts beside calls, a result answering no
    call and reasoning before calls (Responses: items of one assistant message)."""
    history: list[Message] = [m for group in synthetic_session(3, calls=12) for m in group]
    history += [
        assistant(call("p1"), call("p2"), text="reading both"),
        result("p1", "first"),
        result("p2", "second"),
        result("ghost", "answers no call"),
        user("and now?"),
        AssistantMessage((ThinkingBlock("think first"), call("p3")), "tool_use"),
        result("p3", "third"),
        assistant(text="done"),
    ]
    return history


def as_dicts(provider: str) -> list[Any]:
    history = session()
    if provider == "openai-chat":  # it carries no signed reasoning
        history = [
            AssistantMessage(
                tuple(b for b in m.content if not (isinstance(b, ThinkingBlock) and b.signature)),
                m.stop_reason,
            )
            if isinstance(m, AssistantMessage)
            else m
            for m in history
        ]
    dicts = RENDER[provider](history)
    if provider == "anthropic":
        # A batch's results in two user messages, as a loop that appends each may send them.
        at = next(i for i, d in enumerate(dicts) if _results(d) >= 2)
        first, *rest = dicts[at]["content"]
        dicts[at : at + 1] = [
            {"role": "user", "content": [first]},
            {"role": "user", "content": rest},
        ]
    return dicts


def _results(d: Any) -> int:
    content = d.get("content")
    return sum(b.get("type") == "tool_result" for b in content) if isinstance(content, list) else 0


def late_result(provider: str, call_id: str) -> dict[str, Any]:
    """A result for ``call_id`` with no call before it (one a rewind may have removed)."""
    if provider == "anthropic":
        block = {"type": "tool_result", "tool_use_id": call_id, "content": "late"}
        return {"role": "user", "content": [block]}
    if provider == "openai-chat":
        return {"role": "tool", "tool_call_id": call_id, "content": "late"}
    return {"type": "function_call_output", "call_id": call_id, "output": "late"}


def edit(item: Any, r: int) -> None:
    """Change ``item`` (a provider dict) in place, as a loop might: text, a key added."""
    if r % 3 == 0:
        item["cache_control"] = {"type": "ephemeral"}
        return
    for key in ("content", "output", "arguments", "tool_calls"):
        value = item.get(key)
        if isinstance(value, str):
            item[key] = value + " (edited)"
            return
        if isinstance(value, list) and value and isinstance(value[0], dict):
            inner = value[-1].get("input", value[-1].get("function"))
            (inner if isinstance(inner, dict) else value[-1])["extra_key"] = r
            return
    item["note"] = r


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["grow", "edit", "edit unsent", "copy", "rewind", "late", "save", "restore", "same"]
        ),
        st.integers(0, 999),
    ),
    max_size=14,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_converting_request_by_request_gives_what_converting_whole_gives(
    provider: str, ops: list[tuple[str, int]]
) -> None:
    full = as_dicts(provider)
    ids = [
        c.id for m in WHOLE[provider](full) if isinstance(m, AssistantMessage) for c in m.tool_calls
    ]
    converted = ConvertedHistory(provider)
    history = copy.deepcopy(full[:2])
    saved = copy.deepcopy(history)
    for op, r in ops:
        if op == "grow":
            history += copy.deepcopy(full[len(history) : len(history) + 1 + r % 5])
        elif op in ("edit", "edit unsent"):
            edit(history[r % len(history)], r)
            if op == "edit unsent":
                continue  # the next op's call sees it, or undoes it first
        elif op == "copy":
            i = r % len(history)
            history[i] = copy.deepcopy(history[i])
        elif op == "rewind":
            del history[max(1, r % len(history)) :]
        elif op == "late":
            history.append(late_result(provider, ids[r % len(ids)]))
        elif op == "save":
            saved = copy.deepcopy(history)
        elif op == "restore":  # after edits in place: equal to what was converted before
            history = copy.deepcopy(saved)
        got = converted.convert(list(history))
        want = WHOLE[provider](copy.deepcopy(history))
        assert got == want
        assert [m.extra for m in got] == [m.extra for m in want]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_an_append_converts_only_what_is_new(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = as_dicts(provider)
    converted = ConvertedHistory(provider)
    first = converted.convert(full[:-6])
    seen: list[int] = []
    real = {name: getattr(_history, name) for name in ("from_anthropic", "from_openai_chat")}
    real["from_openai_responses"] = _history.from_openai_responses

    def counting(name: str) -> Any:
        def convert(items: list[Any], **kwargs: Any) -> list[Message]:
            seen.append(len(items))
            return real[name](items, **kwargs)  # type: ignore[no-any-return]

        return convert

    for name in real:
        monkeypatch.setattr(_history, name, counting(name))
    again = converted.convert(full)
    assert sum(seen) <= 6 + 3  # the new items, and an assistant run they may join
    assert all(a is b for a, b in zip(first[:-3], again, strict=False))
    assert again == WHOLE[provider](full)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_bad_item_is_the_adapters_error_and_changes_nothing(provider: str) -> None:
    full = as_dicts(provider)
    converted = ConvertedHistory(provider)
    before = list(converted.convert(full[:5]))
    with pytest.raises(UnsupportedMessageError) as raised:
        converted.convert([*full[:5], {"role": "function", "content": "x"}])
    assert raised.value.index == 5
    assert converted.convert(full[:5]) == before
    assert converted.convert(full) == WHOLE[provider](full)


def test_an_item_that_cannot_be_copied_is_converted_again_every_time() -> None:
    class Uncopyable(dict):  # type: ignore[type-arg]
        def __deepcopy__(self, memo: object) -> Any:
            raise TypeError("no copies")

    converted = ConvertedHistory("anthropic")
    item = Uncopyable(role="user", content="the task")
    assert converted.convert([item]) == [UserMessage((TextBlock("the task"),))]
    item["content"] = "changed in place"
    assert converted.convert([item]) == [UserMessage((TextBlock("changed in place"),))]


def test_the_messages_of_one_call_are_not_changed_by_the_next() -> None:
    """Calls of one wrapped client overlap (a strategy awaits): each sends its own history."""
    full = as_dicts("anthropic")
    converted = ConvertedHistory("anthropic")
    first = converted.convert(full[:9])
    kept = list(first)
    converted.convert([{"role": "user", "content": "another task"}])
    assert first == kept


def test_a_change_in_place_that_is_undone_sends_what_the_history_holds() -> None:
    """The messages once held the caller's own argument dicts: edited in place, then
    restored from a copy (equal to what was converted), the edit was still sent."""
    history = [
        {"role": "user", "content": "the task"},
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "rm", "input": {"path": "/tmp/x"}}
            ],
        },
    ]
    converted = ConvertedHistory("anthropic")
    saved = copy.deepcopy(history)
    converted.convert(history)
    history[1]["content"][0]["input"]["path"] = "/"  # no call between the edit and the undo
    assert converted.convert(saved) == from_anthropic(copy.deepcopy(saved))
    assert converted.convert(history) == from_anthropic(copy.deepcopy(history))


def test_an_item_whose_comparison_raises_counts_as_changed() -> None:
    class Ambiguous:
        def __eq__(self, other: object) -> bool:
            raise ValueError("the truth value of an array is ambiguous")

        __hash__ = object.__hash__

    item = {"role": "user", "content": [{"type": "text", "text": "t", "odd": Ambiguous()}]}
    converted = ConvertedHistory("anthropic")
    first = converted.convert([item])
    again = converted.convert([item])  # converted again, no error
    assert len(again) == len(first) == 1 and again[0] is not first[0]


def test_a_change_equality_does_not_see_is_not_converted_again() -> None:
    """Documented: items are compared with ``==`` (1 == True == 1.0, keys in any order)."""
    item: dict[str, Any] = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"flag": 1}}],
    }
    converted = ConvertedHistory("anthropic")
    before = converted.convert([{"role": "user", "content": "task"}, item])
    item["content"][0]["input"]["flag"] = True
    after = converted.convert([{"role": "user", "content": "task"}, item])
    assert after == before and after[1].content[0].arguments == {"flag": 1}  # type: ignore[union-attr]


def test_a_history_ending_in_assistant_items_is_not_converted_again_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Responses: a run of assistant-side items at the end is converted again only when an
    item joins it or it changes, not on a call that brings nothing new."""
    items: list[Any] = [
        {"role": "user", "content": "the task"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
    ]
    converted = ConvertedHistory("openai-responses")
    first = converted.convert(items)
    seen: list[int] = []
    real = _history.from_openai_responses

    def counting(part: list[Any], **kwargs: Any) -> list[Message]:
        seen.append(len(part))
        return real(part, **kwargs)

    monkeypatch.setattr(_history, "from_openai_responses", counting)
    assert converted.convert(list(items)) == first and seen == []
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    assert converted.convert([*items, output]) == from_openai_responses([*items, output])
    assert seen == [2, 1]  # the run again (an item may have joined it), then the output


_SHOT = {"type": "computer_screenshot", "image_url": "data:image/png;base64,iVBORw0KGgo="}
_REFERENCED = [
    {"role": "user", "content": "go"},
    {"type": "item_reference", "id": "resp_item_1"},
    {"type": "function_call", "call_id": "call_B", "name": "f", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_B", "output": "ok"},
    {"type": "computer_call_output", "call_id": "call_A", "output": _SHOT},
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "next"}]},
]


@pytest.mark.parametrize("steps", [[6], [2, 4, 6], [1, 2, 3, 4, 5, 6]])
def test_an_output_a_reference_may_stand_for_is_refused_when_converted_in_parts(
    steps: list[int],
) -> None:
    """Converted a part at a time, as the wrapped client does, each part forgot the reference
    before it: the output was left out as an orphan, unsaid (found by a hostile run). A
    refused request leaves the history as the last one did, and the next one reads as the
    whole would."""
    history = ConvertedHistory("openai-responses")
    for n in steps:
        if n < 5:
            history.convert(_REFERENCED[:n])
            continue
        with pytest.raises(UnsupportedMessageError, match="item_reference") as refused:
            history.convert(_REFERENCED[:n])
        assert refused.value.index == 4
    fine = [*_REFERENCED[:4], _REFERENCED[5]]
    assert history.convert(fine) == from_openai_responses(fine)
