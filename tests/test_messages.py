from __future__ import annotations

import contextlib
import copy
import hashlib
import pickle
import tracemalloc
from collections.abc import Iterator
from types import MappingProxyType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agentctx.messages as messages_module
from agentctx import UnsupportedMessageError
from agentctx.budget import Budget
from agentctx.events import HistoryResynced
from agentctx.importers import load_transcript
from agentctx.manager import ContextManager
from agentctx.messages import (
    AssistantMessage,
    ImageBlock,
    Message,
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
from agentctx.tokens import MessageCounter

from .corpus import corpus_files


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


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: UserMessage("word " * 1000), "UserMessage.content of type str"),  # type: ignore[arg-type]
        (lambda: ToolResultMessage("c", "text"), "ToolResultMessage.content of type str"),  # type: ignore[arg-type]
        (lambda: AssistantMessage(None), "AssistantMessage.content of type NoneType"),  # type: ignore[arg-type]
        (lambda: UserMessage((ToolCall("c", "f", {}),)), "ToolCall in UserMessage.content"),  # type: ignore[arg-type]
        (lambda: ToolCall(None, "f", {}), "ToolCall.id of type NoneType"),  # type: ignore[arg-type]
        (lambda: ToolCall("c", None, {}), "ToolCall.name of type NoneType"),  # type: ignore[arg-type]
        (lambda: ToolCall("c", "f", [1]), "ToolCall.arguments of type list"),  # type: ignore[arg-type]
        (lambda: TextBlock(5), "TextBlock.text of type int"),  # type: ignore[arg-type]
        (lambda: TextBlock("x", None), "TextBlock.extra of type NoneType"),  # type: ignore[arg-type]
        (lambda: SummaryMessage(7), "SummaryMessage.text of type int"),  # type: ignore[arg-type]
        (lambda: ImageBlock("image/png", None), "ImageBlock.data of type NoneType"),  # type: ignore[arg-type]
        (lambda: ThinkingBlock("t", 123), "ThinkingBlock.signature of type int"),  # type: ignore[arg-type]
        (lambda: ToolResultMessage("c", (), is_error="false"), "is_error of type str"),  # type: ignore[arg-type]
        (lambda: AssistantMessage((), stop_reason=["x"]), "stop_reason of type list"),  # type: ignore[arg-type]
        (lambda: UserMessage((), extra=[1]), "UserMessage.extra of type list"),  # type: ignore[arg-type]
    ],
)
def test_a_message_of_wrong_field_types_is_refused_when_made(make: object, named: str) -> None:
    """Found by a hostile run (V, finding 7): a message whose fields had the wrong types was
    taken. ``UserMessage(text)`` (for ``UserMessage.of(text)``) was read character by
    character as blocks and counted as empty: 500,000 characters sent as 14 tokens, past the
    budget; the others failed deep inside a count or a repair as bare errors."""
    with pytest.raises(UnsupportedMessageError, match=named):
        make()  # type: ignore[operator]


def test_a_list_of_blocks_is_taken_as_a_tuple() -> None:
    message = UserMessage([TextBlock("hi")])  # type: ignore[arg-type]
    assert message.content == (TextBlock("hi"),) and message == UserMessage.of("hi")


@pytest.mark.parametrize(
    ("d", "named"),
    [
        ({"role": "user", "content": [], "extra": "x"}, "'extra' is no object"),
        ({"role": "user", "content": [{"type": "text", "text": "t", "extra": 5}]}, "'extra'"),
        ({"role": 10**5000, "content": []}, "role a int"),
        ({"role": "user", "content": [{"type": 10**5000}]}, "block type a int"),
        ({"role": "tool", "tool_call_id": "c", "content": [], "is_error": "false"}, "is_error"),
        ({"role": "assistant", "content": [], "usage": {"reasoning_tokens": 1}}, "usage field"),
        ({"role": "assistant", "content": [], "usage": {1: 1}}, "usage field 1"),
        ({"role": "assistant", "content": [], "usage": {"input_tokens": "12"}}, "input_tokens"),
        ({"role": "assistant", "content": [], "usage": {"output_tokens": -5}}, "-5"),
        ({"role": "assistant", "content": [], "model": 5}, "model of type int"),
    ],
)
def test_from_dict_refuses_what_to_dict_never_writes(d: dict[object, object], named: str) -> None:
    """Found by a hostile run (V, finding 4): `from_dict` let bare `TypeError` / `ValueError`
    out (an ``extra`` that is no object, a usage key it does not know, a huge int where a
    role or block type goes) and took what no message holds (``is_error: "false"`` as true,
    usage counts that are strings or negative)."""
    with pytest.raises(UnsupportedMessageError, match=named):
        from_dict(d)  # type: ignore[arg-type]


def test_an_integer_json_cannot_write_is_refused_in_arguments() -> None:
    """Found by a hostile run (V, finding 3): an int of more than 4300 digits in a tool
    call's arguments passed `check_history`, then `prepare` raised a bare `ValueError` from
    the JSON encoder while counting it."""
    call = ToolCall("c", "f", {"n": 10**5000})
    nested = ToolCall("c", "f", {"n": [1, {"m": -(10**5000)}]})
    for block in (call, nested):
        with pytest.raises(UnsupportedMessageError) as caught:
            check_history([UserMessage.of("t"), AssistantMessage((block,))])
        assert caught.value.index == 1 and "integer" in str(caught.value)
    check_history([AssistantMessage((ToolCall("c", "f", {"n": 10**300}),))])


def test_a_null_is_error_reads_as_not_an_error() -> None:
    """Hostile run X: the importers read a null ``is_error`` as absent; so does `from_dict`."""
    d = {"role": "tool", "tool_call_id": "c", "content": [], "is_error": None}
    assert from_dict(d) == ToolResultMessage("c", ())


# -- copies and pickles -----------------------------------------------------------------------


def _copies(message: object) -> list[object]:
    return [copy.copy(message), copy.deepcopy(message), pickle.loads(pickle.dumps(message))]


def test_every_kind_survives_copy_deepcopy_and_pickle() -> None:
    """A history deep-copied to snapshot it, or pickled to hand it to another process,
    failed on every message from `from_dict` or an adapter: their mappings are read-only
    proxies, which neither pickle nor deep-copy (TypeError)."""
    for message in every_kind():
        for kept in (message, from_dict(to_dict(message))):  # type: ignore[arg-type]
            for twin in _copies(kept):
                assert twin == kept
                assert type(twin) is type(kept)
                assert fingerprint(twin) == fingerprint(kept)  # type: ignore[arg-type]


def test_a_deep_copy_is_its_own_and_keeps_no_counter_state() -> None:
    kept = from_dict(
        to_dict(AssistantMessage((ToolCall("c1", "read", {"path": "a.py", "opts": {"n": [1]}}),)))
    )
    MessageCounter().count(kept)  # caches the estimate and fingerprint on the object
    fingerprint(kept)
    twin = copy.deepcopy(kept)
    assert twin._tk is None and twin._fp == ""
    arguments = twin.content[0].arguments  # type: ignore[union-attr]
    assert isinstance(arguments, MappingProxyType)  # read-only, as it was
    assert arguments["opts"] is not kept.content[0].arguments["opts"]  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        arguments["path"] = "b.py"  # type: ignore[index]


TRANSCRIPTS = [
    path
    for kind in ("pi", "claude-code", "openhands", "swe-agent")
    for path in corpus_files(kind)
    if path.name != "assistant-message-with-thinking-code.json"  # one message, no transcript
]


async def test_real_histories_deep_copied_or_pickled_continue_the_session() -> None:
    """Every message of the corpus's transcripts copies and pickles; a session handed the
    copies goes on as with the originals (they are equal: no rewind, the same view)."""
    for path in TRANSCRIPTS:
        messages = list(load_transcript(path).messages)
        for message in messages:
            assert pickle.loads(pickle.dumps(message)) == message
        half = len(messages) // 2
        budget = Budget(context_window=30_000, reserve_output=4_000)
        views = []
        for history in (messages, pickle.loads(pickle.dumps(messages[:half])) + messages[half:]):
            events: list[object] = []
            async with ContextManager(budget, on_over_budget="send") as ctx:
                ctx.subscribe(events.append)
                await ctx.prepare(history[:half])
                views.append([to_dict(m) for m in await ctx.prepare(copy.deepcopy(history))])
            assert not [e for e in events if isinstance(e, HistoryResynced)]
        assert views[0] == views[1]


_JSON_LEAF = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=40)
)
_JSON = st.recursive(
    _JSON_LEAF,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@contextlib.contextmanager
def _hashed_in_small_pieces() -> Iterator[None]:
    """Pieces and the threshold small, so hypothesis's small texts are hashed in pieces."""
    saved = messages_module._HASHED_IN_PIECES_FROM, messages_module._PIECE
    messages_module._HASHED_IN_PIECES_FROM, messages_module._PIECE = 1, 7
    try:
        yield
    finally:
        messages_module._HASHED_IN_PIECES_FROM, messages_module._PIECE = saved


@given(
    text=st.text(alphabet=st.characters(exclude_categories=()), min_size=1, max_size=200),
    arguments=st.dictionaries(st.text(max_size=8), _JSON, max_size=4),
    extra=st.dictionaries(st.text(max_size=8), _JSON, max_size=3),
)
@settings(max_examples=60, deadline=None)
def test_a_large_message_is_fingerprinted_from_the_same_bytes_a_piece_at_a_time(
    text: str, arguments: dict[str, object], extra: dict[str, object]
) -> None:
    """The fingerprint of a message with over a million characters of text is made a piece
    at a time (found by a hostile run, AK finding 5: whole, the JSON of 50 MB of a binary
    file's output took 2 GB), of the very bytes `canonical_json` writes: the fingerprints
    saved in ledgers stay what they were."""
    message = AssistantMessage(
        (TextBlock(text * 3), ToolCall("c1", "run", arguments)), extra=MappingProxyType(extra)
    )
    whole = hashlib.blake2b(
        canonical_json(message).encode("utf-8", "surrogatepass"), digest_size=16
    ).hexdigest()
    with _hashed_in_small_pieces():
        assert fingerprint(message) == whole


_BINARY = ("\x00" * 63 + "\ufffd") * (8_000_000 // 64)  # `cat` of a binary file: 8 MB


@pytest.mark.parametrize(
    "message",
    [
        ToolResultMessage.of("c1", _BINARY, tool_name="bash"),
        # (AL, finding 4) Large strings outside texts: a file written whole, fields, payloads.
        AssistantMessage((ToolCall("c1", "write_file", {"path": "a.bin", "content": _BINARY}),)),
        UserMessage((TextBlock("x"),), MappingProxyType({"stdout": _BINARY})),
        ToolResultMessage("c1", (TextBlock("ok", MappingProxyType({"raw": _BINARY})),), "cat"),
        AssistantMessage((OpaqueBlock("openai", {"output": _BINARY}),)),
        # (AM, finding 4) Nested: a multi-edit tool's arguments, pydantic-ai's document part.
        AssistantMessage((ToolCall("c1", "edit", {"edits": [{"new_text": _BINARY}]}),)),
        AssistantMessage((OpaqueBlock("pydantic_ai", {"part": {"data": _BINARY}}),)),
    ],
    ids=[
        "output",
        "arguments",
        "message-field",
        "block-field",
        "payload",
        "nested-arguments",
        "nested-payload",
    ],  # fmt: skip
)
def test_a_binary_files_output_is_fingerprinted_in_little_memory(message: Message) -> None:
    tracemalloc.start()
    try:
        fingerprint(message)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024  # 360 MB before: its JSON, escaped, at 4 bytes a character
