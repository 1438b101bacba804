"""Client wrappers: compaction for an existing `anthropic` or `openai` SDK loop in one line.

```python
from agentctx.providers.anthropic import wrap

client = wrap(anthropic.AsyncAnthropic(), manager)
resp = await client.messages.create(model=..., max_tokens=..., messages=history)
```

The caller keeps its full history in the SDK's own format and passes all of it on every call
(projection mode); the wrapper sends the compacted view, records the usage of each response
(streamed ones too) and returns the SDK's own objects. Every SDK method that carries the
history is covered (``create``, ``stream``, ``parse``, token counts, Anthropic's tool runner)
or refused with `ConfigError` (batches, raw responses, ...); every other argument and
attribute passes through untouched. Importing this package imports no vendor SDK; each
submodule imports its own.
"""
