# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; this module is glue around it.)
"""``beam-agents backtest``: a candidate agent over recorded history, as a Beam batch pipeline.

The pipeline reads the records files, keys the records by entity key (as production keys
envelopes), groups each key's history and runs the candidate over it (``keyrun``), on any
runner (the DirectRunner unless pipeline options say otherwise). Over envelope files
(``--envelopes``) it keys and groups the envelopes the same way and runs them from a new key.
Each key's result is written as a JSON line under ``OUT/keys/``; :func:`run_backtest` then
reads them back and writes the report (``report.json``, ``report.md``, ``report.html``) to
``OUT``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents._protos import ActivationRecord, AgentEnvelope, canonical_json
from beam_agents.core.config import AgentConfig
from beam_agents.core.recording import PLAIN_DECODER, decoder_name
from beam_agents.replay.answers import PooledModel, PooledTools, Progress, Usage, check_records
from beam_agents.replay.envelopes import envelope_files, read_envelope_file
from beam_agents.replay.harness import Harness
from beam_agents.replay.keyrun import KeyBacktest
from beam_agents.replay.loading import BadInput, load_agent, load_config, make_provider
from beam_agents.replay.recordfile import by_key, expand, read_file
from beam_agents.replay.report import Price, build_report, render_html, render_markdown

REPORT_FILES = ("report.json", "report.md", "report.html")


Placed = tuple[int, int, int, bytes]
"""An envelope read from a file: its event time, file number, byte offset, and its bytes."""


def _keyed_records(file: tuple[int, str]) -> Iterator[tuple[bytes, ActivationRecord]]:
    for record in read_file(file[1]):
        yield record.entity_key, record


def _keyed_envelopes(file: tuple[int, str]) -> Iterator[tuple[bytes, Placed]]:
    number, name = file
    for offset, envelope in read_envelope_file(name):
        placed = (envelope.event_time_ms, number, offset, envelope.SerializeToString())
        yield envelope.entity_key, placed


class _BacktestKeys(beam.DoFn):
    """Runs the candidate over each key's grouped input; emits the key's result as JSON.

    The input is the key's records, or (``envelopes``) its placed envelopes, run in event-time
    order, ties in the order of the files and within them.
    """

    def __init__(self, agent: str, config: str | None, strict: bool, envelopes: bool) -> None:
        super().__init__()
        self._agent_spec = agent
        self._config_spec = config
        self._strict = strict
        self._envelopes = envelopes

    def setup(self) -> None:
        """Load the candidate and its config; build the harness and its answer pools."""
        config = load_config(self._config_spec)
        provider = make_provider(config)
        progress = Progress()
        model = PooledModel(provider, progress, strict=self._strict)
        tools = PooledTools(Usage(), progress, strict=self._strict)
        agent = load_agent(self._agent_spec)
        self._harness = Harness(agent, config, model, tools, progress, retry=True)
        self._keys = KeyBacktest(self._harness, model, tools)

    def process(self, element: tuple[bytes, Any]) -> Iterator[str]:
        """Backtest one key."""
        key, items = element
        if self._envelopes:
            envelopes = [AgentEnvelope.FromString(placed[-1]) for placed in sorted(items)]
            yield canonical_json(self._keys.run_envelopes(key, envelopes))
        else:
            yield canonical_json(self._keys.run(by_key(items)[key]))

    def teardown(self) -> None:
        """Close the event loop."""
        self._harness.close()


def build(
    pipeline: beam.Pipeline,
    files: Sequence[str],
    agent: str,
    config: str | None,
    *,
    strict: bool,
    out: str,
    envelopes: bool = False,
) -> None:
    """Add the backtest to ``pipeline``: records (or envelope) files in, a JSON line per key out."""
    read = (
        beam.FlatMap(_keyed_envelopes).with_output_types(tuple[bytes, Placed])
        if envelopes
        else beam.FlatMap(_keyed_records).with_output_types(tuple[bytes, ActivationRecord])
    )
    (
        pipeline
        | "Files" >> beam.Create(list(enumerate(files)))
        | "Read" >> read
        | "PerKey" >> beam.GroupByKey()
        | "Backtest" >> beam.ParDo(_BacktestKeys(agent, config, strict, envelopes))
        | "Results"
        >> beam.io.WriteToText(FileSystems.join(out, "keys", "part"), file_name_suffix=".jsonl")
    )


def _clear(pattern: str) -> None:
    found = [m.path for m in FileSystems.match([pattern])[0].metadata_list]
    if found:
        FileSystems.delete(found)


def _write(path: str, text: str) -> None:
    with FileSystems.create(path) as handle:
        handle.write(text.encode("utf-8"))


def _check_input(paths: Sequence[str], config: AgentConfig, envelopes: bool) -> list[str]:
    """The input files, every one read and checked (:class:`BadInput` before any pipeline)."""
    if envelopes:
        return envelope_files(paths)
    files = expand(paths)
    provider = make_provider(config)
    decoder = PLAIN_DECODER if provider is None else decoder_name(provider)
    for name in files:
        check_records(read_file(name), decoder, config.namespace)
    return files


def _run_pipeline(
    files: Sequence[str],
    agent: str,
    config: str | None,
    *,
    strict: bool,
    out: str,
    envelopes: bool,
    pipeline_args: Sequence[str],
) -> None:
    """Build and run the pipeline; its failure (a runner, a worker) is :class:`BadInput`."""
    try:
        with beam.Pipeline(options=PipelineOptions(list(pipeline_args))) as pipeline:
            build(pipeline, files, agent, config, strict=strict, out=out, envelopes=envelopes)
    except Exception as problem:  # any runner may fail in any way: one line, exit 2
        text = " ".join(str(problem).split()) or type(problem).__name__
        raise BadInput(f"the backtest pipeline failed: {text[:500]}") from None


def run_backtest(
    paths: Sequence[str],
    agent: str,
    config: str | None,
    *,
    out: str,
    strict: bool = False,
    prices: dict[str, Price] | None = None,
    pipeline_args: Sequence[str] = (),
    envelopes: bool = False,
) -> dict[str, Any]:
    """Backtest ``agent`` (``module:function``) over the records in ``paths``; the report.

    With ``envelopes``, ``paths`` name envelope files instead, run with no recorded side (the
    report has no baseline). Loads the agent and config, and reads and checks every input file,
    first, so that bad input fails before the pipeline starts; a pipeline that fails is bad
    input too (:class:`BadInput`, exit 2), never an uncaught exception.
    """
    load_agent(agent)
    files = _check_input(paths, load_config(config), envelopes)
    results_pattern = FileSystems.join(out, "keys", "part*")
    _clear(results_pattern)
    _run_pipeline(
        files,
        agent,
        config,
        strict=strict,
        out=out,
        envelopes=envelopes,
        pipeline_args=pipeline_args,
    )
    results: list[dict[str, Any]] = []
    for metadata in FileSystems.match([results_pattern])[0].metadata_list:
        with FileSystems.open(metadata.path) as handle:
            text = handle.read().decode("utf-8")
        results.extend(json.loads(line) for line in text.splitlines() if line)
    report = build_report(results, prices or {}, agent, baseline=not envelopes)
    _write(
        FileSystems.join(out, "report.json"), json.dumps(report, indent=2, sort_keys=True) + "\n"
    )
    _write(FileSystems.join(out, "report.md"), render_markdown(report))
    _write(FileSystems.join(out, "report.html"), render_html(report))
    return report
