"""Lossless converters between provider API dicts and agentctx's neutral messages.

Pure functions over the plain dicts the SDKs take and return (``resp.to_dict()``); no
vendor SDK is imported. Each format has the same pieces: request messages both ways,
the message of a response, and the response a stream of event dicts amounts to.

- Anthropic Messages: `from_anthropic` / `to_anthropic`, `message_from_anthropic_response`,
  `assemble_anthropic_stream`.
- OpenAI Chat Completions: `from_openai_chat` / `to_openai_chat`,
  `message_from_openai_chat_response`, `assemble_openai_chat_stream`, and
  `split_openai_chat_system` to keep the system prompt out of the history.
- OpenAI Responses: `from_openai_responses` / `to_openai_responses`,
  `message_from_openai_response`, `assemble_openai_responses_stream`,
  `split_openai_responses_system`.

```python
from agentctx.adapters import from_anthropic, to_anthropic

view = await ctx.prepare(from_anthropic(params["messages"]))
params["messages"] = to_anthropic(view)
```

Round trips are exact: ``to_x(from_x(p)) == p`` for request messages, and
``from_x(to_x(h)) == h`` for histories the format can express. What agentctx does not model
rides in ``extra`` (block fields flat, message-level details under the format's key) or as
an `OpaqueBlock`; what cannot be carried raises `UnsupportedMessageError` naming the index.
Extras belong to the format they came from: convert a history between formats only after
dropping them.
"""

from __future__ import annotations

from agentctx.adapters.anthropic import (
    assemble_anthropic_stream,
    from_anthropic,
    message_from_anthropic_response,
    to_anthropic,
)
from agentctx.adapters.openai_chat import (
    assemble_openai_chat_stream,
    from_openai_chat,
    message_from_openai_chat_response,
    split_openai_chat_system,
    to_openai_chat,
)
from agentctx.adapters.openai_responses import (
    assemble_openai_responses_stream,
    from_openai_responses,
    message_from_openai_response,
    split_openai_responses_system,
    to_openai_responses,
)

__all__ = [
    "assemble_anthropic_stream",
    "assemble_openai_chat_stream",
    "assemble_openai_responses_stream",
    "from_anthropic",
    "from_openai_chat",
    "from_openai_responses",
    "message_from_anthropic_response",
    "message_from_openai_chat_response",
    "message_from_openai_response",
    "split_openai_chat_system",
    "split_openai_responses_system",
    "to_anthropic",
    "to_openai_chat",
    "to_openai_responses",
]
