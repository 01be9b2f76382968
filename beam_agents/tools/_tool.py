"""``@tool``, ``Tool``, ``ToolRegistry`` and ``ToolRunner``: define, collect and run tools."""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib
import inspect
import json
import re
import sys
import typing
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, ParamSpec, Protocol, TypeVar, overload

from pydantic import BaseModel, TypeAdapter, ValidationError

from beam_agents.tools._schema import (
    ArgumentSpec,
    IntentInfo,
    derive_arguments,
    read_docstring,
    resolve_hint,
)
from beam_agents.tools.errors import SideEffectToolError, ToolDefinitionError, ToolNotFoundError


# -- reconcilers: asking the outside world whether an effect happened -------------------------
@dataclass(frozen=True, slots=True)
class Reconciled:
    """The effect of an intent already happened; ``value`` (JSON-encodable) is its OK result."""

    value: Any = None


Reconciler = Callable[
    [IntentInfo, dict[str, Any]], "Reconciled | Awaitable[Reconciled | None] | None"
]
"""``(intent, args) -> Reconciled | None``, sync or async; ``args`` are the validated arguments."""


def checked_reconciler(function: object, tool_name: str) -> Reconciler:
    """Return ``function`` if it can be called as ``function(intent, args)``; else raise."""
    if not callable(function):
        raise ToolDefinitionError(
            f"tool {tool_name!r}: a reconciler must be a function, got {type(function).__name__}",
            tool_name=tool_name,
        )
    try:
        inspect.signature(function).bind(None, None)
    except TypeError:
        raise ToolDefinitionError(
            f"tool {tool_name!r}: a reconciler is called as reconciler(intent, args); "
            f"{getattr(function, '__qualname__', function)!r} cannot take those two arguments",
            tool_name=tool_name,
        ) from None
    except ValueError:  # a builtin without a signature: trust it
        pass
    return function


# -- @tool and Tool ---------------------------------------------------------------------------
_P = ParamSpec("_P")
_R = TypeVar("_R")

# What both OpenAI and Anthropic accept as a tool name; checking here fails at decoration
# rather than on the first model call.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")

# How a pickled Tool names its function: (module, qualified name) when importable there,
# otherwise the function object itself, for the pickler to copy by value.
_FunctionReference = tuple[str, str] | Callable[..., Any]


class ToolConnection(Protocol):
    """Something a tool needs open in a process that calls it (an MCP server's session).

    Opening must not raise when the far side is down.
    """

    def open(self) -> None:
        """Hold the connection open (idempotent per holder; counted)."""

    def close(self) -> None:
        """Release one :meth:`open`."""


class Tool(Generic[_P, _R]):
    """A function plus its provider-facing description, argument model and JSON schema.

    Create one with :func:`tool`. Calling a read-only Tool runs the function; calling a
    side-effecting one raises ``SideEffectToolError``. Tools compare equal when they wrap the
    same function the same way, and pickle by reference to their function.
    """

    _reconciler: Reconciler | None = None
    """Set by :meth:`reconciler`; a class default, so subclasses that skip ``__init__`` have it."""

    def __init__(
        self,
        function: Callable[_P, _R],
        *,
        name: str | None = None,
        description: str | None = None,
        side_effect: bool = False,
    ) -> None:
        tool_name = _checked_name(function, name)
        if not isinstance(side_effect, bool):
            raise ToolDefinitionError(
                f"tool {tool_name!r}: side_effect must be True or False, got {side_effect!r}",
                tool_name=tool_name,
            )
        if description is not None and not isinstance(description, str):
            raise ToolDefinitionError(
                f"tool {tool_name!r}: description must be a string, "
                f"got {type(description).__name__}",
                tool_name=tool_name,
            )
        docstring = read_docstring(function.__doc__, tool_name=tool_name)
        self._function = function
        self._name = tool_name
        self._side_effect = side_effect
        self._description_override = description
        self._description = docstring.description if description is None else description
        self._arguments: ArgumentSpec = derive_arguments(
            function,
            tool_name=tool_name,
            side_effect=side_effect,
            parameter_descriptions=docstring.parameters,
        )
        self._schema: dict[str, Any] = {
            "name": tool_name,
            "description": self._description,
            "parameters": self._arguments.json_schema,
        }
        functools.update_wrapper(self, function)

    @property
    def name(self) -> str:
        """The name the model calls the tool by (the function's ``__name__`` unless overridden)."""
        return self._name

    @property
    def description(self) -> str:
        """What the model is told the tool does (the docstring's prose unless overridden)."""
        return self._description

    @property
    def side_effect(self) -> bool:
        """True if the tool changes the world, and so runs only in the effector."""
        return self._side_effect

    @property
    def argument_model(self) -> type[BaseModel]:
        """The Pydantic v2 model generated from the signature; it validates every call."""
        return self._arguments.model

    @property
    def schema(self) -> dict[str, Any]:
        """``{"name", "description", "parameters"}``; a fresh copy the caller may change."""
        return copy.deepcopy(self._schema)

    @property
    def accepts_intent(self) -> bool:
        """True if the function declares ``*, intent: IntentInfo`` for the effector to inject."""
        return self._arguments.accepts_intent

    @property
    def connection(self) -> ToolConnection | None:
        """What must be open for this tool to run here; ``None`` for a Python function."""
        return None

    @property
    def reconcile_with(self) -> Reconciler | None:
        """The reconciler registered with :meth:`reconciler`, or ``None``."""
        return self._reconciler

    def reconciler(self, function: Callable[..., Any]) -> Callable[..., Any]:
        """Register ``function(intent, args) -> Reconciled | None`` as this tool's reconciler.

        Use as a decorator (``@refund.reconciler``); returns ``function`` unchanged. Only a
        side-effecting tool has one, and only one (``docs/tools.md``, "Reconcilers").
        """
        if not self._side_effect:
            raise ToolDefinitionError(
                f"tool {self._name!r} is read-only (side_effect=False): only a side-effecting "
                f"tool has a reconciler",
                tool_name=self._name,
            )
        checked = checked_reconciler(function, self._name)
        if self._reconciler is not None and self._reconciler is not checked:
            raise ToolDefinitionError(
                f"tool {self._name!r} already has a reconciler "
                f"({getattr(self._reconciler, '__qualname__', self._reconciler)!r})",
                tool_name=self._name,
            )
        self._reconciler = checked
        return function

    def validate_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Check ``arguments`` against the argument model; return the keyword arguments to call.

        Validation is Pydantic's lax mode. Unknown arguments and ``intent`` are rejected. A
        ``null`` for a parameter whose type does not admit ``None`` means "use the default".
        Raises ``ToolArgumentError`` naming the tool and every failing field.
        """
        return self._arguments.validate(arguments)

    def decode_result(self, data: bytes | str) -> Any:
        """A JSON result of this tool, rebuilt as its return annotation says (else as JSON)."""
        if not data:
            return None
        adapter = _result_adapter(self._function)
        if adapter is not None:
            try:
                return adapter.validate_json(data)
            except ValidationError:
                pass  # the annotation does not describe the value: hand back its JSON
        return json.loads(data)

    def unwrap(self) -> Callable[_P, _R]:
        """Return the wrapped function itself, bypassing the ``side_effect`` guard.

        Only the effector's ``EffectorToolRunner`` may call it: it is the one named bypass.
        """
        return self._function

    def __call__(self, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        """Run a read-only tool as its function would; refuse a side-effecting one unrun."""
        if self._side_effect:
            raise SideEffectToolError.for_tool(self._name)
        return self._function(*args, **kwargs)

    def _identity(self) -> tuple[object, ...]:
        return (self._function, self._name, self._description_override, self._side_effect)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Tool):
            return NotImplemented
        return self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __repr__(self) -> str:
        return f"Tool(name={self._name!r}, side_effect={self._side_effect})"

    def __reduce__(self) -> tuple[Callable[..., Tool[Any, Any]], tuple[Any, ...]]:
        """Pickle by reference to the function, the decorator's arguments and the reconciler.

        The generated argument model is never pickled (dill cannot pickle ``create_model``
        classes); unpickling reuses the module's Tool or applies the decorator again. A function
        copied by value takes its string annotations along resolved: its copy's globals hold
        only the names its code uses.
        """
        reference = _reference_to(self._function)
        arguments: tuple[Any, ...] = (
            reference,
            self._name,
            self._description_override,
            self._side_effect,
        )
        resolved = {} if isinstance(reference, tuple) else _resolved_annotations(self._function)
        if self._reconciler is not None or resolved:
            reconciler = self._reconciler
            arguments = (*arguments, None if reconciler is None else _reference_to(reconciler))
        if resolved:
            arguments = (*arguments, resolved)
        return (_restore_tool, arguments)


@overload
def tool(function: Callable[_P, _R], /) -> Tool[_P, _R]: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None, side_effect: bool = False
) -> Callable[[Callable[_P, _R]], Tool[_P, _R]]: ...


def tool(
    function: Callable[_P, _R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    side_effect: bool = False,
) -> Tool[_P, _R] | Callable[[Callable[_P, _R]], Tool[_P, _R]]:
    """Make a function a :class:`Tool`; use bare (``@tool``) or with arguments.

    ``name`` defaults to the function's ``__name__`` and ``description`` to its docstring's
    prose. Every parameter needs a type annotation. Raises ``ToolDefinitionError`` naming the
    tool and parameter when the function cannot be a tool.
    """
    if function is None:
        return lambda decorated: Tool(
            decorated, name=name, description=description, side_effect=side_effect
        )
    return Tool(function, name=name, description=description, side_effect=side_effect)


@functools.lru_cache(maxsize=256)
def _result_adapter(function: Callable[..., Any]) -> TypeAdapter[Any] | None:
    """A validator for ``function``'s return annotation (``None``: it has none usable)."""
    try:
        hint = typing.get_type_hints(function).get("return")
        return None if hint is None or hint is Any else TypeAdapter(hint)
    except Exception:  # an annotation that does not resolve: the JSON value is all we have
        return None


def _checked_name(function: object, name: str | None) -> str:
    if isinstance(function, Tool):
        raise ToolDefinitionError(
            f"{function.name!r} is already a tool; apply @tool once", tool_name=function.name
        )
    if not inspect.isfunction(function):
        hint = " (to set the name, write @tool(name=...))" if isinstance(function, str) else ""
        raise ToolDefinitionError(
            f"@tool wraps a function defined with def or async def, "
            f"got {type(function).__name__}{hint}"
        )
    tool_name = function.__name__ if name is None else name
    if not isinstance(tool_name, str) or not _TOOL_NAME.fullmatch(tool_name):
        raise ToolDefinitionError(
            f"tool name {tool_name!r} (from {function.__qualname__}) is not valid: use 1 to 64 "
            f"letters, digits, '_' or '-', as model providers require",
            tool_name=str(tool_name),
        )
    return tool_name


def _lookup(module_name: str, qualname: str) -> object:
    target: object = sys.modules.get(module_name) or importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def _reference_to(function: Callable[..., Any]) -> _FunctionReference:
    module_name = getattr(function, "__module__", None)
    qualname = getattr(function, "__qualname__", "")
    # __main__ is a different module in whichever process unpickles, and <locals> cannot be
    # reached by name, so those functions travel by value (cloudpickle and dill can do that).
    if not module_name or module_name == "__main__" or "<locals>" in qualname:
        return function
    try:
        found = _lookup(module_name, qualname)
    except (ImportError, AttributeError):
        return function
    if found is function or (isinstance(found, Tool) and found._function is function):
        return (module_name, qualname)
    return function


def _resolved_annotations(function: Callable[..., Any]) -> dict[str, Any]:
    """``function``'s string annotations (``from __future__ import annotations``), resolved."""
    resolved: dict[str, Any] = {}
    for name, annotation in getattr(function, "__annotations__", {}).items():
        if isinstance(annotation, str):
            with contextlib.suppress(Exception):  # unresolvable here too: it stays a string
                resolved[name] = resolve_hint(function, annotation)
    return resolved


def _fill_annotations(function: Callable[..., Any], resolved: Mapping[str, Any]) -> None:
    """Give a function copied by value the annotations its new globals cannot resolve."""
    annotations = function.__annotations__
    for name, hint in resolved.items():
        try:
            resolve_hint(function, annotations.get(name))
        except Exception:
            annotations[name] = hint


def _restore_tool(
    reference: _FunctionReference,
    name: str,
    description: str | None,
    side_effect: bool,
    reconciler: _FunctionReference | None = None,
    annotations: Mapping[str, Any] | None = None,
) -> Tool[Any, Any]:
    """Rebuild a pickled Tool (see :meth:`Tool.__reduce__`); older pickles load too."""
    found = _lookup(*reference) if isinstance(reference, tuple) else reference
    if isinstance(found, Tool):
        decorated_alike = (found.name, found._description_override, found.side_effect) == (
            name,
            description,
            side_effect,
        )
        if decorated_alike and (reconciler is None or found.reconcile_with is not None):
            return found
        found = found._function
    if not callable(found):
        raise ToolDefinitionError(
            f"cannot unpickle tool {name!r}: {reference!r} is no longer a function",
            tool_name=name,
        )
    if annotations:
        _fill_annotations(found, annotations)
    rebuilt = Tool(found, name=name, description=description, side_effect=side_effect)
    if reconciler is not None:
        found_reconciler = _lookup(*reconciler) if isinstance(reconciler, tuple) else reconciler
        rebuilt.reconciler(checked_reconciler(found_reconciler, name))
    return rebuilt


# -- ToolRegistry: tools by name, in registration order; an ordinary, picklable value ---------
class ToolRegistry:
    """Tools keyed by their unique name, kept in registration order.

    ``name in registry`` and ``tool in registry`` (an equal Tool under its name) both work.
    """

    def __init__(self, tools: Iterable[Tool[..., Any]] = ()) -> None:
        self._tools: dict[str, Tool[..., Any]] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool[_P, _R]) -> Tool[_P, _R]:
        """Add ``tool`` and return it; a name already present raises ``ToolDefinitionError``."""
        if not isinstance(tool, Tool):
            raise TypeError(
                f"ToolRegistry.register takes a Tool (a function decorated with @tool), "
                f"got {type(tool).__name__}"
            )
        if tool.name in self._tools:
            raise ToolDefinitionError(
                f"a tool named {tool.name!r} is already registered; tool names must be unique "
                f"within a registry",
                tool_name=tool.name,
            )
        self._tools[tool.name] = tool
        return tool

    def get(self, name: str) -> Tool[..., Any]:
        """Return the tool registered as ``name``; else raise ``ToolNotFoundError`` naming it."""
        try:
            return self._tools[name]
        except (KeyError, TypeError):
            registered = ", ".join(self._tools) or "none"
            raise ToolNotFoundError(
                f"no tool named {name!r} in this registry (registered: {registered})",
                tool_name=name if isinstance(name, str) else repr(name),
            ) from None

    @property
    def tools_schema(self) -> list[dict[str, Any]]:
        """Every tool's ``schema``, in registration order; fresh copies the caller may change."""
        return [tool.schema for tool in self._tools.values()]

    def connections(self) -> list[ToolConnection]:
        """The distinct connections its tools need open (MCP sessions), in registration order."""
        found: dict[ToolConnection, None] = {}
        for tool in self._tools.values():
            connection = tool.connection
            if connection is not None:
                found.setdefault(connection, None)
        return list(found)

    def names(self) -> frozenset[str]:
        """Return the registered tool names."""
        return frozenset(self._tools)

    def merge(self, other: ToolRegistry) -> ToolRegistry:
        """Return a new registry with this one's tools, then ``other``'s; a shared name raises."""
        if not isinstance(other, ToolRegistry):
            raise TypeError(f"ToolRegistry.merge takes a ToolRegistry, got {type(other).__name__}")
        return ToolRegistry([*self, *other])

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, item: object) -> bool:
        if isinstance(item, Tool):
            return self._tools.get(item.name) == item
        return isinstance(item, str) and item in self._tools

    def __iter__(self) -> Iterator[Tool[..., Any]]:
        return iter(list(self._tools.values()))

    def __repr__(self) -> str:
        return f"ToolRegistry({list(self._tools)!r})"


# -- ToolRunner: the inline fast path for read-only tools -------------------------------------
class ToolRunner:
    """Runs ``side_effect=False`` tools inline, validating in lax mode (``"5"`` becomes ``5``)."""

    async def run(self, tool: Tool[..., Any], arguments: Mapping[str, Any]) -> Any:
        """Validate ``arguments`` and run the read-only ``tool``; return its (awaited) result."""
        if not isinstance(tool, Tool):
            raise TypeError(f"ToolRunner.run takes a Tool, got {type(tool).__name__}")
        if tool.side_effect:
            raise SideEffectToolError.for_tool(tool.name)
        result = tool(**tool.validate_arguments(arguments))
        if inspect.isawaitable(result):
            return await result
        return result
