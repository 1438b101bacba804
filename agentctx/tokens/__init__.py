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
`estimate` (`Estimator`: tokens without a tokenizer, as fast as tiktoken's o200k encoder on
short texts and faster on longer ones, uncalibrated within about 3.5 % of it on most content;
`default_estimator`, what `MessageCounter()` uses, counts texts of up to `EXACT_BELOW`
characters exactly when tiktoken is installed), `calibrate` (fitting the provider's real
tokenizer and the hidden system-prompt-plus-tools overhead from reported usage), `count`
(`MessageCounter`: per-message memo, quick then full estimates). For exact OpenAI counts of
everything use `agentctx.tokens.exact.ExactCounter` (the ``tokenizer`` extra).
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
