# mypy: disallow-untyped-calls=False
"""Security gate: tokens, TLS, refusing an open bind, and no secret in any log or message.

An effector subprocess runs as an operator would start it: ``--token-file``, a TLS
certificate the test generates, ``--log-level DEBUG``. Then:

- every Effector RPC (and reflection) without a token or with a wrong one is refused
  UNAUTHENTICATED and changes nothing, while health checks answer without one;
- the full loop runs over TLS with the token; plaintext to the TLS port fails;
- a pipeline holding a wrong token dead-letters its intents and fails its reader with
  ``PermissionError``, naming the cause and not the secret;
- ``serve`` on a non-loopback address without a token exits 2 before binding anything;
- no secret (the token, the wrong token, the private key) appears in the effector's stdout
  or stderr at DEBUG level, in the CLI's output, in any gRPC error, dead-letter reason or
  exception message;
- the web console (``--console-listen``) sends every page to its login and refuses every POST
  without a session; the login takes only the token and sets an HttpOnly, SameSite=Strict
  cookie derived from it; a POST without the session's CSRF token, or from another origin, is
  refused; a non-loopback console without a token exits 2 before binding; no page, header or
  log holds a secret.
"""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

import apache_beam as beam
import grpc
import httpx
import pytest
from effector_harness import make_intent, run_cli, self_signed_certificate
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from beam_agents._protos import (
    AgentEnvelope,
    DecideRequest,
    EffectorStub,
    GetIntentRequest,
    IntentState,
    ListIntentsRequest,
    PublishRequest,
    ReadRequest,
    RecordErrorsRequest,
    StatusRequest,
    SubmitRequest,
    ToolIntent,
)
from beam_agents.io import EffectorConnection, ReadEnvelopes, SubmitIntents
from effector.client import EffectorClient
from effector.launch import free_port
from tests.console.harness import csrf_of
from tests.console.runs_data import failed_event
from tests.io.io_harness import Collector, run_pipeline
from tests.semantics.gate_tools import REGISTRY_SPEC
from tests.semantics.loop import make_events, run_loop, sidecar

TOKEN = "gate-" + uuid.uuid4().hex
WRONG_TOKEN = "gate-wrong-" + uuid.uuid4().hex
OPEN_HOSTS = ("0.0.0.0", "[::]", "effector.example")
"""Non-loopback hosts an effector without a token must refuse to bind."""
RPCS: dict[str, object] = {
    "Submit": SubmitRequest(intents=[make_intent("touch", {"note": "x"}, key=b"k")]),
    "Read": ReadRequest(from_offset=1),
    "GetIntent": GetIntentRequest(intent_id=str(uuid.uuid4())),
    "Decide": DecideRequest(intent_id=str(uuid.uuid4()), approved=True),
    "Publish": PublishRequest(envelopes=[AgentEnvelope(entity_key=b"k", external_event=b"e")]),
    "Status": StatusRequest(),
    "ListIntents": ListIntentsRequest(state=IntentState.AWAITING_DECISION),
}


def refused_codes(channel: grpc.Channel, metadata: tuple[tuple[str, str], ...]) -> set[str]:
    """Call every Effector RPC and reflection; the status codes and details they failed with."""
    stub = EffectorStub(channel)
    outcomes: set[str] = set()
    for name, request in RPCS.items():
        with pytest.raises(grpc.RpcError) as refused:
            getattr(stub, name)(request, metadata=metadata, timeout=10)
        outcomes.add(f"{refused.value.code().name}: {refused.value.details()}")
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    with pytest.raises(grpc.RpcError) as refused:
        list(
            reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]),
                metadata=metadata,
                timeout=10,
            )
        )
    outcomes.add(f"{refused.value.code().name}: {refused.value.details()}")
    return outcomes


def is_serving(channel: grpc.Channel) -> bool:
    response = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=10
    )
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def submit_with(connection: EffectorConnection) -> list[str]:
    """Submit two intents through ``SubmitIntents``; the dead-letter reasons."""
    letters = Collector.new()
    intents = [make_intent("touch", {"note": str(n)}, key=f"k{n}".encode()) for n in range(2)]

    def build(pipeline: beam.Pipeline) -> None:
        submitted = pipeline | beam.Create(intents) | SubmitIntents(connection, max_attempts=2)
        submitted.dead_letter | beam.Map(lambda letter: letter.reason) | letters.sink()

    run_pipeline(build)
    return [str(reason) for reason in letters.values()]


def test_tokens_tls_open_binds_and_secrets(
    tmp_path: Path, ledger: Path, gate_report: Callable[[str, str], None]
) -> None:
    certificate, key = self_signed_certificate()
    (tmp_path / "cert.pem").write_bytes(certificate)
    (tmp_path / "key.pem").write_bytes(key)
    (tmp_path / "token").write_text(TOKEN + "\n")
    key_body = [line for line in key.decode().splitlines() if "PRIVATE KEY" not in line]
    secrets = [TOKEN, WRONG_TOKEN, *key_body]
    said: list[str] = []  # every message a user or operator could see

    args = (
        *("--token-file", str(tmp_path / "token")),
        *("--tls-cert", str(tmp_path / "cert.pem"), "--tls-key", str(tmp_path / "key.pem")),
        *("--log-level", "DEBUG"),
    )
    store = f"sqlite:///{tmp_path / 'effector.db'}"
    with sidecar(store, free_port(), ledger, *args) as effector:
        credentials = grpc.ssl_channel_credentials(root_certificates=certificate)
        with grpc.secure_channel(effector.address, credentials) as channel:
            assert is_serving(channel), "health checks need no token"
            refusals: set[str] = set()
            for metadata in ((), (("authorization", f"Bearer {WRONG_TOKEN}"),)):
                refusals |= refused_codes(channel, metadata)
            assert refusals == {"UNAUTHENTICATED: missing or invalid bearer token"}
            said.extend(refusals)
        with EffectorClient(effector.address, token=TOKEN, root_certificates=certificate) as ok:
            status = ok.status()
            assert (status.done, status.in_flight, status.head_offset) == (0, 0, 0)

        # Plaintext to the TLS port fails; TLS with the token runs the whole loop.
        with grpc.insecure_channel(effector.address) as plaintext:
            with pytest.raises(grpc.RpcError) as refused:
                EffectorStub(plaintext).Status(StatusRequest(), timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        secure = EffectorConnection(effector.address, token=TOKEN, tls_root_cert=certificate)
        run = run_loop(secure, make_events(20, 5, base_ms=1_000_000), idle_s=1.0)
        assert run.errors == [] and run.dead_letters == []
        assert {output["outcome"] for output in run.outputs} == {"applied"}
        assert len(run.outputs) == 20

        # A pipeline with a wrong token fails with a clear PermissionError, on either side.
        wrong = EffectorConnection(effector.address, token=WRONG_TOKEN, tls_root_cert=certificate)
        with pytest.raises(PermissionError, match="check the token") as submit_failure:
            submit_with(wrong)
        said.append(str(submit_failure.value))
        with pytest.raises(PermissionError, match="check the token") as failure:
            run_pipeline(lambda p: p | ReadEnvelopes(wrong, stop_when_idle_s=0.5))
        said.append(str(failure.value))

        # The operator's CLI, with the token and with a wrong one.
        target_args = ("--target", effector.address, "--tls-root-cert", str(tmp_path / "cert.pem"))
        good = run_cli("status", *target_args, "--token-file", str(tmp_path / "token"))
        bad = run_cli("status", *target_args, "--token", WRONG_TOKEN)
        assert good.returncode == 0 and '"done": 20' in good.stdout, good.stderr
        assert bad.returncode == 1 and "UNAUTHENTICATED" in bad.stderr, bad.stderr
        said.extend([good.stdout, good.stderr, bad.stdout, bad.stderr])

    # A non-loopback bind without a token is refused before anything binds: with the port
    # held on 127.0.0.1, a bind of 0.0.0.0 on it would fail "cannot listen", not this way.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        said += refuse_open_binds(
            tmp_path,
            lambda host: ("--listen", f"{host}:{port}"),
            "refusing to listen on non-loopback",
        )

    logs = "\n".join(effector.logs)
    assert "DEBUG" in logs, "the effector should have logged at DEBUG level"
    leaks = [secret for secret in secrets if any(secret in text for text in [logs, *said])]
    assert leaks == [], "a secret leaked into a log or message"
    gate_report(
        "security",
        f"rpcs_refused_without_or_with_wrong_token={2 * (len(RPCS) + 1)} (UNAUTHENTICATED) "
        f"health_without_token=SERVING tls_loop_outputs={len(run.outputs)} "
        f"plaintext_to_tls=UNAVAILABLE submit=PermissionError "
        f"reader=PermissionError cli_wrong_token=exit1 open_binds_refused=3 (exit 2, before "
        f"binding) secrets_checked={len(secrets)} log_bytes={len(logs)} leaks=0",
    )


def test_console_token_csrf_loopback_and_no_secret_in_pages(
    tmp_path: Path, ledger: Path, gate_report: Callable[[str, str], None]
) -> None:
    (tmp_path / "token").write_text(TOKEN + "\n")
    args = ("--token-file", str(tmp_path / "token"), "--console-listen", "127.0.0.1:0")
    store = f"sqlite:///{tmp_path / 'effector.db'}"
    approval = make_intent("approval", {"cents": 90_000}, key=b"k", kind=ToolIntent.APPROVAL)
    said: list[str] = []  # every page, header and message the console showed
    with sidecar(store, free_port(), ledger, *args, "--log-level", "DEBUG") as effector:
        url = effector.console_url
        assert url is not None and url.startswith("http://127.0.0.1:")
        metadata = (("authorization", f"Bearer {TOKEN}"),)
        with grpc.insecure_channel(effector.address) as channel:
            stub = EffectorStub(channel)
            stub.Submit(SubmitRequest(intents=[approval]), metadata=metadata, timeout=10)
            error = failed_event(b"k", b'{"refund": "r-1"}')
            stub.RecordErrors(RecordErrorsRequest(errors=[error]), metadata=metadata, timeout=10)
        with EffectorClient(effector.address, token=TOKEN) as client:
            [stored_error] = effector_errors(url, TOKEN)
            pages = ["/", "/keys", "/keys/6b", "/intents", f"/intents/{approval.intent_id}"]
            pages += ["/approvals", "/errors", f"/errors/{stored_error}"]
            pages += [f"/errors/{stored_error}/redrive"]
            posts = [f"/approvals/{approval.intent_id}", f"/errors/{stored_error}/redrive"]
            decision = {"decision": "approve", "approver": "mallory"}

            # Without a session: every page sends to the login, every POST is refused.
            with httpx.Client(base_url=url.rstrip("/")) as anonymous:
                for path in pages:
                    answer = anonymous.get(path)
                    assert answer.status_code == 303, path
                    assert answer.headers["location"].startswith("/login?next="), path
                for path in posts:
                    refused = anonymous.post(path, data={**decision, "csrf_token": "x"})
                    assert refused.status_code == 403, path
                    said.append(refused.text)
                wrong = anonymous.post("/login", data={"token": WRONG_TOKEN})
                assert wrong.status_code == 403 and "set-cookie" not in wrong.headers
                said.extend([wrong.text, anonymous.get("/login").text])
            assert client.status().awaiting_decision == 1
            assert client.read(1).records == [], "nothing was published"

            # With the token: a session cookie derived from it; CSRF and same-origin hold.
            with httpx.Client(base_url=url.rstrip("/")) as operator:
                login = operator.post("/login", data={"token": TOKEN})
                cookie = login.headers["set-cookie"]
                assert login.status_code == 303 and "HttpOnly" in cookie
                assert "SameSite=strict" in cookie
                shown = [operator.get(path) for path in pages]
                assert [page.status_code for page in shown] == [200] * len(pages)
                csrf = csrf_of(shown[5].text)
                target = posts[0]
                assert operator.post(target, data=decision).status_code == 403
                cross = {"Origin": "http://evil.example"}
                assert (
                    operator.post(
                        target, data={**decision, "csrf_token": csrf}, headers=cross
                    ).status_code
                    == 403
                )
                assert client.status().awaiting_decision == 1
                decided = operator.post(target, data={**decision, "csrf_token": csrf})
                assert decided.status_code == 303
                said.extend([cookie, *(page.text for page in shown)])
                said.extend(
                    f"{name}: {value}" for page in shown for name, value in page.headers.items()
                )
            assert client.status().awaiting_decision == 0

    # The console binds loopback unless told otherwise; elsewhere it needs the token.
    said += refuse_open_binds(
        tmp_path,
        lambda host: ("--listen", "127.0.0.1:0", "--console-listen", f"{host}:0"),
        "refusing to serve the console on non-loopback",
    )

    logs = "\n".join(effector.logs)
    leaks = [secret for secret in (TOKEN, WRONG_TOKEN) if any(secret in t for t in [logs, *said])]
    assert leaks == [], "a secret leaked into a page, header, log or message"
    gate_report(
        "security",
        f"console: pages_without_session=login ({len(pages)}) posts_without_session=403 "
        f"({len(posts)}) wrong_token_login=403 post_without_csrf=403 cross_origin_post=403 "
        f"open_console_binds_refused={len(OPEN_HOSTS)} (exit 2, before binding) "
        f"pages_checked_for_secrets={len(pages)} leaks=0",
    )


def refuse_open_binds(
    tmp_path: Path, listen_on: Callable[[str], tuple[str, ...]], refusal: str
) -> list[str]:
    """``serve`` without a token with ``listen_on(host)`` for each non-loopback host: each
    exits 2 saying ``refusal`` before it opens its store. Returns what they printed."""
    said = []
    for host in OPEN_HOSTS:
        refused_store = tmp_path / f"never-{uuid.uuid4().hex}.db"
        opened = run_cli(
            "serve",
            *("--tools", REGISTRY_SPEC, "--store", f"sqlite:///{refused_store}"),
            *listen_on(host),
        )
        assert opened.returncode == 2, opened.stderr
        assert refusal in opened.stderr, opened.stderr
        assert not refused_store.exists(), "the store was opened before the refusal"
        said.extend([opened.stdout, opened.stderr])
    return said


def effector_errors(url: str, token: str) -> list[str]:
    """The ids of the errors the console lists (read through the console itself)."""
    with httpx.Client(base_url=url.rstrip("/")) as reader:
        reader.post("/login", data={"token": token})
        return re.findall(r'href="/errors/([0-9a-f]+)"', reader.get("/errors").text)
