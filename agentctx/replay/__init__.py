"""The replay product at the edge of the library: `agentctx replay`, its report and chart,
the demo, and the offline summarizer they use.

```python
from agentctx.importers import load_transcript
from agentctx.replay import replay

messages = load_transcript("session.jsonl").messages
report = await replay(messages, budget=Budget(100_000), strategy=DeterministicCompaction())
print(report.tokens_with, report.tokens_without, report.cache_breaks)
```

Nothing in the core imports this package.
"""

from agentctx.replay.engine import SONNET_PRICE, ReplayClock, ReplayReport, RequestRow, replay

__all__ = ["SONNET_PRICE", "ReplayClock", "ReplayReport", "RequestRow", "replay"]
