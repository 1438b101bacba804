"""Anthropic ``cache_control`` breakpoints placed by the wrapper: where they pay, never more
than the API allows, checked against a fake server that caches only at breakpoints."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from agentctx import Budget, ContextManager, MemoryRecallStore
from agentctx.errors import ConfigError
from agentctx.providers import anthropic as ant_provider
from agentctx.providers._convert import (
    MAX_BREAKPOINTS,
    Compactor,
    place_breakpoints,
    within_marks,
)
from agentctx.testing.servers import FakeAnthropic, Reply
from tests.test_wrappers import (
    MODEL,
    SYSTEM,
    TOOLS,
    anthropic_loop,
    assert_all_ok,
    compactions,
    script,
)

EPHEMERAL = {"type": "ephemeral"}


def marks(messages: list[Any]) -> list[int]:
    """Indices of the messages holding a breakpoint."""
    return [
        i
        for i, m in enumerate(messages)
        if isinstance(m["content"], list) and any("cache_control" in b for b in m["content"])
    ]


def test_place_breakpoints_order_room_and_eligible_blocks() -> None:
    messages: list[Any] = [
        {"role": "user", "content": "the task"},
        {"role": "assistant", "content": [{"type": "text", "text": "ok"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "text", "text": "answer"},
                {"type": "redacted_thinking", "data": "x"},
            ],
        },
    ]
    assert place_breakpoints(messages, 0) is messages
    one = place_breakpoints(messages, 1)
    assert marks(one) == [2]
    # the last block is redacted thinking, so the breakpoint goes on the text before it
    assert one[2]["content"][1]["cache_control"] == EPHEMERAL
    assert "cache_control" not in one[2]["content"][2]
    assert one[0] is messages[0] and one[1] is messages[1]  # untouched messages are shared
    assert messages[2]["content"][1] == {"type": "text", "text": "answer"}  # input not mutated
    two = place_breakpoints(messages, 2)
    assert marks(two) == [0, 2]
    assert two[0]["content"] == [{"type": "text", "text": "the task", "cache_control": EPHEMERAL}]
    # the previous request's end gets one only when the new turn outgrew the cache's lookback
    assert marks(place_breakpoints(messages, 3, previous_end=1)) == [0, 2]
    wide = [
        *messages[:2],
        {"role": "user", "content": [{"type": "text", "text": f"r{i}"} for i in range(25)]},
    ]
    assert marks(place_breakpoints(wide, 3, previous_end=1)) == [0, 1, 2]
    assert marks(place_breakpoints(wide, 2, previous_end=1)) == [1, 2]


def test_only_thinking_or_empty_text_gets_no_breakpoint() -> None:
    messages: list[Any] = [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": "s"}]},
    ]
    assert place_breakpoints(messages, 4) == messages


def test_cache_breakpoints_are_anthropic_only() -> None:
    with pytest.raises(ConfigError):
        Compactor(ContextManager(10_000), "openai-chat", cache_breakpoints=True)


async def run_loop(breakpoints: bool, turns: int = 10, **params: Any) -> tuple[FakeAnthropic, int]:
    manager = ContextManager(
        Budget(context_window=9_000, reserve_output=1_000), recall=MemoryRecallStore()
    )
    seen = compactions(manager)
    async with FakeAnthropic(script(turns), caching="breakpoints") as srv:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with ant_provider.wrap(raw, manager, cache_breakpoints=breakpoints) as client:
            await anthropic_loop(client, turns, model=MODEL, max_tokens=512, **params)
    await manager.aclose()
    assert_all_ok(srv.requests)
    return srv, len(seen)


async def test_breakpoints_turn_on_caching_and_survive_compaction() -> None:
    plain, _ = await run_loop(False, system=SYSTEM, tools=TOOLS)
    assert sum(r.usage.cache_read for r in plain.requests if r.usage) == 0

    srv, compacted = await run_loop(True, system=SYSTEM, tools=TOOLS)
    assert compacted > 0
    usage = [r.usage for r in srv.requests if r.usage]
    reads = [u.cache_read for u in usage]
    # every request after the first reads a cached prefix, including the ones right after a
    # compaction rewrote the middle of the view (the head breakpoint keeps tools+system+task)
    assert reads[0] == 0 and all(r > 0 for r in reads[1:]), reads
    assert sum(reads) > 0.5 * sum(u.prompt_tokens for u in usage[1:])
    for r in srv.requests:
        assert marks(r.json["messages"])[-1] == len(r.json["messages"]) - 1
        assert 0 in marks(r.json["messages"])


async def test_caller_breakpoints_are_counted_never_more_than_four() -> None:
    system = [{"type": "text", "text": SYSTEM, "cache_control": EPHEMERAL}]
    tools = [{**TOOLS[0], "cache_control": EPHEMERAL}]
    srv, _ = await run_loop(True, system=system, tools=tools)
    for r in srv.requests:
        used = sum(
            "cache_control" in b
            for m in r.json["messages"]
            if isinstance(m["content"], list)
            for b in m["content"]
        )
        # the first request is the task alone: its one message gets one breakpoint
        assert used == (1 if len(r.json["messages"]) == 1 else MAX_BREAKPOINTS - 2)
    assert marks(srv.requests[-1].json["messages"]) == [
        0,
        len(srv.requests[-1].json["messages"]) - 1,
    ]


async def test_fake_server_rejects_five_breakpoints_and_thinking_breakpoints() -> None:
    block = {"type": "text", "text": "x", "cache_control": EPHEMERAL}
    async with FakeAnthropic(caching="breakpoints") as srv:
        client = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        with pytest.raises(anthropic.BadRequestError, match="maximum of 4"):
            await client.messages.create(
                model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [block] * 5}]
            )
        thinking = {
            "type": "thinking",
            "thinking": "t",
            "signature": "s",
            "cache_control": EPHEMERAL,
        }
        with pytest.raises(anthropic.BadRequestError, match="cache_control"):
            await client.messages.create(
                model=MODEL,
                max_tokens=8,
                messages=[
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": [thinking, {"type": "text", "text": "ok"}]},
                    {"role": "user", "content": "go on"},
                ],
            )
        await client.close()


@pytest.mark.parametrize("kind", [tuple, iter], ids=["tuple", "generator"])
async def test_caller_breakpoints_in_a_tuple_or_generator_are_counted_too(kind: Any) -> None:
    # Found by the hostile run: the SDK takes any iterable for `system` and `tools`; their
    # breakpoints were counted only in lists, so two in a tuple made five (HTTP 400).
    system = [{"type": "text", "text": f"part {i}", "cache_control": EPHEMERAL} for i in range(2)]
    tools = [{**TOOLS[0], "cache_control": EPHEMERAL}]
    history = [
        {"role": "user", "content": "the task"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "go on"},
    ]
    async with (
        FakeAnthropic(script(1)) as server,
        ContextManager(Budget(context_window=200_000)) as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="t", max_retries=0) as sdk,
    ):
        client = ant_provider.wrap(sdk, ctx, cache_breakpoints=True)
        await client.messages.create(
            model=MODEL, max_tokens=100, system=kind(system), tools=kind(tools), messages=history
        )
    sent = server.requests[0].json
    assert sent["system"] == system and sent["tools"] == tools  # read once, sent whole
    assert sum("cache_control" in b for m in sent["messages"] for b in m["content"]) == 1


@pytest.mark.parametrize("where", ["a block", "a tool result's block"])
async def test_no_breakpoint_goes_before_a_callers_one_hour_breakpoint(where: str) -> None:
    # Found by the hostile run: the wrapper marked the task (a 5-minute breakpoint) before
    # the caller's 1-hour one on a later message; the API takes longer TTLs first. A later
    # run (M, finding 2) found the same with the mark on a block inside a tool result.
    hour = {"type": "ephemeral", "ttl": "1h"}
    if where == "a block":
        answer = [{"type": "text", "text": "ok", "cache_control": hour}]
    else:
        use = {"type": "tool_use", "id": "t1", "name": "read", "input": {}}
        inner = [{"type": "text", "text": "big file", "cache_control": hour}]
        result = {"type": "tool_result", "tool_use_id": "t1", "content": inner}
        answer = [use]
    tools = [{"name": "read", "input_schema": {"type": "object"}}]
    history = [
        {"role": "user", "content": "the task"},
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "go on" if where == "a block" else [result]},
    ]
    async with (
        FakeAnthropic(script(2)) as server,
        ContextManager(Budget(context_window=200_000)) as ctx,
        anthropic.AsyncAnthropic(base_url=server.url, api_key="t", max_retries=0) as sdk,
    ):
        with pytest.raises(anthropic.BadRequestError, match="ttl='1h'"):
            await sdk.messages.create(
                model=MODEL,
                max_tokens=100,
                messages=[{**history[0], "content": [marked("the task")]}, *history[1:]],
                tools=tools,
            )
        client = ant_provider.wrap(sdk, ctx, cache_breakpoints=True)
        await client.messages.create(model=MODEL, max_tokens=100, messages=history, tools=tools)
    sent = server.requests[-1].json["messages"]
    if where == "a block":
        assert marks(sent) == [1, 2]  # the caller's, then the last message's
    else:  # the last message holds the caller's, in its tool result: nothing added
        assert marks(sent) == [] and sent[2]["content"][0]["content"] == [inner[0]]


def marked(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "cache_control": EPHEMERAL}


@pytest.mark.parametrize("ids", ["toolu_{i}", "call_0", "call_{i}|fc_{i}"])
@pytest.mark.parametrize("breakpoints", [False, True], ids=["caller's only", "and the wrapper's"])
async def test_a_mark_the_caller_moved_off_a_cut_result_is_not_sent(
    breakpoints: bool, ids: str
) -> None:
    """A loop keeps ``cache_control`` on its four newest tool results, moving the marks on as
    results arrive. A result cut down while marked kept its mark, and the caller's later
    edit of it is not read: once moved on, the old marks went out beside the new ones and the
    API refused the request ("A maximum of 4 blocks with cache_control", found by a hostile
    run's fuzzer; and again with ids the repair renames: a server that numbers calls per
    response, another provider's)."""

    def output(i: int) -> str:
        lines = 900 if i % 3 == 0 else 150  # every third one is cut down as it arrives
        return "\n".join(f"line {n} of output {i} " + "x" * 50 for n in range(lines))

    budget = Budget(context_window=30_000, reserve_output=1_000)
    async with FakeAnthropic(default=Reply.text("ok")) as srv:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with raw, ContextManager(budget) as ctx:
            client = ant_provider.wrap(raw, ctx, cache_breakpoints=breakpoints)
            history: list[dict[str, Any]] = [{"role": "user", "content": "read the files"}]
            for i in range(24):
                call_id = ids.format(i=i)
                call = {"type": "tool_use", "id": call_id, "name": "read", "input": {"i": i}}
                result = {"type": "tool_result", "tool_use_id": call_id}
                result |= {"content": output(i), "cache_control": EPHEMERAL}
                history += [{"role": "assistant", "content": [call]}]
                history += [{"role": "user", "content": [result]}]
                for k in marks(history)[: -4 if not breakpoints else -2]:
                    blocks = [
                        {f: v for f, v in b.items() if f != "cache_control"}
                        for b in history[k]["content"]
                    ]
                    history[k] = {**history[k], "content": blocks}
                await client.messages.create(
                    model=MODEL, max_tokens=500, system=SYSTEM, tools=TOOLS, messages=history
                )
            assert len(ctx.ledger) > 1  # results were cut
    assert_all_ok(srv.requests)
    for request in srv.requests:
        assert sum(map(len, map(marks_in, request.json["messages"]))) <= MAX_BREAKPOINTS
    if not breakpoints and ids != "call_0":  # only where the caller has them now
        last = srv.requests[-1].json["messages"]
        kept = [b["tool_use_id"] for m in last for b in marks_in(m)]
        newest = [ids.format(i=i).replace("|", "_") for i in range(20, 24)]  # as sent
        assert kept and set(kept) <= set(newest)


async def test_a_mark_the_caller_has_now_is_kept_beside_a_renamed_id() -> None:
    """A server that numbers calls per response gives two results ``call_0``; the repair
    renames the second. Its marked first result keeps its mark (a fix for stale marks,
    looking marks up by id, took it off)."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "read two files"}]
    for i, marked in ((0, True), (1, False)):
        call = {"type": "tool_use", "id": "call_0", "name": "read", "input": {"i": i}}
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": "call_0", "content": "x"}
        if marked:
            result["cache_control"] = EPHEMERAL
        history += [{"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
    assert marks(await _sent_once(history, tools=TOOLS)) == [2]


async def _sent_once(history: list[dict[str, Any]], **create: Any) -> list[dict[str, Any]]:
    """The messages one wrapped request with ``history`` sends (the server took it)."""
    async with FakeAnthropic(default=Reply.text("ok")) as srv:
        raw = anthropic.AsyncAnthropic(base_url=srv.url, api_key="test", max_retries=0)
        async with raw, ContextManager(Budget(context_window=30_000)) as ctx:
            client = ant_provider.wrap(raw, ctx)
            await client.messages.create(model=MODEL, max_tokens=500, messages=history, **create)
    assert_all_ok(srv.requests)
    sent: list[dict[str, Any]] = srv.requests[-1].json["messages"]
    return sent


def marks_in(message: dict[str, Any]) -> list[object]:
    content = message["content"]
    return [b for b in content if "cache_control" in b] if isinstance(content, list) else []


def test_a_default_mark_before_an_hour_mark_goes() -> None:
    """A result cut down while marked keeps its mark; a caller who then marks a newer one for
    an hour had the old, shorter one before it, which the API refuses (it takes longer TTLs
    first; found by a hostile run)."""
    hour = {"type": "ephemeral", "ttl": "1h"}

    def result(i: int, mark: dict[str, str] | None) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "tool_result", "tool_use_id": f"t{i}", "content": "x"}
        return {"role": "user", "content": [block | ({"cache_control": mark} if mark else {})]}

    messages = [result(0, EPHEMERAL), result(1, None), result(2, hour), result(3, EPHEMERAL)]
    sent, marked = within_marks(messages, 4)
    assert (marks(sent), marked) == ([2, 3], 2)
    assert sent[2] is messages[2] and sent[3] is messages[3]
    assert within_marks(messages[1:], 4) == (messages[1:], 2)


async def test_what_is_no_mark_takes_no_room() -> None:
    """A tool parameter named ``cache_control`` and a ``cache_control: null`` were counted as
    marks, and one of the caller's real marks was taken off (found by a hostile run)."""
    tools = [
        {
            "name": "read",
            "description": "Read a file.",
            "input_schema": {"type": "object", "properties": {"cache_control": {"type": "string"}}},
        }
    ]
    system = [{"type": "text", "text": SYSTEM, "cache_control": None}]
    history: list[dict[str, Any]] = [{"role": "user", "content": "read three files"}]
    for i in range(3):
        call = {"type": "tool_use", "id": f"t{i}", "name": "read", "input": {}}
        result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": "x"}
        result["cache_control"] = EPHEMERAL
        history += [{"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
    assert marks(await _sent_once(history, system=system, tools=tools)) == [2, 4, 6]


def _history(turns: int, chars: int) -> list[dict[str, Any]]:
    """A task, then ``turns`` tool calls with results of ``chars`` characters."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "TASK: read the files"}]
    for i in range(turns):
        call = {"type": "tool_use", "id": f"t{i}", "name": "read", "input": {"path": f"f{i}"}}
        body = (f"line of file {i}: " + "x" * 60 + "\n") * (chars // 80)
        result = {"type": "tool_result", "tool_use_id": f"t{i}", "content": body}
        history += [{"role": "assistant", "content": [call]}, {"role": "user", "content": [result]}]
    return history


@pytest.mark.parametrize("failure", ["server error", "connection error"])
async def test_a_retried_request_is_made_as_the_one_that_failed(failure: str) -> None:
    """(Hostile run EB, 1) The breakpoints of a request were placed against the one before it
    even when that one failed (a 500, a timeout, a dropped connection after the SDK's own
    retries): the caller's retry lost the mark where the last answered request ended, and
    wrote its 25k-token prefix to the cache again instead of reading it."""
    second = Reply.server_error(500) if failure == "server error" else Reply.disconnect()
    with FakeAnthropic([Reply.text("ok"), second, Reply.text("ok")], caching="breakpoints") as srv:
        async with ContextManager(Budget(context_window=200_000)) as ctx:
            client = anthropic.AsyncAnthropic(base_url=srv.url, api_key="t", max_retries=0)
            async with ant_provider.wrap(client, ctx, cache_breakpoints=True) as wrapped:
                history = _history(30, 3000)
                await wrapped.messages.create(
                    model=MODEL, max_tokens=100, tools=TOOLS, messages=history
                )
                # More blocks than the cache looks back over: a mark where that one ended.
                history += _history(42, 300)[len(history) :]
                with pytest.raises((anthropic.InternalServerError, anthropic.APIConnectionError)):
                    await wrapped.messages.create(
                        model=MODEL, max_tokens=100, tools=TOOLS, messages=history
                    )
                await wrapped.messages.create(
                    model=MODEL, max_tokens=100, tools=TOOLS, messages=history
                )
    first, failed, retried = srv.requests
    assert failed.json == retried.json  # the same request: what the failed one cached is read
    assert len(first.json["messages"]) - 1 in marks(retried.json["messages"])
    assert retried.usage is not None and retried.usage.cache_read > 20_000


async def test_a_request_refused_before_it_is_sent_leaves_counts_as_they_were() -> None:
    """(Hostile run EA, 2) A create refused before anything was sent (an output limit over the
    window) became the request whose output limit a count asks for: every count raised the
    same `ConfigError` until a create succeeded."""
    history: list[dict[str, Any]] = [{"role": "user", "content": "task"}]
    with FakeAnthropic(script(5)) as srv:
        async with ContextManager(Budget(context_window=200_000)) as ctx:
            client = anthropic.AsyncAnthropic(base_url=srv.url, api_key="t", max_retries=0)
            async with ant_provider.wrap(client, ctx) as wrapped:
                await wrapped.messages.create(model=MODEL, max_tokens=1000, messages=history)
                with pytest.raises(ConfigError, match="max_tokens=250000"):
                    await wrapped.messages.create(model=MODEL, max_tokens=250_000, messages=history)
                counted = await wrapped.messages.count_tokens(model=MODEL, messages=history)
                assert counted.input_tokens > 0
    assert len(srv.requests) == 2  # the create and the count: the refused one was never sent
