"""agentctx for the OpenAI Agents SDK: a ``call_model_input_filter`` that sends compacted views.

```python
from agents import Agent, RunConfig, Runner

from agentctx import Budget, ContextManager
from agentctx.integrations.openai_agents import AgentCtxInputFilter

async with ContextManager(Budget(context_window=400_000)) as ctx:  # one per conversation
    compaction = AgentCtxInputFilter(ctx)
    config = RunConfig(call_model_input_filter=compaction)
    result = await Runner.run(agent, task, run_config=config, hooks=compaction.hooks)
    result = await Runner.run(agent, result.to_input_list() + [{"role": "user", "content": more}],
                              run_config=config, hooks=compaction.hooks)
```

Before every model call the SDK hands the filter the run's whole input (the items you passed,
or your ``Session``'s history, and everything generated since) in Responses format. The filter
converts it with agentctx's Responses adapter (`from_openai_responses`), calls
``ctx.prepare`` and returns `to_openai_responses` of the view; leading system / developer
items are sent untouched, and so are the instructions, which the SDK keeps apart. The run's
own items (``result.to_input_list()``, the session) are never rewritten. ``hooks`` (a
``RunHooks``) gives each response's usage to ``ctx.observe``; pass it to ``Runner.run``, or
call `AgentCtxInputFilter.observe_response` from your own hooks' ``on_llm_end``. With a
recall store, add `recall_tool` (``recall_tool(ctx)``) to the agent's tools, so the model can
read back what compaction cleared.

The conversion is the Responses adapter's, lossless both ways: items that did not change go
out equal to what came in. Enter the manager around ``Runner.run`` / ``Runner.run_streamed``
on their event loop. Not for server-managed conversations (``previous_response_id``,
``conversation_id``): the filter then sees only the new items, and the server, not the input,
holds the history.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Literal, cast

from agentctx._usage import usage_of
from agentctx.adapters.openai_responses import (
    from_openai_responses,
    split_openai_responses_system,
    to_openai_responses,
)
from agentctx.errors import ConfigError, MissingExtraError
from agentctx.providers._native import check_native
from agentctx.recall.tool import recall_tool as agentctx_recall_tool

try:
    # Imported first, so that a missing framework is named as itself.
    import agents  # noqa: F401
    from agents import FunctionTool, RunHooks
    from agents.run_config import CallModelData, ModelInputData
except ImportError as exc:
    raise MissingExtraError("openai-agents", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from agents import Agent, ModelResponse, RunContextWrapper
    from agents.items import TResponseInputItem
    from agents.tool_context import ToolContext

    from agentctx.manager import ContextManager

__all__ = ["AgentCtxInputFilter", "AgentCtxRunHooks", "recall_tool"]


def recall_tool(manager: ContextManager) -> FunctionTool:
    """The ``recall_context`` tool, answered by ``manager.handle_recall`` (bounded pages,
    and an explanation for arguments it cannot use): add it to the agent's ``tools`` when the
    manager has a recall store, so the model can read back what compaction cleared."""
    spec = agentctx_recall_tool("openai-responses")

    async def invoke(context: ToolContext[Any], arguments: str) -> str:
        try:
            parsed: object = json.loads(arguments)
        except (ValueError, RecursionError):  # the model's text, not JSON: it is told so
            parsed = arguments
        return await manager.handle_recall(parsed)

    return FunctionTool(
        name=spec["name"],
        description=spec["description"],
        params_json_schema=spec["parameters"],
        on_invoke_tool=invoke,
        strict_json_schema=False,  # its arguments are optional but ``id``
    )


def _observe(manager: ContextManager, response: ModelResponse) -> None:
    # The SDK counts cache reads and writes inside input_tokens, as the Responses API does.
    usage = usage_of(response.usage)
    if usage is not None and usage.prompt_tokens > 0:
        manager.observe(usage)


class AgentCtxRunHooks(RunHooks[Any]):
    """``RunHooks`` that give every model response's usage to ``manager.observe``."""

    def __init__(self, manager: ContextManager) -> None:
        self.manager = manager

    async def on_llm_end(
        self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse
    ) -> None:
        """Record the response's usage."""
        _observe(self.manager, response)


# The input is Responses items whatever the model; what reaches the API depends on the model
# the run resolves (the agent's, or its RunConfig's model or model provider, which the filter
# cannot see): the SDK converts the items for Chat Completions (and LiteLLM), where a
# compaction item cannot go.
_APIS = {"responses": ("openai-responses",), "chat": ("openai-chat",)}


def _check(manager: ContextManager, api: str | None) -> None:
    """`check_native` for the run's API; not said, for what every model can carry."""
    if api is not None:
        check_native(manager, _APIS[api])
        return
    check_native(manager, _APIS["responses"])  # what no model of the SDK can carry
    try:
        check_native(manager, _APIS["chat"])
    except ConfigError as e:
        raise ConfigError(
            f"{e}. Under the Agents SDK, a RunConfig picks the model out of the filter's "
            "sight: pass AgentCtxInputFilter(ctx, api='responses') if every model of the run "
            "sends Responses items"
        ) from None


class AgentCtxInputFilter:
    """A ``call_model_input_filter`` sending ``manager``'s compacted view of the run's input.

    ``RunConfig(call_model_input_filter=AgentCtxInputFilter(ctx))``; one manager per
    conversation, entered (``async with``) around its runs. Pass `hooks` to ``Runner.run`` so
    the responses' usage calibrates the manager's token accounting.

    ``api`` is what the run's models send, ``"responses"`` or ``"chat"`` (Chat Completions,
    LiteLLM), when you know it: the filter cannot see which model a ``RunConfig`` resolves. A
    ``manager`` compacting with a native compaction that API cannot carry back is refused with
    `ConfigError` when the filter is made, and on the first call after its strategy is
    replaced: Anthropic's always, OpenAI's (Responses items) unless ``api="responses"``.
    """

    def __init__(
        self, manager: ContextManager, *, api: Literal["responses", "chat"] | None = None
    ) -> None:
        if api not in (None, "responses", "chat"):
            raise ConfigError(f"api must be 'responses', 'chat' or None, not {api!r}")
        _check(manager, api)
        self.manager = manager
        self.hooks = AgentCtxRunHooks(manager)
        self._api = api
        self._checked: object = manager.strategy  # the strategy last found to fit

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        """The model input with its items replaced by the compacted view."""
        if self.manager.strategy is not self._checked:  # replaced since
            _check(self.manager, self._api)
            self._checked = self.manager.strategy
        items = data.model_data.input
        front, history = split_openai_responses_system(items)
        view = await self.manager.prepare(from_openai_responses(history))
        # The adapter's dicts are the SDK's input item TypedDicts, built from the same keys.
        compacted = cast("list[TResponseInputItem]", to_openai_responses(view))
        sent = cast("list[TResponseInputItem]", front) + compacted
        return ModelInputData(input=sent, instructions=data.model_data.instructions)

    def observe_response(self, response: ModelResponse) -> None:
        """Record a response's usage (what `hooks` does), for hooks of your own."""
        _observe(self.manager, response)
