"""agentctx inside the agent frameworks: each module hooks a `ContextManager` into one of them.

- `agentctx.integrations.pydantic_ai`: `AgentCtxCapability`, a pydantic-ai capability
  (extra ``pydantic-ai``); `from_pydantic_ai` / `to_pydantic_ai` convert its messages.
- `agentctx.integrations.langchain`: `AgentCtxMiddleware` for ``langchain.agents.create_agent``
  (extra ``langchain``); `from_langchain` / `to_langchain` convert its messages, and
  `context_manager` reads ``trigger`` / ``keep`` as its ``SummarizationMiddleware`` does.
- `agentctx.integrations.openai_agents`: `AgentCtxInputFilter`, a ``call_model_input_filter``
  for the OpenAI Agents SDK's ``RunConfig`` (extra ``openai-agents``).
- `agentctx.integrations.otel`: `OtelTracer`, OpenTelemetry spans for compaction and
  summarizer requests (extra ``otel``); it is not a framework hook: pass it as
  ``ContextManager(..., tracer=OtelTracer())``.

The three framework hooks work the same way. You enter ``async with ContextManager(...)`` once
per agent session (one conversation) and hand the manager to the hook; the framework keeps its
whole history as always, and before every model call the hook converts that history to
agentctx's neutral messages, calls ``manager.prepare`` on all of it (projection mode) and sends
the compacted view, converted back, instead. Messages the view leaves untouched go out as the
framework's own objects, so what agentctx does not model is never lost and the prefix stays
byte-stable between calls. After each call the hook gives the response's usage to
``manager.observe``. Only the frameworks' async paths are supported (the manager lives on your
event loop).

This package imports nothing; import the module of your framework.
"""
