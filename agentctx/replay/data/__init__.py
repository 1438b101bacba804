"""Data that ships with agentctx: one real transcript for the offline demo and replay.

```python
from agentctx.replay.data import DEMO_TRANSCRIPT
from agentctx.importers import load_transcript

transcript = load_transcript(DEMO_TRANSCRIPT)
```

`DEMO_TRANSCRIPT` is a Claude Code subagent session (12 model calls, 33 tool calls, up to 9 in
parallel, seven tool outputs over 10k characters). Its source and licence are in the
``README.md`` beside it.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DEMO_TRANSCRIPT"]

# A plain path next to this file: the wheel installs package data unzipped, and an editable
# install points here directly, so no importlib.resources extraction is needed.
DEMO_TRANSCRIPT: Path = Path(__file__).resolve().parent / "spotter-4d5611e5-agent-a2898e3.jsonl"
