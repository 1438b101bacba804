"""Token accounting: a content-aware estimator and a calibrating, memoizing message counter.

```python
from agentctx.tokens import MessageCounter

counter = MessageCounter()                      # wraps default_estimator(); tiktoken lazily
before = counter.estimate_prompt(view)          # before the first request: pure estimate
response = call_model(view)
counter.observe(view, response.usage.prompt_tokens)   # fit overhead + per-class multipliers
history = [*view, response_message, *tool_results]
size = counter.context_tokens(history)          # reported size + estimate of what came after
```

The jobs, one module each: `classify` (what a text is: code, JSON, shell, prose, log),
`estimate` (`Estimator`: tokens without a tokenizer, faster than tiktoken's o200k encoder past
a few hundred characters and about 0.7x its speed on the shortest texts; uncalibrated, within
about 4 % median of it on the agent transcripts of `tests/corpus` (code, JSON, shell output,
English prose), further off on what they hold little of: prose in other languages (Polish,
German: 10-30 % low), other scripts, DNA sequences, box drawing (up to 3x low). A text past
16 K characters is estimated from 16 windows of 1 K (past 64 K even when they disagree), so
what differs between them is not seen. One usage report calibrates it; `ExactCounter`
counts exactly. `default_estimator`, what `MessageCounter()` uses, counts texts of up to
`EXACT_BELOW` characters exactly when tiktoken is installed), `calibrate` (fitting the
provider's real tokenizer and the hidden system-prompt-plus-tools overhead from reported
usage), `count` (`MessageCounter`: per-message memo, quick then full estimates). For exact
OpenAI counts of everything use `agentctx.tokens.exact.ExactCounter` (the ``tokenizer``
extra).
"""

from agentctx.tokens.calibrate import Calibration
from agentctx.tokens.classify import ContentClass, classify
from agentctx.tokens.count import MessageCounter
from agentctx.tokens.estimate import (
    EXACT_BELOW,
    UNKNOWN_IMAGE_TOKENS,
    Estimator,
    FeatureCounter,
    TokenCounter,
    default_estimator,
    image_tokens,
)

__all__ = [
    "EXACT_BELOW",
    "UNKNOWN_IMAGE_TOKENS",
    "Calibration",
    "ContentClass",
    "Estimator",
    "FeatureCounter",
    "MessageCounter",
    "TokenCounter",
    "classify",
    "default_estimator",
    "image_tokens",
]
