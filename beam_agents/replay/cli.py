"""The ``beam-agents`` command: ``replay`` and ``backtest`` (``python -m beam_agents.replay``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from collections.abc import Sequence
from typing import NoReturn

from beam_agents._protos import ActivationRecord
from beam_agents.replay.backtest import Price, key_text, parse_prices, render_markdown, run_backtest
from beam_agents.replay.inputs import (
    BadInput,
    FramedFileError,
    by_key,
    connect,
    load_agent,
    load_config,
    parse_key,
    read_records,
    read_stored,
)
from beam_agents.replay.replay import (
    EXIT_BAD_INPUT,
    EXIT_DIVERGENT,
    EXIT_DRIFT,
    EXIT_SAME,
    RunReport,
    exit_status,
    fork,
    replay,
)

PROG = "beam-agents"
_SHOWN = 200  # characters of a step's description shown in text output


class _Parser(argparse.ArgumentParser):
    """Usage errors are bad input: one line on stderr, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Replay and backtest recorded agent runs.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    replaying = commands.add_parser(
        "replay", help="replay recorded runs against the current agent code, offline"
    )
    backtesting = commands.add_parser(
        "backtest", help="run a candidate agent over recorded history as a Beam batch pipeline"
    )
    files = "records files, directories or globs"
    for sub, given, what in (
        (replaying, "*", files),
        (backtesting, "+", f"{files} (with --envelopes: envelope files)"),
    ):
        sub.add_argument("records", nargs=given, metavar="PATH", help=what)
        sub.add_argument("--config", metavar="MODULE:FACTORY", help="AgentConfig factory")
        sub.add_argument("--json", action="store_true", help="print a JSON report")
    replaying.add_argument("--agent", required=True, metavar="MODULE:FUNCTION")
    replaying.add_argument(
        "--effector", metavar="HOST:PORT", help="read --key's records from this effector"
    )
    replaying.add_argument("--token-env", metavar="NAME", help="--effector's token is in $NAME")
    replaying.add_argument("--tls-root-cert", metavar="PEM", help="--effector uses TLS")
    replaying.add_argument("--key", help="replay only this key (text, or hex:...)")
    replaying.add_argument("--fork-at", type=int, metavar="SEQ", help="continue from run SEQ")
    replaying.add_argument("--candidate", metavar="MODULE:FUNCTION", help="agent for --fork-at")
    replaying.add_argument("--strict", action="store_true", help="--fork-at: no new model calls")
    backtesting.add_argument(
        "--agent", "--candidate", dest="agent", required=True, metavar="MODULE:FUNCTION"
    )
    backtesting.add_argument(
        "--envelopes",
        action="store_true",
        help="the paths are envelope files to run, with no recording (no baseline)",
    )
    backtesting.add_argument("--strict", action="store_true", help="new model calls are drift")
    backtesting.add_argument("--out", help="report directory (default: a new temporary one)")
    backtesting.add_argument("--prices", metavar="FILE", help="JSON price table per model")
    return parser


def _clip(text: str) -> str:
    return text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "..."


def load_prices(path: str | None) -> dict[str, Price]:
    """The price table in the JSON file ``path`` (none: no prices)."""
    if path is None:
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            return parse_prices(json.load(handle))
    except (OSError, ValueError) as problem:
        raise BadInput(f"--prices {path}: {problem}") from None


def _print_run(report: RunReport) -> None:
    where = f"{key_text(report.key)} seq {report.seq}"
    divergence = report.divergence
    if divergence is None:
        print(f"{where}: same ({report.activations} activations)")
        return
    step = "" if divergence.step is None else f", step {divergence.step}"
    print(
        f"{where}: {divergence.status} at activation {report.activation} ({report.trigger})"
        f"{step}: {divergence.kind}"
    )
    print(f"  recorded: {_clip(divergence.recorded)}")
    print(f"  replayed: {_clip(divergence.replayed)}")
    for line in divergence.diff:
        print(f"  {line}")


def _recording(options: argparse.Namespace, namespace: str) -> dict[bytes, list[ActivationRecord]]:
    """The records to replay; read from an effector, only the runs of ``namespace``."""
    if options.effector is None:
        if not options.records:
            raise BadInput("nothing to replay: give records files, or --effector with --key")
        return by_key(read_records(options.records))
    if options.records or options.key is None:
        raise BadInput("--effector reads one --key's records, instead of records files")
    connection = connect(options.effector, options.token_env, options.tls_root_cert)
    return by_key(read_stored(connection, parse_key(options.key), namespace))


def _replay(options: argparse.Namespace) -> int:
    config = load_config(options.config)
    recording = _recording(options, config.namespace or "")
    if options.key is not None:
        key = parse_key(options.key)
        if key not in recording:
            raise BadInput(
                f"no records for key {options.key!r} (the recording has {len(recording)} keys)"
            )
        recording = {key: recording[key]}
    agent = load_agent(options.agent)
    if options.fork_at is not None or options.candidate is not None:
        if options.fork_at is None or options.candidate is None or options.key is None:
            raise BadInput("--fork-at needs --candidate and --key (and --candidate --fork-at)")
        [records] = recording.values()
        candidate = load_agent(options.candidate)
        return fork(
            records, agent, candidate, config, options.fork_at, options.strict, options.json
        )
    reports = replay(recording, agent, config)
    status = exit_status(reports)
    counts = {
        name: sum(r.status == name for r in reports) for name in ("same", "divergent", "drift")
    }
    if options.json:
        runs = [
            {
                "key": report.key.hex(),
                "seq": report.seq,
                "status": report.status,
                "activations": report.activations,
                **(
                    {}
                    if report.divergence is None
                    else {"activation": report.activation, **report.divergence.as_json()}
                ),
            }
            for report in reports
        ]
        print(json.dumps({"runs": runs, **counts, "exit_status": status}, indent=2))
    else:
        for report in reports:
            _print_run(report)
        summary = ", ".join(f"{count} {name}" for name, count in counts.items())
        print(f"replay: {len(reports)} runs: {summary}")
    return status


def _backtest(options: argparse.Namespace, pipeline_args: Sequence[str]) -> int:
    out = options.out or tempfile.mkdtemp(prefix="beam-agents-backtest-")
    report = run_backtest(
        options.records,
        options.agent,
        options.config,
        out=out,
        strict=options.strict,
        prices=load_prices(options.prices),
        pipeline_args=pipeline_args,
        envelopes=options.envelopes,
    )
    if options.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(render_markdown(report), end="")
    print(f"{PROG} backtest: report.json, report.md and report.html in {out}", file=sys.stderr)
    if report["drift"]:
        return EXIT_DRIFT
    if report["baseline"] and (report["runs_changed"] or report["runs_failed"]):
        return EXIT_DIVERGENT  # a run that failed differs from the recorded one too
    return EXIT_SAME


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; return its exit status."""
    parser = _parser()
    options, extra = parser.parse_known_args(argv)
    if extra and options.command != "backtest":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    runtime_log = logging.getLogger("beam_agents")
    level = runtime_log.level
    runtime_log.setLevel(logging.ERROR)  # the agents' own warnings are not the command's output
    try:
        if options.command == "replay":
            return _replay(options)
        return _backtest(options, extra)
    except (BadInput, FramedFileError) as problem:
        print(f"{PROG} {options.command}: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as problem:  # never exit 1 (divergent) on an unexpected failure
        text = " ".join(str(problem).split())[:500]
        failed = f"failed: {type(problem).__name__}: {text}"
        print(f"{PROG} {options.command}: {failed}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        runtime_log.setLevel(level)
