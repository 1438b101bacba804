"""agentctx measured exactly as its Python peers are: the same sessions, the same requests,
the same yardstick.

    ./scripts/bench [--cells NAME@B,...] [--strategies NAME,...] [--quick] [--target-ratio X,...]

(``scripts/bench`` makes ``.venv-bench`` with the ``bench`` dependency group, whose
pydantic-ai-harness pins a pydantic-ai-slim of its own, and runs this file in it.)

Each cell is a recorded session (``tests/corpus``: the pi sessions, the Claude Code chains)
at a budget B of o200k tokens. Request k is everything before the k-th assistant response
(`_yardstick.clean_history` first makes the recording one a provider accepts, the same for
every strategy). Each strategy gets the messages appended since request k-1 and returns the
request it would send; `_yardstick.Judge` judges what was sent, converted to one canonical
message list (tokens, requests over B, peak, invalid, task lost, cache breaks against the
strategy-independent minimum, prefix-cache cost, early file paths kept, time).

The strategies, each at its defaults, driven through its own hook as its framework does:

* ``none``: the raw history;
* pydantic-ai-harness 0.62 capabilities, through ``before_model_request(ctx, request_context)``
  on a real ``RunContext`` whose ``messages`` is the persisted history (compaction writes it,
  new messages are appended to what it wrote). Each ``ModelResponse`` carries
  ``usage.input_tokens`` = the exact size of the request that produced it as sent, and
  ``output_tokens`` = its own size, as a provider reports them: ``ClearToolResults(max_tokens=B)``,
  the same with ``min_clear_tokens=B/10``, ``SlidingWindowCompaction(max_tokens=B)``,
  ``TieredCompaction([ClearToolResults(max_tokens=1), SlidingWindowCompaction(max_messages=1)],
  target_tokens=B)`` and ``SummarizingCompaction(max_tokens=B)`` on an offline
  ``FunctionModel`` that answers with agentctx's offline extractive summarizer (`offline_summary`);
* LangChain v1, each ``AIMessage`` carrying ``usage_metadata`` as langchain-anthropic reports
  it (the same numbers as pydantic-ai's) and a fake chat model typed as Anthropic's (its
  middleware chooses its token counter, and reads reported usage, by the model's type):
  ``ContextEditingMiddleware([ClearToolUsesEdit(trigger=B)])`` through
  ``wrap_model_call`` on the whole stored state (it edits a deep copy; the state stays raw),
  ``trim_messages`` on the stored state as a LangGraph ``pre_model_hook`` would
  (``strategy="last"``, ``start_on="human"``, ``end_on=("human", "tool")``,
  ``count_tokens_approximately``) and ``SummarizationMiddleware(trigger=("tokens", B))``
  through ``before_model``, its ``REMOVE_ALL_MESSAGES`` update applied to the state, with a
  ``RunnableLambda`` summarizer answering with `offline_summary` too;
* agentctx: ``DeterministicCompaction()`` (the default), ``ToolOutputPipeline`` then the tiers,
  and the ``llm`` strategy of ``agentctx replay`` (background briefings from the offline
  extractive summarizer, 8 s of session time each, then the tiers), with a `Budget` whose
  hard prompt limit is exactly B, counting with its default `MessageCounter` (its estimator,
  texts under 256 characters exact with the ``tokenizer`` extra), as the peers count with
  theirs, through ``prepare`` (projection mode) and ``observe`` with the exact size of what
  it sent (`_yardstick.run_agentctx`), with a `MemoryRecallStore`, so that what it cleared is
  one ``recall_context`` call away: every request it sends carries that tool's definition,
  counted in its size and cost. ``--target-ratio`` adds
  the deterministic strategy at other ``Budget.target_ratio`` values; ``--floor`` a row timing
  what agentctx's no-decision call cannot leave out (validation, the repair check, quick
  estimates, the list sent), which sends the whole history.

A summary's own work (the offline summarizer's extraction) stands in for a model's reply: it
is inside a peer's timed call, which waits for the reply inline, and outside agentctx's, which
asks for it in the background; summaries are rare, so only a p99 can see it.

Time is ``perf_counter`` around the strategy's own call only (``before_model_request``,
``wrap_model_call`` with its deep copy, ``trim_messages``, ``before_model``, ``prepare``);
conversions and judging are not timed. Every strategy gets each request's new messages as
objects converted right before its call (the peers' from their adapters, agentctx's as a
neutral round trip), as an agent loop's SDK parse hands them over. Each strategy starts after
a ``gc.collect()``.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import platform
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _yardstick as y

from agentctx.importers import load_transcript
from agentctx.messages import (
    AssistantMessage,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from agentctx.recall import MemoryRecallStore
from agentctx.replay.offline_summarizer import extract_briefing
from agentctx.summarizer import serialize_transcript

CORPUS = Path(__file__).resolve().parents[1] / "tests" / "corpus"


def offline_summary(text: str) -> str:
    """What every peer's summarizer returns for the ``text`` it is asked to summarize: the
    briefing of the offline extractive summarizer agentctx's ``llm`` row uses (the task,
    decisions, files and commands, errors), so that no strategy's summary keeps more."""
    return extract_briefing(text)


PLACEHOLDER = "Previous conversation was too long to summarize."


# -- sessions and cells ----------------------------------------------------------------------------


@dataclass
class Session:
    name: str
    messages: list[Message]
    calls: list[int] = field(default_factory=list)
    times: list[float | None] = field(default_factory=list)
    task: str = ""
    tools: set[str] = field(default_factory=set)
    paths: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.calls = y.calls(self.messages)
        self.times = y.request_times(self.messages)
        self.task = y.first_user_text(self.messages)
        self.tools = y.tool_names(self.messages)
        self.paths = y.early_paths(self.messages)

    def new(self, k: int) -> list[Message]:
        """The messages appended since request k-1 (all of them before request 0)."""
        start = 0 if k == 0 else self.calls[k - 1]
        return self.messages[start : self.calls[k]]


PI = ("large-session", "before-compaction")
A2898E3 = "cc/spotter-4d5611e5-agent-a2898e3"
SKIPPED = ("spotter-4d5611e5-agent-acompact-e1f845",)  # a one-shot summarizer call
QUICK = (f"{A2898E3}@50k", "cc/spotter-subagent@10k")


def load_sessions() -> dict[str, Session]:
    sessions: dict[str, Session] = {}
    for name in PI:
        raw = load_transcript(CORPUS / "pi" / f"{name}.jsonl").messages
        sessions[f"pi/{name}"] = Session(f"pi/{name}", y.clean_history(raw))
    for path in sorted((CORPUS / "claude-code").glob("*.jsonl")):
        if path.stem in SKIPPED:
            continue
        raw = load_transcript(path).messages
        sessions[f"cc/{path.stem}"] = Session(f"cc/{path.stem}", y.clean_history(raw))
    return sessions


def parse_cell(text: str) -> tuple[str, int]:
    name, _, budget = text.partition("@")
    if not budget:
        raise argparse.ArgumentTypeError(
            f"a cell is NAME@BUDGET, e.g. pi/large-session@50k: {text}"
        )
    b = budget.lower()
    return name, int(float(b[:-1]) * 1000) if b.endswith("k") else int(b)


def default_cells(canon: y.Canon, sessions: dict[str, Session]) -> list[tuple[str, int]]:
    """The pi sessions at 100k and 50k; the Claude Code chains whose raw context passes 50k
    (a2898e3 always: it is the one the published baselines found there), at 50k."""
    cells = [(f"pi/{n}", b) for n in PI for b in (100_000, 50_000)]
    for name, s in sessions.items():
        if not name.startswith("cc/"):
            continue
        raw = raw_requests(canon, s)
        peak = max(sum(canon.tokens_of(m) for m in r) for r in raw) if raw else 0
        if peak > 50_000 or name == A2898E3:
            cells.append((name, 50_000))
    return cells


def raw_requests(canon: y.Canon, s: Session) -> list[list[y.Msg]]:
    converted = [canon.neutral(m) for m in s.messages]
    return [y.merge(converted[:i]) for i in s.calls]


# -- pydantic-ai-harness ---------------------------------------------------------------------------


class PaiAdapter:
    """Neutral messages into pydantic-ai's, and what pydantic-ai sends back into canonical form
    (memoized per message object, which the persisted history keeps)."""

    def __init__(self, canon: y.Canon) -> None:
        from pydantic_ai import messages as pm
        from pydantic_ai.usage import RequestUsage

        self.pm = pm
        self.usage = RequestUsage
        self.canon = canon
        self._cache: dict[int, tuple[Any, y.Msg]] = {}

    def to_pai(self, new: Sequence[Message], input_tokens: int) -> list[Any]:
        """``new`` as pydantic-ai messages; an assistant response reports ``input_tokens``
        (the size of the request that produced it, as sent) and its own size as output."""
        pm = self.pm
        out: list[Any] = []
        results: list[Any] = []
        for m in new:
            if isinstance(m, ToolResultMessage):
                results.append(
                    pm.ToolReturnPart(
                        tool_name=m.tool_name or "tool",
                        content="\n".join(b.text for b in m.content if isinstance(b, TextBlock)),
                        tool_call_id=m.tool_call_id,
                        outcome="failed" if m.is_error else "success",
                    )
                )
                continue
            if results:
                out.append(pm.ModelRequest(parts=results))
                results = []
            if isinstance(m, UserMessage):
                texts = [b.text for b in m.content if isinstance(b, TextBlock)]
                content = texts[0] if len(texts) == 1 else texts
                out.append(pm.ModelRequest(parts=[pm.UserPromptPart(content=content)]))
            elif isinstance(m, AssistantMessage):
                parts: list[Any] = []
                for b in m.content:
                    if isinstance(b, TextBlock):
                        parts.append(pm.TextPart(content=b.text))
                    elif isinstance(b, ThinkingBlock):
                        parts.append(
                            pm.ThinkingPart(
                                content=b.thinking,
                                signature=b.signature,
                                provider_name="anthropic" if b.signature else None,
                            )
                        )
                    elif isinstance(b, ToolCall):
                        parts.append(
                            pm.ToolCallPart(
                                tool_name=b.name, args=dict(b.arguments), tool_call_id=b.id
                            )
                        )
                output = self.canon.tokens_of(self.canon.neutral(m))
                out.append(
                    pm.ModelResponse(
                        parts=parts,
                        usage=self.usage(input_tokens=input_tokens, output_tokens=output),
                        model_name="claude-sonnet-4-6",
                        provider_name="anthropic",
                    )
                )
            else:
                raise TypeError(f"unexpected message {type(m).__name__}")
        if results:
            out.append(pm.ModelRequest(parts=results))
        return out

    def canonical(self, messages: Sequence[Any]) -> list[y.Msg]:
        cache = self._cache
        out = []
        for m in messages:
            hit = cache.get(id(m))
            if hit is None or hit[0] is not m:
                hit = cache[id(m)] = (m, self._convert(m))
            out.append(hit[1])
        return out

    def _convert(self, m: Any) -> y.Msg:
        pm, canon = self.pm, self.canon
        keys: list[str] = []
        if isinstance(m, pm.ModelResponse):
            for p in m.parts:
                if isinstance(p, pm.TextPart):
                    keys.append(canon.text(p.content))
                elif isinstance(p, pm.ThinkingPart):
                    keys.append(canon.thinking(p.content, p.signature))
                elif isinstance(p, pm.ToolCallPart):
                    keys.append(canon.tool_use(p.tool_call_id, p.tool_name, p.args_as_dict()))
                else:
                    raise TypeError(f"unexpected response part {type(p).__name__}")
            return "assistant", tuple(keys)
        for p in m.parts:
            if isinstance(p, pm.ToolReturnPart):
                content = p.content if isinstance(p.content, str) else p.model_response_str()
                keys.append(canon.tool_result(p.tool_call_id, [content], p.outcome == "failed"))
            elif isinstance(p, pm.UserPromptPart):
                texts = [p.content] if isinstance(p.content, str) else list(p.content)
                keys.extend(
                    canon.text(t) if isinstance(t, str) else canon.text(str(t)) for t in texts
                )
            elif isinstance(p, pm.CompactionPart | pm.SystemPromptPart | pm.RetryPromptPart):
                # A summary is sent as user-voice text (a system prompt too, counted here).
                text = p.model_response() if isinstance(p, pm.RetryPromptPart) else p.content
                keys.append(canon.text(str(text)))
            else:
                raise TypeError(f"unexpected request part {type(p).__name__}")
        return "user", tuple(keys)


def pai_strategies() -> dict[str, Callable[[int, Any], Any]]:
    from pydantic_ai_harness.compaction import (
        ClearToolResults,
        SlidingWindowCompaction,
        SummarizingCompaction,
        TieredCompaction,
    )

    return {
        "pai.ClearToolResults": lambda b, model: ClearToolResults(max_tokens=b),
        "pai.ClearToolResults(min_clear=B/10)": lambda b, model: ClearToolResults(
            max_tokens=b, min_clear_tokens=b // 10
        ),
        "pai.SlidingWindowCompaction": lambda b, model: SlidingWindowCompaction(max_tokens=b),
        "pai.Tiered(Clear->Sliding)": lambda b, model: TieredCompaction(
            [ClearToolResults(max_tokens=1), SlidingWindowCompaction(max_messages=1)],
            target_tokens=b,
        ),
        "pai.SummarizingCompaction(offline summarizer)": lambda b, model: SummarizingCompaction(
            model=model, max_tokens=b
        ),
    }


def _fake_model() -> Any:
    from pydantic_ai.messages import ModelResponse, TextPart
    from pydantic_ai.models.function import FunctionModel

    def summarize(messages: Any, info: Any) -> Any:
        text = "\n".join(str(getattr(p, "content", "")) for m in messages for p in m.parts)
        return ModelResponse(parts=[TextPart(offline_summary(text))])

    return FunctionModel(summarize, model_name="offline-summarizer")


async def run_pai(
    session: Session, judge: y.Judge, build: Callable[[int, Any], Any], b: int
) -> None:
    from pydantic_ai import RunContext
    from pydantic_ai.models import ModelRequestContext, ModelRequestParameters
    from pydantic_ai.usage import RunUsage
    from pydantic_ai_harness.compaction import SummarizingCompaction

    adapter = PaiAdapter(judge.canon)
    model = _fake_model()
    capability = build(b, model)
    ctx = RunContext(deps=None, model=model, usage=RunUsage(), messages=[], run_id="bench")
    params = ModelRequestParameters()
    splices = 0
    sent_tokens = 0
    for k in range(len(session.calls)):
        ctx.messages.extend(adapter.to_pai(session.new(k), sent_tokens))
        ctx.run_step = k + 1
        request = ModelRequestContext(
            model=model,
            messages=ctx.messages[:],
            model_settings=None,
            model_request_parameters=params,
        )
        started = time.perf_counter()
        returned = await capability.before_model_request(ctx, request)
        ms = (time.perf_counter() - started) * 1000
        splices += returned is not request  # a compaction returns a new request context
        sent = adapter.canonical(returned.messages)
        sent_tokens = judge.add(sent, session.times[k], ms=ms)
    if isinstance(capability, SummarizingCompaction):
        judge.result.notes.append(f"{splices} summaries spliced")


# -- LangChain -------------------------------------------------------------------------------------


class LcAdapter:
    """Neutral messages into LangChain's (langchain-anthropic's shape: an ``AIMessage`` holds
    its ``tool_use`` blocks in its content and ``tool_calls``), and back to canonical form."""

    def __init__(self, canon: y.Canon, *, memo: bool = True) -> None:
        from langchain_core import messages as lm

        self.lm = lm
        self.canon = canon
        self.memo = memo
        self._cache: dict[int, tuple[Any, y.Msg]] = {}
        self._n = 0

    def to_lc(self, new: Sequence[Message], input_tokens: int) -> list[Any]:
        """``new`` as LangChain messages; an ``AIMessage`` reports its usage as
        langchain-anthropic gives it (``input_tokens``, the size of the request that produced
        it as sent, and its own size as output; ``model_provider`` "anthropic"), which
        LangChain's middleware reads, as pydantic-ai's strategies read theirs."""
        lm = self.lm
        out: list[Any] = []
        for m in new:
            self._n += 1
            mid = f"m{self._n}"
            if isinstance(m, UserMessage):
                texts = [b.text for b in m.content if isinstance(b, TextBlock)]
                content: Any = (
                    texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]
                )
                out.append(lm.HumanMessage(content=content, id=mid))
            elif isinstance(m, ToolResultMessage):
                texts = [b.text for b in m.content if isinstance(b, TextBlock)]
                out.append(
                    lm.ToolMessage(
                        content=texts[0]
                        if len(texts) == 1
                        else [{"type": "text", "text": t} for t in texts],
                        tool_call_id=m.tool_call_id,
                        name=m.tool_name,
                        status="error" if m.is_error else "success",
                        id=mid,
                    )
                )
            elif isinstance(m, AssistantMessage):
                blocks: list[dict[str, Any]] = []
                for b in m.content:
                    if isinstance(b, TextBlock):
                        blocks.append({"type": "text", "text": b.text})
                    elif isinstance(b, ThinkingBlock):
                        blocks.append(
                            {"type": "thinking", "thinking": b.thinking, "signature": b.signature}
                        )
                    elif isinstance(b, ToolCall):
                        blocks.append(
                            {
                                "type": "tool_use",
                                "id": b.id,
                                "name": b.name,
                                "input": dict(b.arguments),
                            }
                        )
                calls = [
                    {"name": c.name, "args": dict(c.arguments), "id": c.id, "type": "tool_call"}
                    for c in m.tool_calls
                ]
                output = self.canon.tokens_of(self.canon.neutral(m))
                reported = {
                    "usage_metadata": {
                        "input_tokens": input_tokens,
                        "output_tokens": output,
                        "total_tokens": input_tokens + output,
                    },
                    "response_metadata": {
                        "model_provider": "anthropic",
                        "model_name": "claude-sonnet-4-6",
                    },
                }
                if len(blocks) == 1 and blocks[0]["type"] == "text":
                    out.append(lm.AIMessage(content=blocks[0]["text"], id=mid, **reported))
                else:
                    out.append(lm.AIMessage(content=blocks, tool_calls=calls, id=mid, **reported))
            else:
                raise TypeError(f"unexpected message {type(m).__name__}")
        return out

    def canonical(self, messages: Sequence[Any]) -> list[y.Msg]:
        if not self.memo:
            return [self._convert(m) for m in messages]
        cache = self._cache
        out = []
        for m in messages:
            hit = cache.get(id(m))
            if hit is None or hit[0] is not m:
                hit = cache[id(m)] = (m, self._convert(m))
            out.append(hit[1])
        return out

    def _convert(self, m: Any) -> y.Msg:
        lm, canon = self.lm, self.canon
        content = m.content
        if isinstance(m, lm.ToolMessage):
            if isinstance(content, str):
                texts = [content]
            else:
                texts = [p["text"] if isinstance(p, dict) else str(p) for p in content]
            return "user", (canon.tool_result(m.tool_call_id, texts, m.status == "error"),)
        keys: list[str] = []
        if isinstance(m, lm.AIMessage):
            args = {c["id"]: c for c in m.tool_calls}
            used: set[str] = set()
            for p in [content] if isinstance(content, str) else content:
                if isinstance(p, str):
                    if p:
                        keys.append(canon.text(p))
                elif p["type"] == "text":
                    keys.append(canon.text(p["text"]))
                elif p["type"] == "thinking":
                    keys.append(canon.thinking(p["thinking"], p.get("signature")))
                elif p["type"] == "tool_use":
                    call = args.get(p["id"])
                    used.add(p["id"])
                    keys.append(
                        canon.tool_use(p["id"], p["name"], call["args"] if call else p["input"])
                    )
                else:
                    keys.append(canon.block(dict(p)))
            for c in m.tool_calls:
                if c["id"] not in used:
                    keys.append(canon.tool_use(c["id"], c["name"], c["args"]))
            return "assistant", tuple(keys)
        for p in [content] if isinstance(content, str) else content:
            if isinstance(p, str):
                keys.append(canon.text(p))
            elif p.get("type") == "text":
                keys.append(canon.text(p["text"]))
            else:
                keys.append(canon.block(dict(p)))
        return "user", tuple(keys)


def _fake_chat_model() -> Any:
    """A fake chat model LangChain takes for Anthropic's, as every cell models Anthropic (its
    prices, pydantic-ai's model): its middleware picks its token counter and reads reported
    usage by the model's type and provider."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    class AnthropicFake(FakeListChatModel):
        @property
        def _llm_type(self) -> str:
            return "anthropic-chat"

        def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> Any:
            params = super()._get_ls_params(stop=stop, **kwargs)
            params["ls_provider"] = "anthropic"
            return params

    return AnthropicFake(responses=["ok"])


async def run_lc_clear(session: Session, judge: y.Judge, b: int) -> None:
    from langchain.agents.middleware import ClearToolUsesEdit, ContextEditingMiddleware
    from langchain.agents.middleware.types import ModelRequest
    from langchain_core.messages import AIMessage

    adapter = LcAdapter(judge.canon)
    fresh = LcAdapter(judge.canon, memo=False)  # the edited copies are new objects each time
    middleware = ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=b)])
    model = _fake_chat_model()
    state: list[Any] = []
    seen: list[Any] = []

    def handler(request: Any) -> Any:
        seen.append(request.messages)
        return AIMessage(content="ok")

    sent_tokens = 0
    for k in range(len(session.calls)):
        state.extend(adapter.to_lc(session.new(k), sent_tokens))
        request = ModelRequest(model=model, messages=state, state={"messages": state})
        seen.clear()
        started = time.perf_counter()
        middleware.wrap_model_call(request, handler)
        ms = (time.perf_counter() - started) * 1000
        sent_tokens = judge.add(fresh.canonical(seen[0]), session.times[k], ms=ms)


async def run_lc_trim(session: Session, judge: y.Judge, b: int) -> None:
    from langchain_core.messages import trim_messages
    from langchain_core.messages.utils import count_tokens_approximately

    adapter = LcAdapter(judge.canon)
    state: list[Any] = []
    sent_tokens = 0
    for k in range(len(session.calls)):
        state.extend(adapter.to_lc(session.new(k), sent_tokens))
        started = time.perf_counter()
        sent = trim_messages(
            state,
            strategy="last",
            max_tokens=b,
            token_counter=count_tokens_approximately,
            start_on="human",
            end_on=("human", "tool"),
        )
        ms = (time.perf_counter() - started) * 1000
        sent_tokens = judge.add(adapter.canonical(sent), session.times[k], ms=ms)


def _lc_transcript(messages: Sequence[Any]) -> str:
    """LangChain messages as the plain text a summarizer reads: the transcript agentctx's own
    summarization requests carry (`serialize_transcript`), which the offline summarizer reads
    its goal, decisions, files and commands from, as it does for agentctx's ``llm`` row."""
    from agentctx.integrations.langchain import from_langchain

    return serialize_transcript(from_langchain(messages))


async def run_lc_summarization(session: Session, judge: y.Judge, b: int) -> None:
    from langchain.agents.middleware import SummarizationMiddleware
    from langchain_core.messages import RemoveMessage
    from langchain_core.runnables import RunnableLambda
    from langgraph.graph.message import REMOVE_ALL_MESSAGES

    adapter = LcAdapter(judge.canon)
    middleware = SummarizationMiddleware(
        model=_fake_chat_model(),
        trigger=("tokens", b),
        summarizer=RunnableLambda(lambda messages: offline_summary(_lc_transcript(messages))),
    )
    state: list[Any] = []
    splices = placeholders = 0
    sent_tokens = 0
    for k in range(len(session.calls)):
        state.extend(adapter.to_lc(session.new(k), sent_tokens))
        started = time.perf_counter()
        update = middleware.before_model({"messages": state}, None)  # type: ignore[arg-type]
        ms = (time.perf_counter() - started) * 1000
        if update is not None:
            # The add_messages reducer: REMOVE_ALL_MESSAGES, then the new list.
            new = update["messages"]
            assert isinstance(new[0], RemoveMessage) and new[0].id == REMOVE_ALL_MESSAGES
            state = list(new[1:])
            splices += 1
            placeholders += any(PLACEHOLDER in str(m.content) for m in state[:2])
        sent_tokens = judge.add(adapter.canonical(state), session.times[k], ms=ms)
    if splices:
        judge.result.notes.append(
            f"{placeholders}/{splices} splices were the 'too long to summarize' placeholder"
        )


# -- the strategies --------------------------------------------------------------------------------


def _none(session: Session, judge: y.Judge, b: int) -> Any:
    async def run() -> None:
        canon = judge.canon
        converted = [canon.neutral(m) for m in session.messages]
        for k, i in enumerate(session.calls):
            started = time.perf_counter()
            request = converted[:i]
            ms = (time.perf_counter() - started) * 1000
            judge.add(request, session.times[k], ms=ms)

    return run()


FLOOR = "floor (agentctx's checks alone; sends all)"


def _floor(session: Session, judge: y.Judge, b: int) -> Any:
    """What agentctx's call cannot leave out, timed as the strategies are (``--floor``): each
    request's new messages validated (`check_history`), checked to need no repair
    (`answered_call_ids`) and counted on quick estimates (a lazy `MessageCounter`), and the
    list sent copied. No view is kept, nothing is compacted or followed (edits, rewinds), no
    near-budget count is made: it sends the whole history and is judged so. Its p50 is what
    a no-decision call of agentctx costs at the least."""

    async def run() -> None:
        from agentctx.boundaries import answered_call_ids
        from agentctx.messages import check_history, from_dict, to_dict
        from agentctx.tokens import MessageCounter

        canon = judge.canon
        converted = [canon.neutral(m) for m in session.messages]
        counter = MessageCounter()
        history: list[Message] = []
        ids: set[str] = set()
        tokens = 0
        for k, i in enumerate(session.calls):
            n = len(history)
            history += [from_dict(to_dict(m)) for m in session.messages[n:i]]
            started = time.perf_counter()
            new = history[n:]
            check_history(new, n)
            answered = answered_call_ids(new, ids)
            if answered:
                ids.update(answered)
            tokens += counter.count_many(new)
            sent = list(history)
            ms = (time.perf_counter() - started) * 1000
            assert len(sent) == i and tokens > 0
            judge.add(converted[:i], session.times[k], ms=ms)

    return run()


def _agentctx(kind: str, target_ratio: float | None = None) -> Callable[..., Any]:
    from agentctx.replay.jobs import DEFAULT_SUMMARIZER_DELAY, build_strategy

    def make(clock: Any) -> Any:
        return build_strategy(kind, clock, delay=DEFAULT_SUMMARIZER_DELAY)

    async def run(session: Session, judge: y.Judge, b: int) -> None:
        judge.overhead = y.recall_tool_tokens(judge.canon)
        done = await y.run_agentctx(
            session.messages,
            judge,
            make,
            b,
            target_ratio=target_ratio,
            recall=MemoryRecallStore(),
        )
        if kind == "llm":
            judge.result.notes.append(f"{done.splices} briefings spliced")

    return run


def _pai(build: Callable[[int, Any], Any]) -> Callable[..., Any]:
    async def run(session: Session, judge: y.Judge, b: int) -> None:
        await run_pai(session, judge, build, b)

    return run


Runner = Callable[[Session, y.Judge, int], Any]


def strategies(target_ratios: Sequence[float]) -> tuple[dict[str, Runner], list[str]]:
    """Every strategy that can run here, by name, and notes on those that cannot."""
    runners: dict[str, Runner] = {"none": _none}
    missing: list[str] = []
    try:
        for name, build in pai_strategies().items():
            runners[name] = _pai(build)
    except ImportError as e:
        missing.append(f"pai.*: pydantic-ai-harness is not importable ({e}); run scripts/bench")
    try:
        import langchain.agents.middleware  # noqa: F401
        import langgraph.graph.message  # noqa: F401

        runners["lc.ClearToolUsesEdit"] = run_lc_clear
        runners["lc.trim_messages(last)"] = run_lc_trim
        runners["lc.SummarizationMiddleware(offline summarizer)"] = run_lc_summarization
    except ImportError as e:
        missing.append(f"lc.*: langchain / langgraph are not importable ({e}); run scripts/bench")
    runners["agentctx.deterministic (default)"] = _agentctx("deterministic")
    runners["agentctx.pipeline+tiers"] = _agentctx("pipeline")
    runners["agentctx.llm (offline summarizer)"] = _agentctx("llm")
    for x in target_ratios:
        runners[f"agentctx.deterministic target_ratio={x:g}"] = _agentctx("deterministic", x)
    return runners, missing


def check_adapters(canon: y.Canon, session: Session, runners: dict[str, Runner]) -> None:
    """Both peers' round trips give back the canonical raw history byte for byte."""
    expected = y.merge(canon.neutral(m) for m in session.messages)
    if any(n.startswith("pai.") for n in runners):
        pai = PaiAdapter(canon)
        got = y.merge(pai.canonical(pai.to_pai(session.messages, 1)))
        assert got == expected, f"pydantic-ai round trip differs on {session.name}"
    if any(n.startswith("lc.") for n in runners):
        lc = LcAdapter(canon)
        got = y.merge(lc.canonical(lc.to_lc(session.messages, 0)))
        assert got == expected, f"LangChain round trip differs on {session.name}"


# -- the run ---------------------------------------------------------------------------------------


def _versions() -> str:
    names = ("pydantic-ai-harness", "pydantic-ai-slim", "langchain", "langchain-core", "langgraph")
    found = []
    for n in names:
        try:
            found.append(f"{n} {importlib.metadata.version(n)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{n} (not installed)")
    return ", ".join(found) + f", CPython {platform.python_version()}"


def _fmt_budget(b: int) -> str:
    return f"{b // 1000}k" if b % 1000 == 0 else str(b)


async def run_cell(
    canon: y.Canon,
    session: Session,
    b: int,
    runners: dict[str, Runner],
    selected: list[str],
) -> list[y.Result]:
    raw = raw_requests(canon, session)
    bound = y.minimum(canon, raw, b)
    started = time.perf_counter()
    title = f"#### {session.name}, B = {_fmt_budget(b)} ({len(session.calls)} requests)"
    print(title, "", bound.line() + ".", "", sep="\n", flush=True)
    results: list[y.Result] = []
    for name in selected:
        judge = y.Judge(canon, name, b, task=session.task, tools=session.tools)
        gc.collect()
        await runners[name](session, judge, b)
        results.append(judge.finish(session.paths))
    baseline = next((r for r in results if r.name == "none"), None)
    print(y.table(results, baseline))
    reasons: dict[str, list[str]] = {}
    for r in results:
        if r.first_invalid is not None:
            reasons.setdefault(r.first_invalid.split(": ", 1)[1], []).append(r.name)
    for reason, names in reasons.items():
        print(f"\nFirst invalid request of {', '.join(names)}: the validator says {reason!r}")
    print(f"\n(cell: {time.perf_counter() - started:.1f} s)\n", flush=True)
    return results


def select(runners: dict[str, Runner], wanted: str | None) -> list[str]:
    if not wanted:
        return list(runners)
    keys = [w.strip() for w in wanted.split(",") if w.strip()]
    chosen = [n for n in runners if n == "none" or any(n.startswith(k) for k in keys)]
    unknown = [k for k in keys if not any(n.startswith(k) for n in runners)]
    if unknown:
        raise SystemExit(
            f"no strategy starts with {', '.join(unknown)}; known: {', '.join(runners)}"
        )
    return chosen


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--cells",
        help="comma-separated NAME@BUDGET cells, e.g. pi/large-session@50k,cc/spotter-subagent@10k "
        "(default: the pi sessions at 100k and 50k and the Claude Code chains over 50k, at 50k)",
    )
    parser.add_argument(
        "--strategies",
        help="comma-separated name prefixes, e.g. pai.Sliding,agentctx (none always runs)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"only the small Claude Code cells ({', '.join(QUICK)}): a few seconds",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time what agentctx's no-decision call cannot leave out (validation, the "
        "repair check, quick estimates, the copy sent), as a row of its own",
    )
    parser.add_argument(
        "--target-ratio",
        default="",
        help="also run agentctx's deterministic strategy at these Budget.target_ratio values, "
        "e.g. 0.05,0.1,0.2,0.3",
    )
    args = parser.parse_args(argv)
    ratios = [float(x) for x in args.target_ratio.split(",") if x.strip()]
    started = time.perf_counter()
    canon = y.Canon()
    runners, missing = strategies(ratios)
    selected = select(runners, args.strategies)
    if args.floor:
        runners[FLOOR] = _floor
        selected.append(FLOOR)
    sessions = load_sessions()
    if args.cells:
        cells = [parse_cell(c.strip()) for c in args.cells.split(",") if c.strip()]
    elif args.quick:
        cells = [parse_cell(c) for c in QUICK]
    else:
        cells = default_cells(canon, sessions)
    for name, _ in cells:
        if name not in sessions:
            raise SystemExit(f"unknown session {name}; known: {', '.join(sessions)}")
    print(
        f"Tokens: o200k_base, {'exact' if canon.exact else 'ESTIMATED (no tokenizer extra)'}; "
        f"{_versions()}."
    )
    for note in missing:
        print(f"Not run: {note}")
    print()
    checked: set[str] = set()
    for name, b in cells:
        session = sessions[name]
        if name not in checked:
            check_adapters(canon, session, {n: runners[n] for n in selected})
            checked.add(name)
        anyio.run(run_cell, canon, session, b, runners, selected)
    print(f"Wall time: {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
