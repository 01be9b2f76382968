"""Connection settings and construction-time validation of the io transforms."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import cloudpickle
import dill
import pytest

from beam_agents._protos import AgentEnvelope, Approval
from beam_agents.io import EffectorConnection, ReadEnvelopes, SubmitIntents

SECRET = "very-secret-token"


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps, dill.dumps])
def test_a_connection_pickles_and_never_shows_its_token(dumps: Any, tmp_path: Path) -> None:
    root = tmp_path / "root.pem"
    root.write_bytes(b"-----BEGIN CERTIFICATE-----\n")
    connection = EffectorConnection(
        "127.0.0.1:1", token=SECRET, tls_root_cert=root, tls_server_name="effector.test"
    )
    copy = pickle.loads(dumps(connection))
    assert copy == connection
    assert copy.metadata() == (("authorization", f"Bearer {SECRET}"),)
    assert SECRET not in repr(connection)
    # The certificate was read when the connection was made: the file is no longer needed.
    root.unlink()
    pickle.loads(dumps(connection)).open_channel().close()


def test_a_token_from_the_environment_is_read_where_it_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    connection = EffectorConnection("127.0.0.1:1", token_env="IO_TEST_UNSET_TOKEN")
    monkeypatch.delenv("IO_TEST_UNSET_TOKEN", raising=False)
    with pytest.raises(ValueError, match="IO_TEST_UNSET_TOKEN"):
        connection.metadata()
    monkeypatch.setenv("IO_TEST_UNSET_TOKEN", SECRET)
    assert connection.metadata() == (("authorization", f"Bearer {SECRET}"),)
    assert EffectorConnection("127.0.0.1:1").metadata() == ()


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"target": "nowhere"}, "HOST:PORT"),
        ({"target": "127.0.0.1:1", "token": "a", "token_env": "B"}, "not both"),
        ({"target": "127.0.0.1:1", "token": " "}, "token is empty"),
        ({"target": "127.0.0.1:1", "tls_server_name": "x"}, "needs tls_root_cert"),
        ({"target": "127.0.0.1:1", "tls_root_cert": "no-such-folder/root.pem"}, "cannot read"),
    ],
)
def test_bad_connection_settings_are_refused(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EffectorConnection(**arguments)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 1_001}, "batch_size"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"initial_backoff_s": 2.0, "max_backoff_s": 1.0}, "initial_backoff_s"),
        ({"rpc_timeout_s": 0}, "rpc_timeout_s"),
    ],
)
def test_bad_submit_settings_are_refused(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SubmitIntents("127.0.0.1:1", **arguments)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"start_offset": 0}, "start_offset"),
        ({"stop_when_idle_s": 0}, "stop_when_idle_s"),
        ({"max_batch": 0}, "max_batch"),
        ({"poll_wait_ms": 60_001}, "poll_wait_ms"),
        ({"watermark_lag_s": -1}, "watermark_lag_s"),
        ({"events": [b"raw bytes"]}, "event 0 is a bytes"),
        ({"events": [AgentEnvelope(external_event=b"x")]}, "event 0 has an empty entity_key"),
        (
            {"events": [AgentEnvelope(entity_key=b"k", approval=Approval(intent_id="x"))]},
            "not an external_event",
        ),
    ],
)
def test_bad_read_settings_are_refused(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ReadEnvelopes("127.0.0.1:1", **arguments)


def test_settings_go_inside_a_given_connection_not_beside_it() -> None:
    connection = EffectorConnection("127.0.0.1:1")
    for transform in (SubmitIntents, ReadEnvelopes):
        with pytest.raises(ValueError, match="inside the EffectorConnection"):
            transform(connection, token=SECRET)
