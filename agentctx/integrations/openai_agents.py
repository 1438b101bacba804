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

A prompt the provider still refuses as longer than its context window (the estimate fell
short) fails the run, as the SDK's own retries send the same input again. Wrap the model to
have it sent once more, compacted to fit: ``Agent(model=compaction.wrap(model))`` for a
``Model``, or ``RunConfig(model_provider=compaction.wrap(MultiProvider()))`` for models named by
string (`AgentCtxInputFilter.wrap`).

The conversion is the Responses adapter's, lossless both ways: items that did not change go
out equal to what came in. Enter the manager around ``Runner.run`` / ``Runner.run_streamed``
on their event loop. Not for server-managed conversations (``previous_response_id``,
``conversation_id``): the filter then sees only the new items, and the server, not the input,
holds the history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast, overload

from agentctx._overflow import overflow_of
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
    from agents import FunctionTool, Model, ModelProvider, RunHooks
    from agents.run_config import CallModelData, ModelInputData
except ImportError as exc:
    raise MissingExtraError("openai-agents", exc.name, needed_by=__name__) from exc

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from agents import Agent, ModelResponse, RunContextWrapper
    from agents.items import TResponseInputItem
    from agents.tool_context import ToolContext

    from agentctx.manager import ContextManager
    from agentctx.messages import Message

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
        self._sent: _Made | None = None  # the last input made (`wrap`)
        # The refused input and what was sent in its place: a retry of the SDK's own (a 500
        # after the resend) asks with the refused one again.
        self._resent: tuple[object, list[Any]] | None = None

    async def __call__(self, data: CallModelData[Any]) -> ModelInputData:
        """The model input with its items replaced by the compacted view."""
        if self.manager.strategy is not self._checked:  # replaced since
            _check(self.manager, self._api)
            self._checked = self.manager.strategy
        items = data.model_data.input
        front, history = split_openai_responses_system(items)
        neutral = from_openai_responses(history)
        view = await self.manager.prepare(neutral)
        # The adapter's dicts are the SDK's input item TypedDicts, built from the same keys.
        compacted = cast("list[TResponseInputItem]", to_openai_responses(view))
        sent = cast("list[TResponseInputItem]", front) + compacted
        self._sent, self._resent = _Made(sent, neutral, view, front), None
        return ModelInputData(input=sent, instructions=data.model_data.instructions)

    @overload
    def wrap(self, model: Model) -> Model: ...

    @overload
    def wrap(self, model: ModelProvider) -> ModelProvider: ...

    def wrap(self, model: Model | ModelProvider) -> Model | ModelProvider:
        """``model`` (a ``Model``, or a ``ModelProvider`` whose models are wrapped) sending a
        prompt the provider refuses as longer than its context window once more, compacted to
        fit: the manager observes the refusal (its counts calibrate on the provider's count)
        and prepares the run's input again.

        The error is raised as it came when compacting changes nothing, when the retry is
        refused too, for a stream that gave events, for an input other than the last this
        filter made (another run's, on a filter two runs share), and for any other error;
        `BudgetExceededError` (the refusal as its ``__context__``) when the history cannot be
        compacted to the provider's count."""
        if isinstance(model, ModelProvider):
            return _RefittingProvider(model, self)
        if isinstance(model, Model):
            return _Refitting(model, self)
        raise ConfigError(
            f"wrap takes an agents Model or ModelProvider, not {type(model).__name__}"
        )

    def _to_send(self, items: object) -> object:
        """What to send for ``items``: the input sent in its place, when it was refused."""
        resent = self._resent
        if resent is not None and (items is resent[0] or items == resent[0]):
            return resent[1]
        return items

    async def _refit(self, items: Any, error: Exception) -> list[Any] | None:
        """The input to send again in place of ``items``, refused with ``error``; ``None``
        when it is not to be sent again (`wrap`)."""
        made = self._sent
        if (
            made is None
            or made.resent  # sent again once already
            or overflow_of(error) is None
            or not (items is made.input or items == made.input)
        ):
            return None
        self.manager.observe(error)
        again = await self.manager.prepare(made.history)
        if again == made.view:
            return None
        resent = made.front + to_openai_responses(again)
        self._sent = _Made(resent, made.history, again, made.front, resent=True)
        self._resent = (items, resent)
        return resent

    def observe_response(self, response: ModelResponse) -> None:
        """Record a response's usage (what `hooks` does), for hooks of your own."""
        _observe(self.manager, response)


@dataclass(frozen=True, slots=True)
class _Made:
    """An input the filter made: what it sends, the history and view it was made of, the
    items sent before the view, and whether it is the one sent again for a refused input."""

    input: list[Any]
    history: list[Message]
    view: list[Message]
    front: list[Any]
    resent: bool = False


def _input_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """The ``input`` of a model call's arguments (the second, by position or name)."""
    return args[1] if len(args) > 1 else kwargs.get("input")


def _input_replaced(
    args: tuple[Any, ...], kwargs: dict[str, Any], items: object
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of a model call with its ``input`` replaced by ``items``."""
    if len(args) > 1:
        return (args[0], items, *args[2:]), kwargs
    return args, {**kwargs, "input": items}


class _Refitting(Model):
    """``model``, its refused prompts sent once more compacted (`AgentCtxInputFilter.wrap`);
    anything else it has is its own."""

    def __init__(self, model: Model, compaction: AgentCtxInputFilter) -> None:
        self._model = model
        self._compaction = compaction

    def __getattr__(self, name: str) -> Any:
        return _delegated(self, "_model", name)

    def _to_send(
        self, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        items = _input_of(args, kwargs)
        to_send = self._compaction._to_send(items)
        return (args, kwargs) if to_send is items else _input_replaced(args, kwargs, to_send)

    async def _again(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], error: Exception
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        again = await self._compaction._refit(_input_of(args, kwargs), error)
        return None if again is None else _input_replaced(args, kwargs, again)

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        """The model's response; a refused prompt is compacted and sent once more."""
        args, kwargs = self._to_send(args, kwargs)
        try:
            return await self._model.get_response(*args, **kwargs)
        except Exception as error:
            again = await self._again(args, kwargs, error)
            if again is None:
                raise
        return await self._model.get_response(*again[0], **again[1])

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        """The model's stream; a prompt refused before any event is compacted and sent once
        more."""
        args, kwargs = self._to_send(args, kwargs)
        given = False
        events = self._model.stream_response(*args, **kwargs)
        try:
            async for event in events:
                given = True
                yield event
            return
        except Exception as error:
            again = None if given else await self._again(args, kwargs, error)
            if again is None:
                raise
        finally:
            await _close(events)
        events = self._model.stream_response(*again[0], **again[1])
        try:
            async for event in events:
                yield event
        finally:
            await _close(events)

    async def close(self) -> None:
        """Close the model."""
        await self._model.close()

    # What the SDK asks of every model, which the base class answers for itself.

    def get_retry_advice(self, request: Any) -> Any:
        """The model's own advice on retrying a failed request."""
        return self._model.get_retry_advice(request)

    async def _cleanup_on_run_end(self, owner: object) -> None:
        cleanup = getattr(self._model, "_cleanup_on_run_end", None)
        if cleanup is not None:
            await cleanup(owner)


def _delegated(wrapper: object, field: str, name: str) -> Any:
    """``name`` of the object ``wrapper`` holds as ``field``; not its own missing fields (a
    copy made without ``__init__`` reads them before they are set)."""
    if name.startswith("__") or name == field:
        raise AttributeError(name)
    return getattr(object.__getattribute__(wrapper, field), name)


async def _close(events: AsyncIterator[Any]) -> None:
    """Close a stream left early (an async generator holds its connection until closed)."""
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


class _RefittingProvider(ModelProvider):
    """``provider``, its models wrapped by `AgentCtxInputFilter.wrap`."""

    def __init__(self, provider: ModelProvider, compaction: AgentCtxInputFilter) -> None:
        self._provider = provider
        self._compaction = compaction

    def __getattr__(self, name: str) -> Any:
        return _delegated(self, "_provider", name)

    def get_model(self, model_name: str | None) -> Model:
        """The provider's model, wrapped."""
        return _Refitting(self._provider.get_model(model_name), self._compaction)

    async def aclose(self) -> None:
        """Close the provider."""
        await self._provider.aclose()
