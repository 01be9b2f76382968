"""Signature -> Pydantic argument model -> JSON Schema, the strict dialect, ``IntentInfo``."""

from __future__ import annotations

import copy
import inspect
import reprlib
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic.errors import PydanticUserError
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import PydanticUndefined

from beam_agents._protos import MAX_JSON_DEPTH
from beam_agents.tools.errors import ToolArgumentError, ToolDefinitionError

# -- IntentInfo: the intent a side-effecting tool executes for --------------------------------
INTENT_PARAMETER = "intent"
"""The one parameter name under which a side-effecting tool may receive its ``IntentInfo``."""


@dataclass(frozen=True, slots=True)
class IntentInfo:
    """Which intent a side-effecting tool is executing for; the effector injects it.

    Declare a keyword-only ``intent: IntentInfo`` parameter and pass ``intent_id`` downstream
    as an idempotency key. It never appears in the tool's schema.
    """

    intent_id: str
    entity_key: bytes
    seq: int
    step_index: int
    attempt: int

    def __post_init__(self) -> None:
        expected: tuple[tuple[str, type, object], ...] = (
            ("intent_id", str, self.intent_id),
            ("entity_key", bytes, self.entity_key),
            ("seq", int, self.seq),
            ("step_index", int, self.step_index),
            ("attempt", int, self.attempt),
        )
        for field_name, field_type, value in expected:
            # bool is an int subclass, but a flag where a counter belongs is always a mistake.
            if not isinstance(value, field_type) or isinstance(value, bool):
                raise TypeError(
                    f"IntentInfo.{field_name} must be {field_type.__name__}, "
                    f"got {type(value).__name__}"
                )


# -- docstrings: a tool's description and per-parameter descriptions --------------------------
@dataclass(frozen=True)
class DocstringInfo:
    """What a docstring contributes to a tool: its description and parameter descriptions."""

    description: str = ""
    parameters: Mapping[str, str] = field(default_factory=dict)


def read_docstring(docstring: str | None, *, tool_name: str) -> DocstringInfo:
    """Parse ``docstring`` (any supported style); an unparsable one is a ``ToolDefinitionError``."""
    if not docstring or not docstring.strip():
        return DocstringInfo()
    try:
        parsed = docstring_parser.parse(docstring)
    except docstring_parser.ParseError as error:
        raise ToolDefinitionError(
            f"tool {tool_name!r}: its docstring cannot be parsed ({error}); fix the docstring "
            f"or pass description=... to @tool",
            tool_name=tool_name,
        ) from error
    # Rejoin the prose the way it was written, so a docstring without sections comes back as is.
    separator = "\n\n" if parsed.blank_after_short_description else "\n"
    prose = [part for part in (parsed.short_description, parsed.long_description) if part]
    parameters = {
        parameter.arg_name: parameter.description
        for parameter in parsed.params
        if parameter.description
    }
    return DocstringInfo(description=separator.join(prose), parameters=parameters)


# -- the strict dialect (OpenAI strict: true), written and read back side by side -------------
_DEFS_PREFIX = "#/$defs/"
_COMBINATORS = ("anyOf", "oneOf", "allOf")
_ANNOTATIONS = ("title", "description", "default", "examples")

Schema = dict[str, Any]


class _UnresolvedReferenceError(LookupError):
    """A ``$ref`` points outside the root ``$defs`` (never the case for a derived schema)."""


def strict_parameters(parameters: Mapping[str, Any], *, tool_name: str) -> Schema:
    """Rewrite a tool's ``parameters`` schema, as a copy, in the strict dialect.

    Every object is closed and requires all its properties; an optional one becomes nullable.
    An object that must stay open raises ``ToolDefinitionError`` naming the property.
    """
    original = copy.deepcopy(dict(parameters))
    defs = original.pop("$defs", {})
    try:
        strict: Schema = _strictify(original, path="", defs=defs, tool_name=tool_name)
        if defs:
            strict["$defs"] = {
                name: _strictify(definition, path=f"$defs.{name}", defs=defs, tool_name=tool_name)
                for name, definition in defs.items()
            }
    except _UnresolvedReferenceError as error:
        raise ToolDefinitionError(
            f"tool {tool_name!r} cannot be exported in strict mode: {error}", tool_name=tool_name
        ) from None
    return strict


def nesting_depth(value: object, limit: int) -> int:
    """How deeply the mappings and lists of ``value`` nest (0: a scalar), counted to ``limit + 1``.

    Iterative, so no depth raises ``RecursionError``; a cycle counts as too deep.
    """
    deepest = 0
    pending: list[tuple[object, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, Mapping):
            children: Iterable[object] = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            break
        pending.extend((child, depth + 1) for child in children)
    return deepest


def nesting_problems(arguments: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The arguments that nest deeper than JSON arguments may (``MAX_JSON_DEPTH``), as problems."""
    allowed = MAX_JSON_DEPTH - 1  # the arguments object itself is the first level
    return [
        (name, f"nests deeper than {MAX_JSON_DEPTH} levels (counting the arguments object)")
        for name, value in arguments.items()
        if nesting_depth(value, allowed) > allowed
    ]


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 4, 80, 80, 80


def shown_input(value: object, limit: int) -> str:
    """A ``repr`` of ``value`` for an error message: at most ``limit`` characters, cheaply."""
    shown = _SHOWN.repr(value)
    return shown if len(shown) <= limit else shown[: limit - 3] + "..."


def drop_nulls_meaning_default(
    arguments: Mapping[str, Any], parameters: Mapping[str, Any]
) -> dict[str, Any]:
    """Copy ``arguments`` without the nulls that mean "use the default", at every depth."""
    defs = parameters.get("$defs", {})
    pruned = _prune(dict(arguments), parameters, defs)
    assert isinstance(pruned, dict)  # _prune maps a dict to a dict
    return pruned


def admits_null(schema: Any, defs: Mapping[str, Any]) -> bool:
    """Tell whether ``schema`` accepts JSON ``null`` (unconstrained schemas do)."""
    if not isinstance(schema, Mapping):
        return bool(schema)
    if "$ref" in schema:
        return admits_null(_resolve(schema, defs), defs)
    declared = schema.get("type")
    if declared == "null" or (isinstance(declared, list) and "null" in declared):
        return True
    if "enum" in schema:
        return None in schema["enum"]
    if "const" in schema:
        return schema["const"] is None
    branches = [branch for key in ("anyOf", "oneOf") for branch in schema.get(key, ())]
    if branches:
        return any(admits_null(branch, defs) for branch in branches)
    return declared is None and "allOf" not in schema


def _resolve(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    reference = schema.get("$ref")
    if not isinstance(reference, str):
        return schema
    name = reference.removeprefix(_DEFS_PREFIX)
    target = defs.get(name) if reference.startswith(_DEFS_PREFIX) else None
    if not isinstance(target, Mapping):
        raise _UnresolvedReferenceError(f"schema reference {reference!r} does not resolve in $defs")
    return target


def _is_object(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "object" or "properties" in schema


def _strictify(schema: Any, *, path: str, defs: Mapping[str, Any], tool_name: str) -> Any:
    if not isinstance(schema, Mapping):
        return schema
    node = dict(schema)
    if "$ref" in node and len(node) > 1:
        reference = {"$ref": node.pop("$ref")}
        node = {**_resolve(reference, defs), **node}
    # A default of None only restates the nullability strict mode already expresses.
    if "default" in node and node["default"] is None:
        del node["default"]
    if _is_object(node):
        _close_object(node, path=path, defs=defs, tool_name=tool_name)
    if isinstance(node.get("items"), Mapping):
        node["items"] = _strictify(node["items"], path=f"{path}[]", defs=defs, tool_name=tool_name)
    if isinstance(node.get("prefixItems"), list):
        node["prefixItems"] = [
            _strictify(item, path=f"{path}[{index}]", defs=defs, tool_name=tool_name)
            for index, item in enumerate(node["prefixItems"])
        ]
    for key in _COMBINATORS:
        if isinstance(node.get(key), list):
            node[key] = [
                _strictify(branch, path=path, defs=defs, tool_name=tool_name)
                for branch in node[key]
            ]
    return node


def _close_object(node: Schema, *, path: str, defs: Mapping[str, Any], tool_name: str) -> None:
    extra = node.get("additionalProperties", False)
    if extra is not False:
        where = f"parameter {path!r}" if path else "its parameters object"
        raise ToolDefinitionError(
            f"tool {tool_name!r} cannot be exported in strict mode: {where} is an open object "
            f"(a free-form map such as dict[str, T]), and strict mode requires every object "
            f"to list its properties and forbid others; use a Pydantic model with named "
            f"fields, or export without strict",
            tool_name=tool_name,
            parameter=path or None,
        )
    properties = node.get("properties", {})
    required = set(node.get("required", ()))
    strict_properties: Schema = {}
    for name, subschema in properties.items():
        child_path = f"{path}.{name}" if path else name
        strict = _strictify(subschema, path=child_path, defs=defs, tool_name=tool_name)
        if name not in required and not admits_null(strict, defs):
            strict = _nullable(strict)
        strict_properties[name] = strict
    node["properties"] = strict_properties
    node["required"] = list(strict_properties)
    node["additionalProperties"] = False


def _nullable(schema: Schema) -> Schema:
    annotations = {key: schema[key] for key in _ANNOTATIONS if key in schema}
    core = {key: value for key, value in schema.items() if key not in _ANNOTATIONS}
    if list(core) == ["anyOf"]:
        return {"anyOf": [*core["anyOf"], {"type": "null"}], **annotations}
    return {"anyOf": [core, {"type": "null"}], **annotations}


def _branch_of_type(
    schema: Mapping[str, Any], json_type: str, defs: Mapping[str, Any]
) -> Mapping[str, Any] | None:
    schema = _resolve(schema, defs)
    if schema.get("type") == json_type or (json_type == "object" and "properties" in schema):
        return schema
    for key in _COMBINATORS:
        for branch in schema.get(key, ()):
            if isinstance(branch, Mapping):
                found = _branch_of_type(branch, json_type, defs)
                if found is not None:
                    return found
    return None


def _prune(value: Any, schema: Any, defs: Mapping[str, Any]) -> Any:
    if not isinstance(schema, Mapping):
        return value
    if isinstance(value, dict):
        described = _branch_of_type(schema, "object", defs)
        if described is None:
            return value
        properties = described.get("properties", {})
        required = set(described.get("required", ()))
        extra = described.get("additionalProperties")
        pruned: dict[Any, Any] = {}
        for key, item in value.items():
            subschema = properties.get(key, extra)
            if (
                item is None
                and key in properties
                and key not in required
                and not admits_null(subschema, defs)
            ):
                continue
            pruned[key] = _prune(item, subschema, defs)
        return pruned
    if isinstance(value, list):
        described = _branch_of_type(schema, "array", defs)
        if described is None:
            return value
        return [_prune(item, described.get("items"), defs) for item in value]
    return value


# -- signature -> argument model -> JSON Schema -----------------------------------------------
_MAX_SHOWN_INPUT = 60
# Only pydantic's own errors and the TypeErrors it raises for nonsensical annotations mean "this
# parameter type has no argument model or JSON Schema"; anything else is a bug and propagates.
_UNREPRESENTABLE = (PydanticUserError, TypeError)


class _ProviderJsonSchema(GenerateJsonSchema):
    """Pydantic's JSON Schema without per-field titles, which only restate the parameter name."""

    def field_title_should_be_set(self, schema: object) -> bool:
        """Never."""
        return False


@dataclass(frozen=True)
class _Field:
    """How one model field maps back onto the function's parameter of the same alias."""

    field_name: str
    parameter: str
    always_passed: bool


@dataclass(frozen=True)
class ArgumentSpec:
    """A tool's generated argument model, its JSON Schema, and how to validate calls with it."""

    tool_name: str
    model: type[BaseModel]
    json_schema: dict[str, Any]
    accepts_intent: bool
    fields: tuple[_Field, ...]

    def validate(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validate ``arguments`` (Pydantic lax mode) into keyword arguments for the function.

        Parameters left out that have a Python default are omitted, so that default applies.
        """
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError(
                f"tool {self.tool_name!r}: arguments must be a mapping of parameter name to "
                f"value, got {type(arguments).__name__}",
                tool_name=self.tool_name,
            )
        bad_keys = [key for key in arguments if not isinstance(key, str)]
        if bad_keys:
            raise ToolArgumentError(
                f"tool {self.tool_name!r}: argument names must be strings, got {bad_keys!r}",
                tool_name=self.tool_name,
                problems=[(repr(key), "argument name is not a string") for key in bad_keys],
            )
        too_deep = nesting_problems(arguments)
        if too_deep:
            raise argument_error(self.tool_name, too_deep)
        payload = drop_nulls_meaning_default(arguments, self.json_schema)
        try:
            validated = self.model.model_validate(payload)
        except ValidationError as error:
            raise self._argument_error(error) from error
        supplied = validated.model_fields_set
        return {
            field.parameter: getattr(validated, field.field_name)
            for field in self.fields
            if field.always_passed or field.field_name in supplied
        }

    def _argument_error(self, error: ValidationError) -> ToolArgumentError:
        known = ", ".join(field.parameter for field in self.fields) or "none"
        problems: list[tuple[str, str]] = []
        for detail in error.errors():
            location = ".".join(str(part) for part in detail["loc"]) or "(arguments)"
            if detail["type"] == "extra_forbidden":
                if detail["loc"] == (INTENT_PARAMETER,) and self.accepts_intent:
                    message = "intent is injected by the effector and cannot be an argument"
                else:
                    message = "unknown argument"
                    if len(detail["loc"]) == 1:
                        message += f" (this tool's parameters: {known})"
            else:
                message = detail["msg"]
                if detail["type"] != "missing":
                    message += f" (got {shown_input(detail['input'], _MAX_SHOWN_INPUT)})"
            problems.append((location, message))
        return argument_error(self.tool_name, problems)


def argument_error(tool_name: str, problems: Sequence[tuple[str, str]]) -> ToolArgumentError:
    """The error for ``problems``, ``(location, message)`` pairs, each listed in its message."""
    listing = "; ".join(f"{location}: {message}" for location, message in problems)
    return ToolArgumentError(
        f"invalid arguments for tool {tool_name!r}: {listing}",
        tool_name=tool_name,
        problems=problems,
    )


def derive_arguments(
    function: Callable[..., Any],
    *,
    tool_name: str,
    side_effect: bool,
    parameter_descriptions: Mapping[str, str],
) -> ArgumentSpec:
    """Build the argument model and JSON Schema of ``function``'s parameters.

    Raises ``ToolDefinitionError`` naming the tool and parameter when one cannot be an argument.
    """
    accepts_intent = False
    definitions: dict[str, tuple[Any, FieldInfo]] = {}
    hints: dict[str, Any] = {}
    fields: list[_Field] = []
    parameters = list(inspect.signature(function).parameters.values())
    taken_names = {parameter.name for parameter in parameters}
    for parameter in parameters:
        _reject_unsupported_kind(parameter, tool_name)
        hint = _resolve_annotation(function, parameter, tool_name)
        if parameter.name == INTENT_PARAMETER or _mentions_intent_info(hint):
            _check_intent_parameter(parameter, hint, tool_name=tool_name, side_effect=side_effect)
            accepts_intent = True
            continue
        field_name = _field_name_for(parameter.name, taken_names)
        taken_names.add(field_name)
        definitions[field_name] = (
            hint,
            _field_info(parameter, hint, parameter_descriptions.get(parameter.name)),
        )
        hints[parameter.name] = hint
        fields.append(
            _Field(
                field_name=field_name,
                parameter=parameter.name,
                always_passed=parameter.default is inspect.Parameter.empty,
            )
        )
    try:
        model: type[BaseModel] = create_model(
            _model_name(tool_name),
            __config__=ConfigDict(extra="forbid", protected_namespaces=()),
            **definitions,  # type: ignore[call-overload]  # pydantic's kwargs are field specs
        )
        json_schema = model.model_json_schema(schema_generator=_ProviderJsonSchema)
    except _UNREPRESENTABLE as error:
        raise _unrepresentable(hints, tool_name, error) from error
    json_schema.pop("title", None)
    return ArgumentSpec(
        tool_name=tool_name,
        model=model,
        json_schema=json_schema,
        accepts_intent=accepts_intent,
        fields=tuple(fields),
    )


def _reject_unsupported_kind(parameter: inspect.Parameter, tool_name: str) -> None:
    name = parameter.name
    if parameter.kind is inspect.Parameter.VAR_POSITIONAL:
        problem = f"'*{name}' is not supported: a tool takes named, typed arguments only"
    elif parameter.kind is inspect.Parameter.VAR_KEYWORD:
        problem = f"'**{name}' is not supported: a tool takes named, typed arguments only"
    elif parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
        problem = f"{name!r} is positional-only, but tools are called with keyword arguments"
    elif parameter.annotation is inspect.Parameter.empty:
        problem = (
            f"{name!r} has no type annotation; annotate it (for example {name}: str) so its "
            f"schema can be derived"
        )
    else:
        return
    raise ToolDefinitionError(
        f"tool {tool_name!r}: parameter {problem}", tool_name=tool_name, parameter=name
    )


def resolve_hint(function: Callable[..., Any], annotation: Any) -> Any:
    """``annotation`` (one of ``function``'s) evaluated in the function's globals; may raise."""
    holder = types.SimpleNamespace(__annotations__={"hint": annotation})
    namespace = getattr(function, "__globals__", {})
    return typing.get_type_hints(holder, globalns=namespace, include_extras=True)["hint"]


def _resolve_annotation(
    function: Callable[..., Any], parameter: inspect.Parameter, tool_name: str
) -> Any:
    # One parameter at a time, so an unresolvable annotation is reported against its parameter.
    try:
        return resolve_hint(function, parameter.annotation)
    except Exception as error:  # evaluating an annotation can raise anything; all mean "broken"
        raise ToolDefinitionError(
            f"tool {tool_name!r}: the annotation of parameter {parameter.name!r} "
            f"({parameter.annotation!r}) cannot be resolved: {error}",
            tool_name=tool_name,
            parameter=parameter.name,
        ) from error


def _strip_annotated(hint: Any) -> Any:
    while typing.get_origin(hint) is Annotated:
        hint = typing.get_args(hint)[0]
    return hint


def _mentions_intent_info(hint: Any) -> bool:
    hint = _strip_annotated(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return any(_mentions_intent_info(member) for member in typing.get_args(hint))
    return hint is IntentInfo


def _check_intent_parameter(
    parameter: inspect.Parameter, hint: Any, *, tool_name: str, side_effect: bool
) -> None:
    declaration = f"*, {INTENT_PARAMETER}: IntentInfo"
    if parameter.name != INTENT_PARAMETER:
        problem = (
            f"{parameter.name!r} is typed with IntentInfo, which a tool receives only through a "
            f"keyword-only parameter named {INTENT_PARAMETER!r} ({declaration})"
        )
    elif hint is not IntentInfo:
        problem = (
            f"{INTENT_PARAMETER!r} is reserved for the IntentInfo the effector injects and must "
            f"be declared exactly as {declaration}, not with type {hint!r}"
        )
    elif not side_effect:
        problem = (
            f"{INTENT_PARAMETER!r} is declared on a read-only tool; only side_effect=True tools "
            f"run in the effector, which is what injects the intent"
        )
    elif parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
        problem = (
            f"{INTENT_PARAMETER!r} must be keyword-only ({declaration}), since it is injected "
            f"and never passed positionally"
        )
    else:
        return
    raise ToolDefinitionError(
        f"tool {tool_name!r}: parameter {problem}", tool_name=tool_name, parameter=parameter.name
    )


def _field_name_for(parameter_name: str, taken: set[str]) -> str:
    # Pydantic refuses leading underscores and warns when a field shadows a BaseModel attribute
    # (``schema``, ``json``...). Such parameters get an internal field name; the alias keeps the
    # parameter's own name in the schema and in validation.
    if not parameter_name.startswith("_") and not hasattr(BaseModel, parameter_name):
        return parameter_name
    candidate = "argument_" + parameter_name.lstrip("_")
    while candidate in taken or hasattr(BaseModel, candidate):
        candidate += "_"
    return candidate


def _field_info(parameter: inspect.Parameter, hint: Any, documented: str | None) -> FieldInfo:
    # Field(description=...) in Annotated is the more specific source, so it wins. It is passed
    # on explicitly because any description given here, even None, replaces the annotated one.
    annotated = [
        metadata.description
        for metadata in getattr(hint, "__metadata__", ())
        if isinstance(metadata, FieldInfo) and metadata.description
    ]
    default = (
        PydanticUndefined if parameter.default is inspect.Parameter.empty else parameter.default
    )
    field_info = Field(
        default,
        alias=parameter.name,
        description=annotated[-1] if annotated else documented,
    )
    assert isinstance(field_info, FieldInfo)  # Field() is typed as Any for dataclass_transform
    return field_info


def _model_name(tool_name: str) -> str:
    words = tool_name.replace("-", "_").split("_")
    return "".join(word[:1].upper() + word[1:] for word in words) + "Arguments"


def _unrepresentable(
    hints: Mapping[str, Any], tool_name: str, error: Exception
) -> ToolDefinitionError:
    for parameter, hint in hints.items():
        try:
            TypeAdapter(hint).json_schema()
        except _UNREPRESENTABLE as parameter_error:
            # Pydantic's first line says what is wrong; the rest advises on model config, which
            # a tool author does not control.
            reason = str(parameter_error).splitlines()[0]
            return ToolDefinitionError(
                f"tool {tool_name!r}: parameter {parameter!r} has type {hint!r}, which has no "
                f"argument validator or JSON Schema: {reason}",
                tool_name=tool_name,
                parameter=parameter,
            )
    return ToolDefinitionError(
        f"tool {tool_name!r}: its argument model cannot be built: {error}", tool_name=tool_name
    )
