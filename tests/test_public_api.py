"""The public surface is a contract: this test fails when it drifts."""

from __future__ import annotations

import subprocess
import sys

import agentctx

EXPECTED = {
    "AgentCtxError", "AssistantMessage", "Budget", "BudgetExceeded", "BudgetExceededError",
    "Chain", "CompactionContext", "CompactionStrategy", "ConfigError", "ContextCompacted",
    "ContextManager", "DeterministicCompaction", "Event", "HistoryResynced", "ImageBlock",
    "Ledger", "LedgerStore", "MemoryRecallStore", "SQLiteRecallStore", "ToolOutputPipeline",
    "RECALL_TOOL_NAME", "recall_tool", "LlmCompaction", "LlmCompactionConfig", "RetryPolicy",
    "Summarizer", "SummaryRequest", "SummaryResult", "SummarizerError", "SummaryRejected",
    "SummaryStale", "CompactionWarning", "Message", "MessageCounter", "OpaqueBlock", "RecallStore",
    "RedactedThinkingBlock", "StoreError", "SummaryMessage", "SummaryStats", "TextBlock",
    "ThinkingBlock", "TokenCounter", "ToolCall", "ToolResultMessage", "TranscriptFormatError",
    "TranscriptRepaired", "UnsupportedMessageError", "Usage", "UserMessage", "MissingExtraError",
    "StoreDataError", "StoreDegraded", "StoreRecovered", "__version__", "BlockingContextManager",
    "Quiet",
}  # fmt: skip


def test_all_is_sorted_complete_and_importable() -> None:
    assert list(agentctx.__all__) == sorted(agentctx.__all__)
    assert set(agentctx.__all__) == EXPECTED
    for name in agentctx.__all__:
        assert getattr(agentctx, name) is not None


def test_errors_share_one_root() -> None:
    for name in ("BudgetExceededError", "ConfigError", "StoreError", "StoreDataError",
                 "TranscriptFormatError",
                 "UnsupportedMessageError", "MissingExtraError"):  # fmt: skip
        assert issubclass(getattr(agentctx, name), agentctx.AgentCtxError)


def test_import_agentctx_imports_no_vendor_sdk() -> None:
    code = (
        "import sys, agentctx; "
        "bad = [m for m in ('anthropic', 'openai', 'tiktoken', 'httpx') if m in sys.modules]; "
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


async def test_a_manager_is_weakly_referenced_and_patched_as_a_plain_object_is() -> None:
    """Its attributes live in slots (for speed), and it still takes a weak reference and a
    method patched on the instance (``mock.patch.object``)."""
    import weakref
    from unittest import mock

    manager = agentctx.ContextManager(100_000)
    assert weakref.ref(manager)() is manager
    with mock.patch.object(manager, "prepare", return_value=[]) as prepare:
        assert await manager.prepare([]) == [] and prepare.await_count == 1
    assert "prepare" not in vars(manager)


def _raise_over_budget() -> None:
    """In a worker process: a session whose task alone is over its budget."""
    import anyio

    from agentctx import Budget, ContextManager, UserMessage

    async def main() -> None:
        budget = Budget(context_window=2_000, reserve_output=500)
        async with ContextManager(budget) as ctx:
            await ctx.prepare([UserMessage.of("word " * 5_000)])

    anyio.run(main)


def test_every_error_pickles_and_copies_with_its_attributes() -> None:
    """Found by a hostile run (AB, finding 1): five errors took constructor arguments their
    ``args`` do not hold, so pickling or copying one raised TypeError. Raised in a process
    pool's worker (an over-budget session), it broke the pool (`BrokenProcessPool`); with
    `multiprocessing.Pool` the parent waited forever."""
    import copy
    import multiprocessing
    import pickle
    from concurrent.futures import ProcessPoolExecutor

    from agentctx.errors import AgentCtxError
    from agentctx.replay.chart import ChartError

    made = [
        agentctx.BudgetExceededError(12, 10, [agentctx.UserMessage.of("task")], 3),
        agentctx.UnsupportedMessageError(4, "item of type int"),
        agentctx.TranscriptFormatError("s.jsonl", 7, "a JSON object"),
        agentctx.SummarizerError("overloaded", retryable=True, status=529, retry_after=2.0),
        agentctx.MissingExtraError("redis", "redis", needed_by="RedisRecallStore"),
        agentctx.ConfigError("bad"),
        agentctx.StoreError("down"),
        agentctx.StoreDataError("garbled"),
        ChartError("no matplotlib"),
    ]

    def kinds(cls: type) -> set[type]:
        return {cls}.union(*(kinds(sub) for sub in cls.__subclasses__()))

    ours = {k for k in kinds(AgentCtxError) if k.__module__.startswith("agentctx.")}
    assert {type(e) for e in made} | {AgentCtxError} == ours  # every one
    for error in made:
        for twin in (copy.copy(error), copy.deepcopy(error), pickle.loads(pickle.dumps(error))):
            assert type(twin) is type(error) and str(twin) == str(error)
            assert vars(twin) == vars(error)
    missing = pickle.loads(pickle.dumps(made[4]))  # ImportError's own fields (run AE, 10)
    assert (missing.name, missing.msg) == ("redis", made[4].msg) and missing.msg

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        raised = pool.submit(_raise_over_budget).exception(timeout=60)
    assert isinstance(raised, agentctx.BudgetExceededError)
    assert raised.view and raised.tokens > raised.budget
