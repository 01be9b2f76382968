"""SubmitIntents against a real effector: acks, dead letters, retries, restarts, batches, auth."""

from __future__ import annotations

import logging
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import apache_beam as beam
import pytest
from effector_harness import FAST_WORKER, BackgroundEffector, make_intent, self_signed_certificate
from effector_test_tools import read_ledger

from beam_agents._protos import IntentState, SubmitAck, ToolIntent
from beam_agents.io import EffectorConnection, SubmitIntents
from effector.client import EffectorClient
from effector.launch import free_port
from effector.server import ServerSettings
from tests.io.io_harness import (
    Collector,
    counter,
    distribution,
    record_intent,
    run_pipeline,
    started,
    submit_all,
)

TOKEN = "io-test-token-5678"


def wait_done(address: str, intents: list[ToolIntent], token: str | None = None) -> None:
    with EffectorClient(address, token=token) as client:
        for intent in intents:
            for _ in range(600):
                if client.get_intent(intent.intent_id).state == IntentState.DONE:
                    break
                threading.Event().wait(0.05)
            else:
                raise AssertionError(f"intent {intent.intent_id} never finished")


def test_acks_for_accepted_and_duplicates_and_rejections_dead_lettered(
    effector: BackgroundEffector, ledger: Path
) -> None:
    fresh = record_intent(b"a", "fresh")
    already = record_intent(b"b", "already")
    unknown_tool = make_intent("missing", key=b"c")
    malformed = record_intent(b"d", "malformed")
    malformed.intent_id = "order-17"
    with EffectorClient(effector.address) as client:
        client.submit([already])

    acks, letters, result = submit_all(
        [fresh, already, unknown_tool, malformed, fresh], SubmitIntents(effector.address)
    )

    assert sorted((ack.intent_id, ack.outcome) for ack in acks) == sorted(
        [
            (fresh.intent_id, SubmitAck.ACCEPTED),
            (fresh.intent_id, SubmitAck.DUPLICATE),
            (already.intent_id, SubmitAck.DUPLICATE),
            (unknown_tool.intent_id, SubmitAck.REJECTED),
            ("order-17", SubmitAck.REJECTED),
        ]
    )
    by_id = {letter.intent.intent_id: letter for letter in letters}
    assert set(by_id) == {unknown_tool.intent_id, "order-17"}
    assert by_id[unknown_tool.intent_id].intent == unknown_tool
    assert "unknown tool 'missing'" in by_id[unknown_tool.intent_id].reason
    assert by_id["order-17"].intent == malformed
    assert "not a UUID" in by_id["order-17"].reason
    assert {letter.outcome for letter in letters} == {"REJECTED"}
    assert [counter(result, name) for name in ("intents_accepted", "intents_duplicate")] == [1, 2]
    assert [counter(result, name) for name in ("intents_rejected", "intents_dead_lettered")] == [
        2,
        2,
    ]
    assert counter(result, "submit_retries") == 0
    wait_done(effector.address, [fresh, already])
    assert sorted(started(read_ledger(ledger))) == sorted([fresh.intent_id, already.intent_id])


def test_an_unreachable_effector_is_retried_then_dead_lettered_with_the_grpc_reason() -> None:
    intents = [record_intent(f"k{i}".encode(), "never") for i in range(5)]
    transform = SubmitIntents(
        f"127.0.0.1:{free_port()}",
        batch_size=2,
        max_attempts=3,
        initial_backoff_s=0.01,
        max_backoff_s=0.02,
        rpc_timeout_s=5,
    )
    acks, letters, result = submit_all(intents, transform)
    assert acks == []
    assert sorted(letter.intent.intent_id for letter in letters) == sorted(
        intent.intent_id for intent in intents
    )
    for letter in letters:
        assert letter.reason.startswith("effector call failed after 3 attempt(s): UNAVAILABLE")
        assert letter.outcome == ""
    batches = distribution(result, "submit_batch_size")
    assert (batches.sum, batches.max) == (5, 2)
    assert batches.count >= 3
    # Every batch was tried three times: two retries each.
    assert counter(result, "submit_retries") == 2 * batches.count
    assert counter(result, "intents_dead_lettered") == 5


def test_batches_are_cut_at_batch_size(effector: BackgroundEffector) -> None:
    intents = [make_intent("add", {"a": i}, key=f"k{i}".encode()) for i in range(7)]
    acks, letters, result = submit_all(intents, SubmitIntents(effector.address, batch_size=3))
    assert letters == []
    assert {ack.outcome for ack in acks} == {SubmitAck.ACCEPTED}
    assert len(acks) == 7
    batches = distribution(result, "submit_batch_size")
    assert (batches.sum, batches.max) == (7, 3)
    assert batches.count >= 3


def test_retries_reach_an_effector_restarted_on_the_same_store_without_duplicates(
    store_url: str, ledger: Path
) -> None:
    earlier = [record_intent(b"a", "1"), record_intent(b"b", "2")]
    later = record_intent(b"c", "3")
    with BackgroundEffector(store_url) as first:
        port = first.port
        acks, _, _ = submit_all(earlier, SubmitIntents(first.address))
        assert {ack.outcome for ack in acks} == {SubmitAck.ACCEPTED}
        wait_done(first.address, earlier)

    # The effector is down. A listener on its port drops the first connection, which tells
    # the test that the pipeline is trying; then the effector comes back on the same store.
    target = f"127.0.0.1:{port}"
    transform = SubmitIntents(target, max_attempts=100, initial_backoff_s=0.05, max_backoff_s=0.2)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen()
        listener.settimeout(60)
        with ThreadPoolExecutor(max_workers=1) as pool:
            running = pool.submit(submit_all, [*earlier, later], transform)
            connection, _ = listener.accept()
            connection.close()
            listener.close()
            settings = ServerSettings(listen=target, worker=FAST_WORKER)
            with BackgroundEffector(store_url, settings) as second:
                acks, letters, result = running.result(timeout=60)
                wait_done(second.address, [later])

    assert letters == []
    assert sorted((ack.intent_id, ack.outcome, ack.state) for ack in acks) == sorted(
        [
            *((intent.intent_id, SubmitAck.DUPLICATE, IntentState.DONE) for intent in earlier),
            (later.intent_id, SubmitAck.ACCEPTED, IntentState.PENDING),
        ]
    )
    assert counter(result, "submit_retries") >= 1
    assert sorted(started(read_ledger(ledger))) == sorted(
        intent.intent_id for intent in [*earlier, later]
    )


def test_bearer_token_given_or_from_the_environment(
    store_url: str, ledger: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IO_TEST_EFFECTOR_TOKEN", TOKEN)
    by_token = record_intent(b"t1", "token")
    by_env = record_intent(b"t2", "env")
    settings = ServerSettings(token=TOKEN, worker=FAST_WORKER)
    with BackgroundEffector(store_url, settings) as effector:
        collected = {name: (Collector.new(), Collector.new()) for name in ("token", "env")}
        transforms = {
            "token": ([by_token], SubmitIntents(effector.address, token=TOKEN)),
            "env": ([by_env], SubmitIntents(effector.address, token_env="IO_TEST_EFFECTOR_TOKEN")),
        }

        def build(pipeline: beam.Pipeline) -> None:
            for name, (intents, transform) in transforms.items():
                acks, letters = collected[name]
                outputs = pipeline | f"Create {name}" >> beam.Create(intents) | name >> transform
                outputs.acks | f"Acks {name}" >> acks.sink()
                outputs.dead_letter | f"Letters {name}" >> letters.sink()

        result = run_pipeline(build)
        wait_done(effector.address, [by_token, by_env], token=TOKEN)

    for name in ("token", "env"):
        acks, letters = collected[name]
        assert [ack.outcome for ack in acks.values()] == [SubmitAck.ACCEPTED]
        assert letters.values() == []
    assert counter(result, "submit_retries") == 0
    assert TOKEN not in repr(transforms["token"][1]._fn._connection)
    assert sorted(started(read_ledger(ledger))) == sorted([by_token.intent_id, by_env.intent_id])


def test_a_wrong_token_fails_the_pipeline_without_retrying_or_dead_lettering(
    store_url: str, ledger: Path, caplog: pytest.LogCaptureFixture
) -> None:
    settings = ServerSettings(token=TOKEN, worker=FAST_WORKER)
    refused = record_intent(b"t3", "wrong")
    with BackgroundEffector(store_url, settings) as effector:
        transform = SubmitIntents(effector.address, token="wrong-token", max_attempts=5)
        with (
            caplog.at_level(logging.WARNING, logger="beam_agents.io.effector_link"),
            pytest.raises(PermissionError, match="UNAUTHENTICATED") as failure,
        ):
            submit_all([refused], transform)
        with EffectorClient(effector.address, token=TOKEN) as client:
            assert not client.get_intent(refused.intent_id).found
    # Beam appends the failing step's name.
    assert str(failure.value).startswith(
        f"submitting intents at {effector.address} failed: UNAUTHENTICATED: missing or invalid "
        "bearer token (check the token)"
    )
    assert "wrong-token" not in str(failure.value)
    # Neither retried nor dead-lettered: nothing was logged for it.
    assert [r for r in caplog.records if r.name == "beam_agents.io.effector_link"] == []
    assert read_ledger(ledger) == []


def test_tls_with_a_root_certificate_and_a_server_name_override(
    store_url: str, tmp_path: Path
) -> None:
    # Issued to a name only, so the target 127.0.0.1 matches it only through the override.
    certificate, key = self_signed_certificate(dns_names=("effector.test",), ip_addresses=())
    root_path = tmp_path / "root.pem"
    root_path.write_bytes(certificate)
    settings = ServerSettings(tls_cert=certificate, tls_key=key, token=TOKEN, worker=FAST_WORKER)
    verified = make_intent("add", {"a": 1}, key=b"tls")
    with BackgroundEffector(store_url, settings) as effector:
        override = EffectorConnection(
            effector.address, token=TOKEN, tls_root_cert=root_path, tls_server_name="effector.test"
        )
        acks, letters, _ = submit_all([verified], SubmitIntents(override))
        assert ([ack.outcome for ack in acks], letters) == ([SubmitAck.ACCEPTED], [])
        for mismatched in (
            SubmitIntents(
                effector.address, token=TOKEN, tls_root_cert=str(root_path), max_attempts=1
            ),
            SubmitIntents(effector.address, token=TOKEN, max_attempts=1),
        ):
            acks, letters, _ = submit_all([verified], mismatched)
            assert acks == []
            [letter] = letters
            assert letter.reason.startswith("effector call failed after 1 attempt(s): UNAVAILABLE")
