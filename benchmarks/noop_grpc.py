"""The gRPC floor for the effector benchmark: the ``Effector`` service's Submit, doing nothing.

``python -m benchmarks.noop_grpc --listen 127.0.0.1:0`` serves the same service definition on
the same ``grpc.aio`` server with the same message limits as the effector, in its own process
like the effector. Its Submit parses the request (gRPC does that before any handler) and
acknowledges every intent as accepted, without validating, storing or executing anything, so
it costs what the transport and the messages cost. It prints ``noop listening on HOST:PORT``
once ready and exits on SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import grpc

from beam_agents._protos import (
    EffectorServicer,
    SubmitAck,
    SubmitRequest,
    SubmitResponse,
    add_EffectorServicer_to_server,
)

READY = "noop listening on "
_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


class NoopEffector(EffectorServicer):
    """Acknowledges every submitted intent as accepted, and does nothing else."""

    async def Submit(
        self, request: SubmitRequest, context: grpc.aio.ServicerContext
    ) -> SubmitResponse:
        """One ACCEPTED acknowledgement per intent, in order."""
        return SubmitResponse(
            acks=[
                SubmitAck(intent_id=intent.intent_id, outcome=SubmitAck.ACCEPTED)
                for intent in request.intents
            ]
        )


async def serve(listen: str) -> None:
    """Serve until SIGTERM or SIGINT."""
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ]
    )
    add_EffectorServicer_to_server(NoopEffector(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port(listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await server.start()
    print(f"{READY}{listen.rsplit(':', 1)[0]}:{port}", flush=True)
    await stop.wait()
    await server.stop(grace=1.0)


def main() -> None:
    """Parse ``--listen`` and serve."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: any free)")
    asyncio.run(serve(parser.parse_args().listen))


if __name__ == "__main__":
    main()
