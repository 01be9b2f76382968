"""A request's canonical JSON: sorted keys, compact, non-ASCII kept, whatever its messages hold."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from beam_agents.model.client import LlmRequest


def reference(request: LlmRequest) -> str:
    """The canonical form as its definition states it, through ``json.dumps``."""
    whole = {
        "model_id": request.model_id,
        "messages": list(request.messages),
        "tools_schema": list(request.tools_schema),
        "sampling_params": dict(request.sampling_params),
    }
    return json.dumps(whole, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


class Message(dict[str, Any]):
    """A ``dict`` subclass: a message the encoder, not a shortcut, must write."""


texts = st.text(alphabet=st.characters(codec="utf-8"))
scalars = st.none() | st.booleans() | st.integers() | st.floats() | texts
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
plain_messages = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant"]) | texts, "content": texts}
)
odd_messages = (
    st.dictionaries(st.sampled_from(["role", "content", "tool_calls", "name"]), values)
    | plain_messages.map(Message)
    | st.fixed_dictionaries({"role": texts, "content": values})
    | st.fixed_dictionaries({"role": texts, "content": texts, "name": texts})
)
conversations = st.lists(texts | plain_messages | odd_messages, max_size=4)
requests = st.builds(
    LlmRequest,
    texts | st.none() | st.integers(),
    texts | conversations | conversations.map(tuple),
    st.none() | st.lists(st.dictionaries(texts, values, max_size=3), max_size=2),
    st.none() | st.dictionaries(texts, values, max_size=3),
)


@given(requests)
def test_the_canonical_json_is_the_sorted_compact_encoding(request: LlmRequest) -> None:
    assert request.canonical_json() == reference(request)


def test_a_plain_request_reads_as_its_definition() -> None:
    request = LlmRequest("bench", ["some event text", {"role": "system", "content": 'é "q"\n'}])
    assert request.canonical_json() == (
        '{"messages":[{"content":"some event text","role":"user"},'
        '{"content":"é \\"q\\"\\n","role":"system"}],'
        '"model_id":"bench","sampling_params":{},"tools_schema":[]}'
    )


def test_messages_that_are_not_dicts_are_written_as_the_encoder_writes_them() -> None:
    class Frozen(Mapping[str, str]):
        def __getitem__(self, key: str) -> str:
            return {"role": "user", "content": "x"}[key]

        def __iter__(self) -> Any:
            return iter(("role", "content"))

        def __len__(self) -> int:
            return 2

        def __str__(self) -> str:
            return "frozen"

    request = LlmRequest("m", [Frozen()])
    assert request.canonical_json() == reference(request)
    assert '"messages":["frozen"]' in request.canonical_json()
