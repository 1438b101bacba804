"""Where cleared content goes, so the agent can fetch it back by id.

Every placeholder a strategy leaves names a recall id; `ContextManager.recall` and the
``recall_context`` tool (`recall_tool`, `ContextManager.handle_recall`) give the original
back, in pages or by pattern.

```python
store = SQLiteRecallStore("agent.db")          # durable; also keeps each session's ledger
async with ContextManager(budget, recall=store, session_id="run-42") as ctx:
    tools = [*my_tools, recall_tool("anthropic")]
```

Stores: `MemoryRecallStore` (bounded by bytes, the default), `SQLiteRecallStore` (one file,
survives a restart), `agentctx.recall.redis.RedisRecallStore` (many workers; the ``redis``
extra). Your own store implements `RecallStore` (and `LedgerStore` to resume sessions,
`AppendingLedgerStore` to save a ledger a decision at a time, `SessionStateStore` to resume
its calibration and timing too).
"""

from typing import TYPE_CHECKING

from agentctx._lazy import lazy_attributes
from agentctx.recall.store import (
    AppendingLedgerStore,
    LedgerStore,
    MemoryRecallStore,
    RecallStore,
    SessionStateStore,
    recall_id,
)
from agentctx.recall.tool import RECALL_TOOL_NAME, recall_arguments, recall_page, recall_tool

if TYPE_CHECKING:
    from agentctx.recall.sqlite import SQLiteRecallStore


# SQLite (and the sqlite3 module) is imported on first use: most sessions never open it.
__getattr__, __dir__ = lazy_attributes(
    __name__, {"SQLiteRecallStore": "agentctx.recall.sqlite"}, globals()
)

__all__ = [
    "RECALL_TOOL_NAME",
    "AppendingLedgerStore",
    "LedgerStore",
    "MemoryRecallStore",
    "RecallStore",
    "SQLiteRecallStore",
    "SessionStateStore",
    "recall_arguments",
    "recall_id",
    "recall_page",
    "recall_tool",
]
