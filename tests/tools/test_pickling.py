"""Tools and registries pickle by reference to their functions, under cloudpickle and dill."""

import copy
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle
import dill
import pytest

import beam_agents
from beam_agents.tools import IntentInfo, Tool, ToolRegistry, ToolRunner, tool
from beam_agents.tools.errors import (
    SideEffectToolError,
    ToolArgumentError,
    ToolDefinitionError,
    ToolNotFoundError,
)

from . import toolbox

PICKLERS: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
    "cloudpickle": (cloudpickle.dumps, cloudpickle.loads),
    "dill": (dill.dumps, dill.loads),
}
MODULE_TOOLS = [
    toolbox.lookup_customer,
    toolbox.charge_card,
    toolbox.plan_shipment,
    toolbox.fetch_rate,
    toolbox.report,
]


def _round_trip(pickler: str, value: Any) -> Any:
    dumps, loads = PICKLERS[pickler]
    return loads(dumps(value))


@pytest.mark.parametrize("pickler", PICKLERS)
@pytest.mark.parametrize("original", MODULE_TOOLS, ids=lambda each: each.name)
def test_module_level_tools_round_trip(pickler: str, original: Tool) -> None:
    restored = _round_trip(pickler, original)
    assert isinstance(restored, Tool)
    assert restored == original
    assert restored.unwrap() is original.unwrap()
    assert restored.schema == original.schema
    assert restored.side_effect == original.side_effect
    assert restored.accepts_intent == original.accepts_intent


@pytest.mark.parametrize("pickler", PICKLERS)
def test_a_decorated_module_function_pickles_by_reference(pickler: str) -> None:
    payload = PICKLERS[pickler][0](toolbox.lookup_customer)
    # By value, the function's code and its constants would be in the payload.
    assert toolbox.LOOKUP_MARKER.encode() not in payload
    assert len(payload) < 400
    # The module's own Tool comes back: same function, same decorator arguments.
    assert PICKLERS[pickler][1](payload) is toolbox.lookup_customer


@pytest.mark.parametrize("pickler", PICKLERS)
def test_a_tool_bound_under_another_name_rebuilds_its_model(pickler: str) -> None:
    restored = _round_trip(pickler, toolbox.report)
    assert restored is not toolbox.report
    assert restored.unwrap() is toolbox._render_report
    assert restored.name == "render_report"
    assert restored.description == "Render a titled report."
    assert restored.argument_model is not toolbox.report.argument_model
    assert restored.validate_arguments({"title": "Q3", "pages": "2"}) == {"title": "Q3", "pages": 2}


@pytest.mark.parametrize("pickler", PICKLERS)
def test_a_restored_side_effecting_tool_still_refuses(pickler: str) -> None:
    restored = _round_trip(pickler, toolbox.freeze_account)
    with pytest.raises(SideEffectToolError):
        restored(customer_id="cust-9")


@pytest.mark.asyncio
@pytest.mark.parametrize("pickler", PICKLERS)
async def test_a_restored_tool_runs(pickler: str) -> None:
    restored = _round_trip(pickler, toolbox.fetch_rate)
    assert await ToolRunner().run(restored, {"currency": "USD"}) == 1.25


@pytest.mark.parametrize("pickler", PICKLERS)
def test_a_tool_defined_in_a_function_travels_by_value(pickler: str) -> None:
    suffix = "-local"

    @tool(side_effect=True)
    def tag(item: str, *, intent: IntentInfo) -> str:
        """Tag an item."""
        return item + suffix + ":" + intent.intent_id

    restored = _round_trip(pickler, tag)
    assert restored.name == "tag"
    assert restored.schema == tag.schema
    assert restored.accepts_intent
    intent = IntentInfo(intent_id="i", entity_key=b"k", seq=0, step_index=0, attempt=1)
    assert restored.unwrap()("x", intent=intent) == "x-local:i"


@pytest.mark.parametrize("pickler", PICKLERS)
def test_registries_round_trip(pickler: str) -> None:
    registry = ToolRegistry([toolbox.lookup_customer, toolbox.report, toolbox.charge_card])
    restored = _round_trip(pickler, registry)
    assert isinstance(restored, ToolRegistry)
    assert [each.name for each in restored] == ["lookup_customer", "render_report", "charge_card"]
    assert restored.tools_schema == registry.tools_schema
    assert restored.get("lookup_customer") is toolbox.lookup_customer


def test_plain_pickle_and_deepcopy_work_for_importable_tools() -> None:
    assert pickle.loads(pickle.dumps(toolbox.charge_card)) is toolbox.charge_card
    assert copy.deepcopy(toolbox.report) == toolbox.report
    registry = ToolRegistry([toolbox.lookup_customer])
    assert copy.deepcopy(registry).get("lookup_customer") is toolbox.lookup_customer


def test_tools_unpickle_in_a_fresh_process(tmp_path: Path) -> None:
    payloads = {
        name: dumps(ToolRegistry([toolbox.plan_shipment, toolbox.report]))
        for name, (dumps, _) in PICKLERS.items()
    }
    for name, payload in payloads.items():
        (tmp_path / f"{name}.bin").write_bytes(payload)
    # The directory from which toolbox's module name (tools.toolbox or deeper) is importable.
    import_root = Path(toolbox.__file__).parents[toolbox.__name__.count(".")]
    script = f"""
import sys
sys.path.insert(0, {str(import_root)!r})
import cloudpickle, dill
for name, loads in (("cloudpickle", cloudpickle.loads), ("dill", dill.loads)):
    with open({str(tmp_path)!r} + "/" + name + ".bin", "rb") as payload:
        registry = loads(payload.read())
    report = registry.get("render_report")
    print(name, report.unwrap()(**report.validate_arguments({{"title": "t", "pages": "3"}})))
"""
    completed = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split("\n")[:2] == ["cloudpickle t:3", "dill t:3"]


@pytest.mark.parametrize("pickler", ["pickle", *PICKLERS])
def test_errors_pickle_with_their_attributes(pickler: str) -> None:
    errors: list[Exception] = [
        ToolDefinitionError("bad", tool_name="t", parameter="p"),
        ToolNotFoundError("missing", tool_name="t"),
        ToolArgumentError("invalid", tool_name="t", problems=[("a", "wrong")]),
        SideEffectToolError.for_tool("t"),
    ]
    for error in errors:
        if pickler == "pickle":
            restored = pickle.loads(pickle.dumps(error))
        else:
            restored = _round_trip(pickler, error)
        assert type(restored) is type(error)
        assert str(restored) == str(error)
        assert vars(restored) == vars(error)


MAIN_TOOLS = '''
from __future__ import annotations

import sys
from typing import Literal

import dill
from apache_beam.internal import pickler

from beam_agents.tools import IntentInfo, ToolRegistry, tool


@tool(side_effect=True)
def send(to: str, speed: Literal["fast", "slow"], *, intent: IntentInfo) -> str:
    """Send a parcel."""
    return f"{intent.intent_id}: {to} {speed}"


@tool
def weigh(grams: int, unit: Literal["g", "kg"] = "g") -> float:
    """Weigh a parcel."""
    return grams / (1000 if unit == "kg" else 1)


registry = ToolRegistry([send, weigh])
with open(sys.argv[1], "wb") as payload:
    payload.write(pickler.dumps(registry))  # Beam's pickler, as RunAgent pickles its DoFn
with open(sys.argv[2], "wb") as payload:
    payload.write(dill.dumps(registry))
'''

WORKER = """
import sys

import dill
from apache_beam.internal import pickler

from beam_agents.tools import IntentInfo
from beam_agents.tools.errors import ToolArgumentError

intent = IntentInfo(intent_id="i-1", entity_key=b"k", seq=0, step_index=0, attempt=1)
with open(sys.argv[1], "rb") as beam_payload, open(sys.argv[2], "rb") as dill_payload:
    registries = {
        pickler.DEFAULT_PICKLE_LIB: pickler.loads(beam_payload.read()),
        "dill": dill.loads(dill_payload.read()),
    }
for name, registry in registries.items():
    send, weigh = registry.get("send"), registry.get("weigh")
    arguments = send.validate_arguments({"to": "Oslo", "speed": "fast"})
    print(name, send.unwrap()(intent=intent, **arguments), weigh(grams=1500, unit="kg"))
    try:
        send.validate_arguments({"to": "Oslo", "speed": "warp"})
    except ToolArgumentError as error:
        print(name, "refused", [field for field, _ in error.problems])
"""


def test_a_main_module_tool_with_postponed_annotations_unpickles_in_another_process(
    tmp_path: Path,
) -> None:
    """A script's tools (``__main__``, ``from __future__ import annotations``) reach workers."""
    root = str(Path(beam_agents.__file__).parents[1])
    (tmp_path / "pipeline.py").write_text(MAIN_TOOLS)
    (tmp_path / "worker.py").write_text(WORKER)
    payloads = [str(tmp_path / "beam.bin"), str(tmp_path / "dill.bin")]
    for script in ("pipeline.py", "worker.py"):  # each its own __main__, as driver and worker
        completed = subprocess.run(
            [sys.executable, str(tmp_path / script), *payloads],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={**os.environ, "PYTHONPATH": root},
        )
        assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == [
        "cloudpickle i-1: Oslo fast 1.5",
        "cloudpickle refused ['speed']",
        "dill i-1: Oslo fast 1.5",
        "dill refused ['speed']",
    ]
