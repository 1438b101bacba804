"""Images in tool results under the built-in strategies (hostile run DN, findings 1-3).

Recall holds text, so an image is never stored: the passes and tier 1 replace a result's
text and leave its images where they are; its turn condensed or dropped takes them with it;
and, when the budget cannot be met otherwise, images of tool results give way last, oldest
first, each for a line naming its media type and size.
"""

from __future__ import annotations

import re

import pytest

from agentctx import (
    Budget,
    BudgetExceededError,
    ContextCompacted,
    ContextManager,
    DeterministicCompaction,
    MemoryRecallStore,
    ToolOutputPipeline,
    Usage,
)
from agentctx.events import Event
from agentctx.ledger import Ledger, ReplaceResult, anchor, render
from agentctx.messages import (
    AssistantMessage,
    ImageBlock,
    Message,
    TextBlock,
    ThinkingBlock,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    text_of,
)
from agentctx.strategies.pipeline import CondensePass, MicroCompact
from agentctx.strategies.trail import span_text
from agentctx.testing import check_view

from .helpers import png
from .test_give_way import _strategy

RECALL_ID = re.compile(r"ctx-[0-9a-f]{16}")
OMITTED = re.compile(r"\[image \(image/png, \d+ KB\) omitted to fit the context\]")


def _shot(seed: int, width: int = 1400, height: int = 1000) -> ImageBlock:
    # The header sets the size the estimate reads; the padding makes each image distinct.
    return ImageBlock("image/png", png(width, height) + "A" * (4 * seed))


def _images(view: list[Message]) -> list[ImageBlock]:
    return [
        block
        for m in view
        if isinstance(m, ToolResultMessage)
        for block in m.content
        if isinstance(block, ImageBlock)
    ]


def _blocks(m: Message) -> list[str]:
    """A result's blocks as ``text:<start>`` or ``image``."""
    assert isinstance(m, ToolResultMessage)
    return [f"text:{b.text[:12]}" if isinstance(b, TextBlock) else b.type for b in m.content]


@pytest.mark.parametrize("kind", ["deterministic", "pipeline", "chain"])
async def test_images_of_the_newest_step_give_way_when_nothing_else_can(kind: str) -> None:
    """Found by a hostile run (DN, finding 1): the task, one call, one result of 40
    screenshots (about 61,000 tokens) with a budget of 36,000: every strategy raised
    BudgetExceededError with 9 tokens protected, since no tier removed an image from a
    result. The oldest images now give way, each for a line naming it, as many as landing
    at the trigger needs and no more (to the hard budget only, each next step would rewrite
    the cached prefix for one image: a re-run, DO 3); the newest stay."""
    budget = Budget(context_window=40_000, reserve_output=4_000)
    shots = tuple(_shot(k) for k in range(40))
    raw: list[Message] = [
        UserMessage.of("task: compare the pages"),
        AssistantMessage((ToolCall("c1", "screenshot_all", {}),), "tool_use"),
        ToolResultMessage("c1", shots, "screenshot_all"),
    ]
    async with ContextManager(budget, strategy=_strategy(kind), recall=MemoryRecallStore()) as ctx:
        view = list(await ctx.prepare(raw))
        assert check_view(view, raw) == []
        assert ctx.prompt_tokens <= budget.limit
        shown = view[-1]
        assert isinstance(shown, ToolResultMessage)
        kept = [b for b in shown.content if isinstance(b, ImageBlock)]
        assert 0 < len(kept) < 40
        assert tuple(kept) == shots[40 - len(kept) :]  # the oldest went, the newest stay
        markers = [b.text for b in shown.content if isinstance(b, TextBlock)]
        assert len(markers) == 40 - len(kept)
        assert all(OMITTED.fullmatch(t) for t in markers)
        assert not any(RECALL_ID.search(t) for t in markers)  # an image is not recallable
        # As many as landing at the trigger needs: one image fewer left out would not.
        per_image = ctx.counter.count_full(ToolResultMessage("c1", (shots[0],)))
        assert ctx.prompt_tokens <= budget.trigger_tokens
        assert ctx.prompt_tokens + per_image > budget.trigger_tokens
        # A later call keeps the same view (the decision is sticky).
        again = list(await ctx.prepare(raw))
        assert again == view


async def test_images_of_the_newest_complete_turn_give_way_oldest_first() -> None:
    """Images in the newest complete turn's results (protected as a turn, its results may be
    cut down) give way too, the oldest first, before those of the running tool loop."""
    budget = Budget(context_window=20_000, reserve_output=2_000)
    raw: list[Message] = [UserMessage.of("task: look at the pages")]
    for k in range(6):
        raw += [
            AssistantMessage((ToolCall(f"a{k}", "screenshot", {"url": f"/p{k}"}),), "tool_use"),
            ToolResultMessage(f"a{k}", (TextBlock(f"page {k}"), _shot(k), _shot(k + 10))),
        ]
    raw += [AssistantMessage.of("they differ"), UserMessage.of("and now?")]
    raw += [
        AssistantMessage((ToolCall("b0", "screenshot", {"url": "/q"}),), "tool_use"),
        ToolResultMessage("b0", (TextBlock("page q"), _shot(30), _shot(31), _shot(32))),
    ]
    async with ContextManager(budget, strategy=DeterministicCompaction()) as ctx:
        view = list(await ctx.prepare(raw))
    assert check_view(view, raw) == []
    assert ctx.prompt_tokens <= budget.limit
    results = [m for m in view if isinstance(m, ToolResultMessage)]
    pictured = [sum(isinstance(b, ImageBlock) for b in m.content) for m in results]
    # Left out from the oldest on: counts rise to the newest result's 3, never fall.
    assert pictured == sorted(pictured) and pictured[-1] == 3 and pictured[0] < 2


async def test_images_give_way_only_when_the_budget_cannot_be_met_otherwise() -> None:
    """An old turn's images go with the turn (condensed or dropped, recallable as text);
    no image of a result is left out while the budget is met without it."""
    budget = Budget(context_window=24_000, reserve_output=2_000)
    raw: list[Message] = [UserMessage.of("task: look at the pages")]
    for k in range(20):
        raw += [
            AssistantMessage((ToolCall(f"a{k}", "screenshot", {"url": f"/p{k}"}),), "tool_use"),
            ToolResultMessage(f"a{k}", (TextBlock(f"page {k}"), _shot(k))),
            AssistantMessage.of(f"page {k} seen"),
            UserMessage.of(f"next {k}"),
        ]
    async with ContextManager(budget, strategy=DeterministicCompaction()) as ctx:
        view = list(await ctx.prepare(raw))
    assert check_view(view, raw) == []
    assert ctx.prompt_tokens <= budget.target_tokens * 11 // 10 + 64
    assert not any(OMITTED.search(text_of(m.content)) for m in view if hasattr(m, "content"))
    assert len(_images(view)) < 20  # old turns went, their images with them


async def test_the_budget_exceeded_error_still_comes_when_the_protected_part_is_over() -> None:
    """Images of the user's own messages (the task) are protected: when they alone are
    over the budget, the error still says so, with every result's image left out."""
    budget = Budget(context_window=5_000, reserve_output=1_000)
    raw: list[Message] = [
        UserMessage((TextBlock("task: compare"), *(_shot(k) for k in range(4)))),
        AssistantMessage((ToolCall("c1", "screenshot", {}),), "tool_use"),
        ToolResultMessage("c1", (_shot(9),), "screenshot"),
    ]
    async with ContextManager(budget, strategy=DeterministicCompaction()) as ctx:
        with pytest.raises(BudgetExceededError) as caught:
            await ctx.prepare(raw)
    view = list(caught.value.view)
    assert check_view(view, raw) == []
    assert _images(view) == []


async def test_a_result_cut_again_keeps_its_images_left_out() -> None:
    """Giving way on a later call cuts results again from their originals: one whose
    images gave way keeps them left out (they do not come back, to be left out once more,
    the cache broken twice for it), and the order of its blocks."""
    budget = Budget(context_window=14_000, reserve_output=2_000)
    page = "\n".join(f"node {n}: button 'Go' at ({n}, {n * 3})" for n in range(3000))
    shots = tuple(_shot(k) for k in range(12))
    raw: list[Message] = [
        UserMessage.of("task: find the button"),
        AssistantMessage((ToolCall("c1", "inspect", {"url": "/"}),), "tool_use"),
        ToolResultMessage("c1", (TextBlock(page), *shots), "inspect"),
    ]
    store = MemoryRecallStore()
    async with ContextManager(budget, strategy=DeterministicCompaction(), recall=store) as ctx:
        view = list(await ctx.prepare(raw))
        assert check_view(view, raw) == []
        first = view[-1]
        assert isinstance(first, ToolResultMessage)
        left = sum(isinstance(b, ImageBlock) for b in first.content)
        assert 0 < left < 12
        taken = len(ctx.ledger.decisions_at(2))
        # The turn completes (its result is now the newest complete turn's: cut, never
        # dropped) and the next one brings more output than the budget holds.
        raw += [AssistantMessage.of("found it"), UserMessage.of("and on /b?")]
        raw += [
            AssistantMessage((ToolCall("c2", "inspect", {"url": "/b"}),), "tool_use"),
            ToolResultMessage("c2", (TextBlock(page.replace("Go", "Stop")), _shot(50)), "inspect"),
        ]
        later = list(await ctx.prepare(raw))
        assert check_view(later, raw) == []
        assert ctx.prompt_tokens <= budget.limit
        for decision in ctx.ledger.decisions_at(2)[taken:]:
            assert isinstance(decision, ReplaceResult)
            assert sum(isinstance(b, ImageBlock) for b in decision.content) < left
        shown = later[2]
        assert isinstance(shown, ToolResultMessage)
        blocks = _blocks(shown)
        assert blocks[0].startswith("text:node 0")
        assert blocks[1:] == sorted(blocks[1:], key=lambda b: b == "image")  # markers first
        assert all(OMITTED.fullmatch(b.text) for b in shown.content[1:] if isinstance(b, TextBlock))
        # Once more with nothing new: nothing is taken again.
        decisions = len(ctx.ledger)
        assert list(await ctx.prepare(raw)) == later
        assert len(ctx.ledger) == decisions


@pytest.mark.parametrize("kind", ["pipeline", "chain"])
async def test_an_idle_gap_leaves_image_only_results_as_they_are(kind: str) -> None:
    """Found by a hostile run (DN, finding 2): after an idle gap, micro-compact rewrote 25
    screenshot results holding only an image to "[Old tool result expired: screenshot() ->
    1 lines, 0 chars. Use recall_context(id=...) to read it.]" beside the image it still
    sent: the prompt grew (32,479 -> 33,451 tokens, reported as a compaction) and the recall
    id named an empty entry. Only a result's text expires; a result with none is left as it
    is."""
    now = [1_000_000.0]
    raw: list[Message] = [UserMessage.of("task")]
    for k in range(30):
        raw += [
            AssistantMessage((ToolCall(f"c{k}", "screenshot", {}),), "tool_use"),
            ToolResultMessage(f"c{k}", (_shot(k, 1000, 800),), "screenshot"),
        ]
    events: list[Event] = []
    budget = Budget(context_window=60_000, reserve_output=2_000)
    async with ContextManager(
        budget, strategy=_strategy(kind), recall=MemoryRecallStore(), clock=lambda: now[0]
    ) as ctx:
        ctx.subscribe(events.append)
        await ctx.prepare(raw)
        before = ctx.prompt_tokens
        now[0] += 7200
        raw += [AssistantMessage.of("done"), UserMessage.of("next question")]
        view = list(await ctx.prepare(raw))
        assert check_view(view, raw) == []
        assert ctx.prompt_tokens <= before + 64  # the two new messages
    for m in view:
        if isinstance(m, ToolResultMessage):
            assert _blocks(m) == ["image"]
    for e in events:
        if isinstance(e, ContextCompacted):
            assert e.tokens_after < e.tokens_before, e


async def test_an_expired_result_beside_an_image_says_only_its_text_expired() -> None:
    """A result of text and an image keeps its image when its text expires (the image is
    not recallable): the placeholder says the text expired and the image is kept, and its
    recall id reads the text."""
    now = [1_000_000.0]
    raw: list[Message] = [UserMessage.of("task")]
    for k in range(8):
        text = "\n".join(f"row {k}.{n}" for n in range(200))
        raw += [
            AssistantMessage((ToolCall(f"c{k}", "screenshot", {"url": f"/p{k}"}),), "tool_use"),
            ToolResultMessage(f"c{k}", (_shot(k, 800, 600), TextBlock(text)), "screenshot"),
        ]
    store = MemoryRecallStore()
    only_mc = ToolOutputPipeline(budget=None, l0=None, l1=None, l2=None, mc=MicroCompact())
    budget = Budget(context_window=60_000, reserve_output=2_000)
    async with ContextManager(budget, strategy=only_mc, recall=store, clock=lambda: now[0]) as ctx:
        await ctx.prepare(raw)
        now[0] += 7200
        raw += [AssistantMessage.of("done"), UserMessage.of("next question")]
        view = list(await ctx.prepare(raw))
        assert check_view(view, raw) == []
        shown = view[2]
        assert isinstance(shown, ToolResultMessage) and shown is not raw[2]
        assert _blocks(shown) == ["image", "text:[Old tool re"]  # in its order
        placeholder = text_of(shown.content)
        assert "result's text expired" in placeholder and "its image kept" in placeholder
        rid = RECALL_ID.search(placeholder)
        assert rid is not None
        page = await ctx.handle_recall({"id": rid.group()})
        assert "row 0.0" in page and "row 0.199" in page


async def test_a_cut_keeps_the_order_of_text_and_images() -> None:
    """Found by a hostile run (DN, finding 8): a result ``[caption, screenshot, long
    accessibility tree]`` cut to head and tail came back as ``[caption and tree merged,
    screenshot]``. Each text block now keeps its part where it stood."""
    budget = Budget(context_window=20_000, reserve_output=2_000)
    raw: list[Message] = [UserMessage.of("task")]
    for k in range(8):
        tree = "Accessibility tree:\n" + "node\n" * 4000
        raw += [
            AssistantMessage((ToolCall(f"c{k}", "browse", {"url": f"/p{k}"}),), "tool_use"),
            ToolResultMessage(
                f"c{k}", (TextBlock("Screenshot of the page:"), _shot(k, 800, 600), TextBlock(tree))
            ),
        ]
    for kind in ("deterministic", "pipeline"):
        async with ContextManager(
            budget, strategy=_strategy(kind), recall=MemoryRecallStore(), on_over_budget="send"
        ) as ctx:
            view = list(await ctx.prepare(raw))
        assert check_view(view, raw) == []
        cut = [m for m in view if isinstance(m, ToolResultMessage) and m not in raw]
        assert cut
        for m in cut:
            assert _blocks(m) == ["text:Screenshot o", "image", "text:Accessibilit"], kind
            assert "truncated" in text_of(m.content)


async def test_condensing_text_beside_an_image_keeps_their_order() -> None:
    """Found by a hostile run (DN, finding 3): the pipeline put its replacement text first,
    so a result ``(image, text)`` became ``(text, image)`` once condensed (or expired, or
    persisted). It now stands where the result's text did."""
    text = "\n".join(f"def f{n}(): return {n}" for n in range(600))
    raw: list[Message] = [UserMessage.of("task 1")]
    raw += [
        AssistantMessage((ToolCall("c1", "screenshot", {}),), "tool_use"),
        ToolResultMessage("c1", (_shot(1, 800, 600), TextBlock(text)), "screenshot"),
        AssistantMessage.of("seen"),
        UserMessage.of("task 2"),
        AssistantMessage.of("ok"),
        UserMessage.of("task 3"),
    ]
    l1_only = ToolOutputPipeline(
        mc=None, budget=None, l0=None, l2=None, l1=CondensePass(protect_recent_turns=1)
    )
    budget = Budget(context_window=60_000, reserve_output=2_000)
    async with ContextManager(budget, strategy=l1_only, recall=MemoryRecallStore()) as ctx:
        view = list(await ctx.prepare(raw))
    assert check_view(view, raw) == []
    assert _blocks(view[2]) == ["image", "text:[Condensed ("]


def test_a_span_entry_names_the_image_of_a_result_stored_by_reference() -> None:
    """Found by a hostile run (DN, finding 3): a span's recall entry said ``[image
    omitted]`` for a result stored raw, and nothing for one whose text was cleared with a
    recall id (stored as a reference to that id). Both now name it, in its place."""
    raw: list[Message] = [
        UserMessage.of("task"),
        AssistantMessage((ToolCall("c1", "screenshot", {}), ToolCall("c2", "screenshot", {}))),
        ToolResultMessage("c1", (_shot(1), TextBlock("one " * 50)), "screenshot"),
        ToolResultMessage("c2", (_shot(2), TextBlock("two " * 50)), "screenshot"),
        AssistantMessage.of("done"),
    ]
    ledger = Ledger()
    rid = "ctx-" + "1" * 16
    placeholder = (_shot(1), TextBlock(f'[expired. recall_context(id="{rid}")]'))
    ledger.add(ReplaceResult(anchor(raw, 2), placeholder, "l0", rid), raw)
    rendered = render(raw, ledger)
    entry = span_text(rendered.messages, rendered.origins, raw, 1, 5, ledger)
    lines = entry.split("\n")
    by_reference = lines.index(f"[tool result: screenshot] {{{{recall:{rid}}}}}")
    assert lines[by_reference - 1] == "[tool result: screenshot] [image omitted]"
    stored_raw = next(k for k, line in enumerate(lines) if "two two" in line)
    assert lines[stored_raw - 1] == "[tool result: screenshot] [image omitted]"


@pytest.mark.parametrize("kind", ["deterministic", "pipeline"])
async def test_a_screenshot_loop_whose_images_give_way_keeps_its_cache_most_calls(
    kind: str,
) -> None:
    """Found by a re-run (DO 3): in a tool loop still running (signed thinking: its steps
    cannot go) with a screenshot a step, images gave way down to the hard budget only, so
    each next step crossed it again and rewrote the cached prefix for one image: 62 of 80
    calls. They now go down to the trigger: 12 of 80."""
    raw: list[Message] = [UserMessage.of("task: click through")]
    previous: list[Message] | None = None
    rewrites = 0
    budget = Budget(context_window=30_000, reserve_output=2_000)
    async with ContextManager(budget, strategy=_strategy(kind)) as ctx:
        for s in range(80):
            call = ToolCall(f"c{s}", "shot", {"s": s})
            raw.append(AssistantMessage((ThinkingBlock(f"step {s}", signature=f"sig{s}"), call)))
            raw.append(ToolResultMessage(f"c{s}", (TextBlock(f"ok {s}"), _shot(s)), "shot"))
            view = list(await ctx.prepare(raw))
            assert check_view(view, raw) == []
            assert ctx.prompt_tokens <= budget.limit
            if previous is not None and view[: len(previous)] != previous:
                rewrites += 1
            previous = view
            ctx.observe(Usage(input_tokens=ctx.prompt_tokens, output_tokens=10))
    assert rewrites <= 16
