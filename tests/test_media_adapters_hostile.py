"""Images through the adapters, found by a hostile run: a LangChain message whose text was cut
sends its images back as they came (their ``detail``, ``cache_control``, ``id`` and form), and
Chat Completions, whose tool messages take text only, gets no image in one."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from agentctx import (
    AssistantMessage,
    Budget,
    ContextManager,
    ImageBlock,
    MemoryRecallStore,
    Message,
    OpaqueBlock,
    TextBlock,
    ToolCall,
    ToolOutputPipeline,
    ToolResultMessage,
    UnsupportedMessageError,
    UserMessage,
)
from agentctx.adapters import from_anthropic, from_openai_chat, to_openai_chat
from agentctx.integrations.langchain import from_langchain, to_langchain
from agentctx.testing import check_view
from agentctx.testing._validate import validate_chat
from agentctx.tokens import MessageCounter, image_tokens

from .helpers import png

DATA = png(300, 300)

# Each form of an image LangChain takes, with the fields a rebuilt ``image_url`` item lost.
FORMS: dict[str, dict[str, Any]] = {
    "openai detail": {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{DATA}", "detail": "low"},
    },
    "standard with id": {"type": "image", "base64": DATA, "mime_type": "image/png", "id": "i1"},
    "older standard": {
        "type": "image",
        "source_type": "base64",
        "data": DATA,
        "mime_type": "image/png",
    },
    "anthropic cached": {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": DATA},
        "cache_control": {"type": "ephemeral"},
    },
    "by url": {"type": "image_url", "image_url": {"url": "https://e.com/a.png", "detail": "low"}},
}


def _shot_history(image: dict[str, Any], text: str) -> list[BaseMessage]:
    return [
        HumanMessage("task"),
        AIMessage("", tool_calls=[{"name": "shot", "args": {}, "id": "c1", "type": "tool_call"}]),
        ToolMessage(
            [image, {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}],
            tool_call_id="c1",
            name="shot",
        ),
    ]


def _cut(neutral: list[Message], new_text: str) -> list[Message]:
    """``neutral`` with the tool result's text replaced, as a strategy cuts it (its fields
    kept, the image left as it is)."""
    out: list[Message] = []
    for m in neutral:
        if isinstance(m, ToolResultMessage):
            content = tuple(
                dataclasses.replace(b, text=new_text) if isinstance(b, TextBlock) else b
                for b in m.content
            )
            m = dataclasses.replace(m, content=content)
        out.append(m)
    return out


@pytest.mark.parametrize("form", FORMS.values(), ids=list(FORMS))
def test_a_cut_tool_results_image_goes_back_as_it_came(form: dict[str, Any]) -> None:
    """The image item was rebuilt as a bare ``image_url``: ``detail: "low"`` lost (the
    default detail billed instead of 85 tokens), and ``cache_control``, ``id`` and the form."""
    messages = _shot_history(form, "log\n" * 50)
    neutral = from_langchain(messages)
    back = to_langchain(_cut(neutral, "[cut]"), messages)
    result = back[2]
    assert isinstance(result, ToolMessage) and result is not messages[2]
    assert result.content == [
        form,
        {"type": "text", "text": "[cut]", "cache_control": {"type": "ephemeral"}},
    ]
    assert back[:2] == messages[:2] and back[0] is messages[0]


def test_a_changed_human_messages_image_goes_back_as_it_came() -> None:
    image = FORMS["anthropic cached"]
    messages: list[BaseMessage] = [HumanMessage([{"type": "text", "text": "see this"}, image])]
    neutral = from_langchain(messages)
    (user,) = neutral
    assert isinstance(user, UserMessage)
    text = dataclasses.replace(user.content[0], text="see")
    back = to_langchain([dataclasses.replace(user, content=(text, user.content[1]))], messages)
    assert back[0].content == [{"type": "text", "text": "see"}, image]


def test_an_image_the_view_changed_or_made_is_an_image_url_item() -> None:
    messages = _shot_history(FORMS["standard with id"], "log")
    neutral = from_langchain(messages)
    result = neutral[2]
    assert isinstance(result, ToolResultMessage)
    changed = [
        dataclasses.replace(b, data="QUJD") if isinstance(b, ImageBlock) else b
        for b in result.content
    ]
    made = ImageBlock("image/png", "REVG")
    view = [*neutral[:2], dataclasses.replace(result, content=(*changed, made))]
    back = to_langchain(view, messages)[2]
    assert isinstance(back, ToolMessage)
    assert back.content[0] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,QUJD"},
    }
    assert back.content[2] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,REVG"},
    }


async def test_compacted_screenshots_keep_their_detail_through_a_session() -> None:
    """The hostile run's case: six screenshots with long logs, compacted by the pipeline."""
    image = FORMS["openai detail"]
    messages: list[BaseMessage] = [HumanMessage("task")]
    for i in range(6):
        call = {"name": "shot", "args": {"i": i}, "id": f"c{i}", "type": "tool_call"}
        messages.append(AIMessage("", tool_calls=[call]))
        text = f"log {i}\n" + "line\n" * 6000
        content: list[str | dict[Any, Any]] = [image, {"type": "text", "text": text}]
        messages.append(ToolMessage(content, tool_call_id=f"c{i}", name="shot"))
    budget = Budget(context_window=20_000, reserve_output=2_000)
    async with ContextManager(
        budget, strategy=ToolOutputPipeline(), recall=MemoryRecallStore(), on_over_budget="send"
    ) as ctx:
        neutral = from_langchain(messages)
        view = await ctx.prepare(neutral)
        assert check_view(view, neutral) == []
        out = to_langchain(view, messages)
    cut = [m for m in out if isinstance(m, ToolMessage) and all(m is not s for s in messages)]
    assert cut  # the logs were cut
    for m in cut:
        assert [item for item in m.content if item["type"] != "text"] == [image]  # type: ignore[index]


async def test_an_image_that_gave_way_leaves_its_cache_breakpoint_on_its_line() -> None:
    """Found by a hostile run (DO 5): forty screenshots in the newest step's result, the first
    carrying the caller's cache breakpoint, gave way to lines; the line standing for the first
    kept the breakpoint through `to_anthropic` but lost it through `to_langchain`."""
    cached = FORMS["anthropic cached"]
    images = [
        {**cached, "source": {**cached["source"], "data": png(1400, 1000) + "A" * (4 * k)}}
        for k in range(40)
    ]
    for k in range(1, 40):
        del images[k]["cache_control"]
    messages: list[BaseMessage] = [
        HumanMessage("task: compare"),
        AIMessage("", tool_calls=[{"name": "shots", "args": {}, "id": "c1", "type": "tool_call"}]),
        ToolMessage(images, tool_call_id="c1", name="shots"),  # type: ignore[arg-type]
    ]
    async with ContextManager(Budget(context_window=40_000, reserve_output=4_000)) as ctx:
        view = await ctx.prepare(from_langchain(messages))
        out = to_langchain(view, messages)
    first = out[-1].content[0]
    assert isinstance(first, dict) and first["type"] == "text" and "omitted" in first["text"]
    assert first["cache_control"] == {"type": "ephemeral"}
    assert not any("cache_control" in item for item in out[-1].content[1:])  # type: ignore[operator]


# ---------------------------------------------------------------------------------------
# Chat Completions: a tool message takes text only


def _screenshot_result() -> list[Message]:
    """What `from_anthropic` makes of a computer-use screenshot result."""
    return from_anthropic(
        [
            {"role": "user", "content": "task"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "c1", "name": "computer", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "c1",
                        "content": [
                            {
                                "type": "image",
                                "source": {
                                    "type": "base64",
                                    "media_type": "image/png",
                                    "data": DATA,
                                },
                            },
                            {"type": "text", "text": "ok"},
                        ],
                    }
                ],
            },
        ]
    )


def test_an_image_in_a_tool_result_is_refused_for_chat_completions() -> None:
    """It went out as ``image_url`` parts in a ``tool`` message, which the API refuses (the SDK
    types a tool message's content as a string or text parts)."""
    history = _screenshot_result()
    assert any(isinstance(b, ImageBlock) for b in history[2].content)  # type: ignore[union-attr]
    with pytest.raises(UnsupportedMessageError, match="tool message takes text only") as e:
        to_openai_chat(history)
    assert e.value.index == 2
    hand_made = [
        UserMessage.of("task"),
        AssistantMessage((ToolCall("c1", "screenshot", {}),)),
        ToolResultMessage("c1", (ImageBlock("image/png", DATA), TextBlock("ok")), "screenshot"),
    ]
    with pytest.raises(UnsupportedMessageError, match="message 2: .*text only"):
        to_openai_chat(hand_made)
    # Its text alone goes.
    text_only = dataclasses.replace(hand_made[2], content=(TextBlock("ok"),))
    sent = to_openai_chat([*hand_made[:2], text_only])
    assert validate_chat({"model": "gpt-4o", "messages": sent}) is None


def test_a_chat_tool_messages_image_part_rides_as_it_came() -> None:
    """A compatible server may take an image in a tool message: one read from Chat's format
    goes back as it came (as an assistant message's does), and still counts as an image."""
    part = {
        "type": "image_url",
        "image_url": {"url": f"data:image/png;base64,{DATA}", "detail": "low"},
    }
    params: list[dict[str, Any]] = [
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [part, {"type": "text", "text": "ok"}]},
    ]
    history = from_openai_chat(params)
    result = history[2]
    assert isinstance(result, ToolResultMessage)
    assert result.content == (OpaqueBlock("openai_chat", part), TextBlock("ok"))
    assert to_openai_chat(history) == params
    # Counted as the image it is (a 1000x1000 one here), not as its short base64 text.
    big = png(1000, 1000)
    part["image_url"] = {"url": f"data:image/png;base64,{big}"}
    opaque = ToolResultMessage("c1", (OpaqueBlock("openai_chat", part),), "shot")
    assert MessageCounter().count_full(opaque) >= image_tokens(ImageBlock("image/png", big)) > 1000


def test_the_fake_chat_server_refuses_an_image_in_a_tool_message() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "task"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{DATA}"}},
                {"type": "text", "text": "ok"},
            ],
        },
    ]
    refused = validate_chat({"model": "gpt-4o", "messages": messages})
    assert refused is not None
    assert refused.message == (
        "Invalid 'messages[2]'. Image URLs are only allowed for messages with role 'user', "
        "but this message with role 'tool' contains an image URL."
    )
    text = [{"type": "text", "text": "ok"}]
    assert (
        validate_chat(
            {"model": "gpt-4o", "messages": [*messages[:2], {**messages[2], "content": text}]}
        )
        is None
    )
    # The same image in a user message is taken.
    user = {"role": "user", "content": messages[2]["content"]}
    assert validate_chat({"model": "gpt-4o", "messages": [user]}) is None
