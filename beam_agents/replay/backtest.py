# mypy: disallow-untyped-calls=False
# (Beam's own API is mostly unannotated; the pipeline is glue around it.)
"""``beam-agents backtest``: a candidate agent over recorded history, as a Beam batch pipeline.

Each key's records (or envelopes) run through :class:`KeyBacktest`; nothing is executed.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from beam_agents._protos import ActivationRecord, AgentEnvelope, RecordedMemory, canonical_json
from beam_agents.core.config import AgentConfig
from beam_agents.core.context import AgentFn
from beam_agents.core.observability import PLAIN_DECODER, decoder_name
from beam_agents.replay.inputs import (
    BadInput,
    by_key,
    envelope_files,
    expand,
    load_agent,
    load_config,
    make_provider,
    read_envelope_file,
    read_file,
)
from beam_agents.replay.offline import (
    TRIGGER_EVENT,
    KeyCells,
    OfflineActivator,
    PooledModel,
    PooledTools,
    Progress,
    Usage,
    cells_for,
    check_records,
)

WAITS = "waits on a new effect"
FAILED = "activation failed"


@dataclass
class RunSide:
    """What one side (recorded or candidate) did in one run: outputs, intents, failures."""

    outputs: list[str] = field(default_factory=list)
    intents: list[tuple[str, str]] = field(default_factory=list)
    ids: dict[str, tuple[str, str]] = field(default_factory=dict)
    activations: int = 0
    error: str = ""
    waits: bool = False

    def add(self, record: ActivationRecord) -> None:
        """Count one committed activation."""
        self.activations += 1
        if record.outcome == ActivationRecord.COMPLETE and record.output:
            self.outputs.append(record.output.decode("utf-8", errors="backslashreplace"))
        for intent in record.intents:
            self.intents.append((intent.tool_name, intent.args_json))
            self.ids[intent.intent_id] = (intent.tool_name, intent.args_json)

    def as_json(self) -> dict[str, Any]:
        """The side as JSON data."""
        data: dict[str, Any] = {
            "outputs": self.outputs,
            "intents": [{"tool": tool, "args": args} for tool, args in sorted(self.intents)],
        }
        if self.error:
            data["error"] = self.error
        if self.waits:
            data["waits"] = True
        return data


def key_text(key: bytes) -> str:
    """A key as the report shows it: its text when printable, else ``hex:...``."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + key.hex()
    return text if text.isprintable() and not text.startswith("hex:") else "hex:" + key.hex()


def _short(value: object) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _output_changes(recorded: list[str], candidate: list[str]) -> list[str]:
    if recorded == candidate:
        return []
    if not candidate or not recorded:
        return ["output removed" if recorded else "output added"]
    try:
        [mine] = recorded
        [theirs] = candidate
        old, new = json.loads(mine), json.loads(theirs)
    except ValueError:
        return ["output changed"]
    if not (isinstance(old, dict) and isinstance(new, dict)):
        return ["output changed"]
    return [
        f"output.{name}: {_short(old.get(name))} -> {_short(new.get(name))}"
        for name in sorted(old.keys() | new.keys())
        if old.get(name) != new.get(name)
    ]


def changes(recorded: RunSide, candidate: RunSide) -> list[str]:
    """What changed in a run's decision, each as a short, groupable line."""
    found = _output_changes(recorded.outputs, candidate.outputs)
    mine, theirs = Counter(recorded.intents), Counter(candidate.intents)
    found += [f"intent added: {tool}" for tool, _ in sorted((theirs - mine).elements())]
    found += [f"intent removed: {tool}" for tool, _ in sorted((mine - theirs).elements())]
    if candidate.error:
        found.append(f"{FAILED}: {candidate.error}")
    if candidate.waits:
        found.append(WAITS)
    return found


def decisions(side: RunSide) -> list[str]:
    """What a run decided, as groupable lines: for a backtest with no recorded side."""
    found = []
    for output in side.outputs:
        try:
            value = json.loads(output)
        except ValueError:
            value = output
        if isinstance(value, dict):
            found += [f"output.{name}: {_short(value[name])}" for name in sorted(value)]
        else:
            found.append(f"output: {_short(value)}")
    found += [f"intent: {tool}" for tool, _ in sorted(side.intents)]
    if side.error:
        found.append(f"{FAILED}: {side.error}")
    if side.waits:
        found.append(WAITS)
    return found or ["no output"]


@dataclass
class RunPair:
    """One run as recorded and as the candidate did it."""

    seq: int
    recorded: RunSide = field(default_factory=RunSide)
    candidate: RunSide = field(default_factory=RunSide)

    def as_json(self, found: list[str]) -> dict[str, Any]:
        """The run, with what changed in it (``found``), as JSON data."""
        recorded, candidate = self.recorded.as_json(), self.candidate.as_json()
        return {"seq": self.seq, "changes": found, "recorded": recorded, "candidate": candidate}


class KeyBacktest:
    """Backtests keys one at a time with an offline activator whose calls the pools answer.

    A recorded result or approval is fed only if the candidate waits for the same intent.
    """

    def __init__(self, agent: AgentFn, config: AgentConfig, *, strict: bool) -> None:
        progress = Progress()
        self._model = PooledModel(make_provider(config), progress, strict=strict)
        self._tools = PooledTools(Usage(), progress, strict=strict)
        self._activator = OfflineActivator(
            agent, config, self._model, self._tools, progress, retry=True
        )

    def close(self) -> None:
        """Close the candidate's provider and the event loop."""
        self._activator.close()

    def run(self, records: Sequence[ActivationRecord]) -> dict[str, Any]:
        """Backtest one key's records (in commit order); the key's result."""
        runs, usage, drift = self.walk(records)
        return _key_result(records[0].entity_key, runs, usage, records, drift)

    def walk(
        self, records: Sequence[ActivationRecord], memory: RecordedMemory | None = None
    ) -> tuple[list[RunPair], Usage, bool]:
        """Run the candidate over one key's records (``memory``: before them, if not recorded)."""
        check_records(records, self._model.decoder_name, self._activator.namespace)
        usage = self._model.usage = self._tools.usage = Usage()
        self._model.start_key(records)
        self._tools.start_key(records)
        key = records[0].entity_key
        cells = cells_for(records[0], [], memory)
        runs: list[RunPair] = []
        drift = False
        for record in records:
            if not runs or (record.trigger == TRIGGER_EVENT and record.seq != runs[-1].seq):
                new_run = record.trigger == TRIGGER_EVENT
                self._close(runs, cells, record.seq if new_run else None)
                runs.append(RunPair(record.seq))
            run = runs[-1]
            run.recorded.add(record)
            if self._fed(record, run, cells):
                fed = self._feed(run, cells, key, record.envelope, record.intent_namespace)
                drift = fed or drift
        self._close(runs, cells, None)
        return runs, usage, drift

    def run_envelopes(self, key: bytes, envelopes: Sequence[AgentEnvelope]) -> dict[str, Any]:
        """Run the candidate over one key's envelopes from a new key; results and approvals skip."""
        usage = self._model.usage = self._tools.usage = Usage()
        self._model.start_key(())
        self._tools.start_key(())
        cells = KeyCells()
        runs: list[RunPair] = []
        drift, skipped = False, 0
        for envelope in envelopes:
            if envelope.WhichOneof("payload") != "external_event":
                skipped += 1
                continue
            self._close(runs, cells, cells.state().header.next_seq)
            runs.append(RunPair(cells.state().header.next_seq))
            drift = self._feed(runs[-1], cells, key, envelope) or drift
        self._close(runs, cells, None)
        return _envelope_result(key, runs, usage, drift, skipped)

    def _feed(
        self,
        run: RunPair,
        cells: KeyCells,
        key: bytes,
        envelope: AgentEnvelope,
        namespace: str = "",
    ) -> bool:
        """Run ``envelope`` as part of ``run``; whether a call went unanswered (drift)."""
        self._model.miss = self._tools.miss = None
        plan = self._activator.element(cells, key, envelope, namespace)
        for committed in plan.records:
            run.candidate.add(committed)
        if plan.errors and not plan.records:
            run.candidate.error = plan.errors[0].reason
        return self._model.miss is not None or self._tools.miss is not None

    def _fed(self, record: ActivationRecord, run: RunPair, cells: KeyCells) -> bool:
        if record.trigger == TRIGGER_EVENT:
            return True
        answer = _answered_intent(record.envelope)
        suspended = cells.continuation
        if suspended is None or answer not in suspended.pending_intent_ids:
            return False
        # The same intent on both sides (or, for a run older than the recording, on neither).
        return run.candidate.ids.get(answer) == run.recorded.ids.get(answer)

    def _close(self, runs: list[RunPair], cells: KeyCells, next_seq: int | None) -> None:
        suspended = cells.continuation
        if runs and suspended is not None:
            run = runs[-1]
            pending = set(suspended.pending_intent_ids)
            unrecorded = {
                intent_id
                for intent_id in pending
                if run.candidate.ids.get(intent_id) != run.recorded.ids.get(intent_id)
            }
            run.candidate.waits = bool(unrecorded)
        if next_seq is not None:
            cells.end_run(next_seq)


def _answered_intent(envelope: AgentEnvelope) -> str:
    if envelope.WhichOneof("payload") == "approval":
        return envelope.approval.intent_id
    return envelope.tool_result.intent_id


def _tokens(records: Sequence[ActivationRecord]) -> dict[str, list[int]]:
    usage = Usage()
    for record in records:
        for call in record.model_calls:
            usage.spend(call.model, call.input_tokens, call.output_tokens)
    return usage.tokens or {}


def _key_result(
    key: bytes, runs: list[RunPair], usage: Usage, records: Sequence[ActivationRecord], drift: bool
) -> dict[str, Any]:
    found = [(run, changes(run.recorded, run.candidate)) for run in runs]
    changed = [run.as_json(lines) for run, lines in found if lines]
    return {
        "key": key_text(key),
        "runs": len(runs),
        "activations": {
            "recorded": len(records),
            "candidate": sum(run.candidate.activations for run in runs),
        },
        "changed": changed,
        "model_calls": {"reused": usage.reused, "new": usage.new},
        "new_tool_calls": usage.new_tool_calls,
        "tokens": {"recorded": _tokens(records), "candidate": usage.tokens or {}},
        "drift": drift,
    }


def _envelope_result(
    key: bytes, runs: list[RunPair], usage: Usage, drift: bool, skipped: int
) -> dict[str, Any]:
    return {
        "key": key_text(key),
        "runs": len(runs),
        "activations": {"candidate": sum(run.candidate.activations for run in runs)},
        "decided": [
            {
                "seq": run.seq,
                "decisions": decisions(run.candidate),
                "candidate": run.candidate.as_json(),
            }
            for run in runs
        ],
        "model_calls": {"reused": usage.reused, "new": usage.new},
        "new_tool_calls": usage.new_tool_calls,
        "tokens": {"candidate": usage.tokens or {}},
        "drift": drift,
        "envelopes_skipped": skipped,
    }


# -- the pipeline -------------------------------------------------------------------------
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
    """Runs the candidate over each key's input (envelopes in event-time order); JSON out."""

    def __init__(self, agent: str, config: str | None, strict: bool, envelopes: bool) -> None:
        super().__init__()
        self._agent_spec = agent
        self._config_spec = config
        self._strict = strict
        self._envelopes = envelopes

    def setup(self) -> None:
        config = load_config(self._config_spec)
        agent = load_agent(self._agent_spec)
        self._keys = KeyBacktest(agent, config, strict=self._strict)

    def process(self, element: tuple[bytes, Any]) -> Iterator[str]:
        key, items = element
        if self._envelopes:
            envelopes = [AgentEnvelope.FromString(placed[-1]) for placed in sorted(items)]
            yield canonical_json(self._keys.run_envelopes(key, envelopes))
        else:
            yield canonical_json(self._keys.run(by_key(items)[key]))

    def teardown(self) -> None:
        self._keys.close()


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
    """Backtest ``agent`` (``module:function``) over the records (or envelopes) in ``paths``.

    Bad input and a failed pipeline raise :class:`BadInput`.
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


# -- the report ---------------------------------------------------------------------------
TOP_CHANGES = 10
EXAMPLES_PER_CHANGE = 3
KEYS_SHOWN = 50


@dataclass(frozen=True)
class Price:
    """What a model costs, in currency units per million input and output tokens."""

    input_per_mtok: float
    output_per_mtok: float

    def cost(self, input_tokens: int, output_tokens: int) -> float:
        """The cost of that many tokens."""
        return (input_tokens * self.input_per_mtok + output_tokens * self.output_per_mtok) / 1e6


def parse_prices(table: object) -> dict[str, Price]:
    """A price table from JSON data: ``{model: {"input_per_mtok": x, "output_per_mtok": y}}``."""
    if not isinstance(table, dict):
        raise ValueError("the price table must be a JSON object of model name to prices")
    prices = {}
    for model, entry in table.items():
        try:
            prices[str(model)] = Price(
                float(entry["input_per_mtok"]), float(entry["output_per_mtok"])
            )
        except (TypeError, KeyError, ValueError):
            raise ValueError(
                f"price of {model!r} needs numbers input_per_mtok and output_per_mtok"
            ) from None
    return prices


def _add_tokens(total: dict[str, list[int]], spent: Mapping[str, Sequence[int]]) -> None:
    for model, (input_tokens, output_tokens) in spent.items():
        counted = total.setdefault(model, [0, 0])
        counted[0] += input_tokens
        counted[1] += output_tokens


def _cost(tokens: Mapping[str, Sequence[int]], prices: Mapping[str, Price]) -> float:
    return round(sum(prices[m].cost(i, o) for m, (i, o) in tokens.items() if m in prices), 6)


# What only a backtest with (COMPARED) or without (CANDIDATE_ONLY) a recorded side reports.
COMPARED = (
    "runs_changed",
    "keys_changed",
    "decisions_changed_per_key",
    "outputs_changed",
    "top_changes",
    "changed_runs",
)
CANDIDATE_ONLY = ("envelopes_skipped", "top_decisions", "candidate_runs")
NO_BASELINE = "no baseline (a backtest over envelopes has no recorded side to compare with)"


def _by_tool(lines: Sequence[str], by_tool: dict[str, Counter[str]]) -> None:
    for line in lines:
        verb, _, tool = line.partition(": ")
        if verb in ("intent added", "intent removed"):
            by_tool.setdefault(tool, Counter())[verb.split()[1]] += 1
        elif verb == "intent":
            by_tool.setdefault(tool, Counter())["candidate"] += 1


def build_report(
    results: Sequence[Mapping[str, Any]],
    prices: Mapping[str, Price],
    candidate: str,
    *,
    baseline: bool = True,
) -> dict[str, Any]:
    """The whole report as JSON data: sorted, nothing from the clock (no baseline: no compares)."""
    results = sorted(results, key=lambda result: str(result["key"]))
    sides = ("recorded", "candidate") if baseline else ("candidate",)
    tokens: dict[str, dict[str, list[int]]] = {"recorded": {}, "candidate": {}}
    by_tool: dict[str, Counter[str]] = {}
    common: Counter[str] = Counter()
    examples: dict[str, list[dict[str, Any]]] = {}
    per_key, outputs_changed, waits, failed = [], 0, 0, 0
    listed, lines_of = ("changed", "changes") if baseline else ("decided", "decisions")
    for result in results:
        for side in sides:
            _add_tokens(tokens[side], result["tokens"][side])
        changed = 0
        for run in result[listed]:
            found = run[lines_of]
            if any(change.startswith(FAILED) for change in found):
                failed += 1  # counted apart: a failed run's decision is unknown, not changed
            else:
                changed += 1
                outputs_changed += any(change.startswith("output") for change in found)
            waits += any(change.startswith("waits") for change in found)
            _by_tool(found, by_tool)
            for change in sorted(set(found)):
                common[change] += 1
                shown = examples.setdefault(change, [])
                if len(shown) < EXAMPLES_PER_CHANGE:
                    shown.append({"key": result["key"], "seq": run["seq"]})
        if changed:
            per_key.append({"key": result["key"], "runs": result["runs"], "changed": changed})
    models = sorted(tokens["recorded"].keys() | tokens["candidate"].keys())
    cost = {side: _cost(tokens[side], prices) for side in tokens}
    shared = 1 if baseline else 2  # a decision of one run alone (an id, say) is not common
    ranked = sorted(common.items(), key=lambda item: (-item[1], item[0]))
    top = [(change, count) for change, count in ranked if count >= shared][:TOP_CHANGES]
    name = "change" if baseline else "decision"
    runs = [{"key": result["key"], **run} for result in results for run in result[listed]]
    report = {
        "input": "records" if baseline else "envelopes",
        "baseline": baseline,
        "candidate": candidate,
        "keys": len(results),
        "runs": sum(result["runs"] for result in results),
        "envelopes_skipped": sum(result.get("envelopes_skipped", 0) for result in results),
        "activations": {
            side: sum(result["activations"][side] for result in results) if side in sides else None
            for side in ("recorded", "candidate")
        },
        "runs_changed": sum(entry["changed"] for entry in per_key),
        "keys_changed": [entry["key"] for entry in per_key],
        "decisions_changed_per_key": per_key,
        "outputs_changed": outputs_changed,
        "runs_waiting_on_new_effects": waits,
        "runs_failed": failed,
        "intents_by_tool": {
            tool: dict(sorted(counts.items()))
            if not baseline
            else {"added": counts["added"], "removed": counts["removed"]}
            for tool, counts in sorted(by_tool.items())
        },
        "model_calls": {
            kind: sum(result["model_calls"][kind] for result in results)
            for kind in ("reused", "new")
        },
        "new_tool_calls": sum(result["new_tool_calls"] for result in results),
        "drift": any(result["drift"] for result in results),
        "tokens": {side: {m: tokens[side][m] for m in sorted(tokens[side])} for side in tokens},
        "cost": {
            **cost,
            "delta": round(cost["candidate"] - cost["recorded"], 6),
            "unpriced_models": [model for model in models if model not in prices],
        },
        "top_changes": [
            {name: change, "runs": count, "examples": examples[change]} for change, count in top
        ],
        "changed_runs": runs,
    }
    report["top_decisions"], report["candidate_runs"] = report["top_changes"], runs
    for absent in CANDIDATE_ONLY if baseline else COMPARED:
        report[absent] = None
    if not baseline:
        report["cost"]["recorded"] = report["cost"]["delta"] = None
    return report


Table = tuple[str, list[str], list[list[str]] | None]  # title, headers, rows (None: no baseline)


def _summary(report: Mapping[str, Any]) -> list[str]:
    tokens, cost = report["tokens"], report["cost"]

    def total(side: str, index: int) -> int:
        return sum(counts[index] for counts in tokens[side].values())

    unpriced = (
        f"; no price for {', '.join(cost['unpriced_models'])}" if cost["unpriced_models"] else ""
    )
    if report["baseline"]:
        head = [
            f"Candidate `{report['candidate']}` over {report['activations']['recorded']:,} "
            f"recorded activations ({report['runs']:,} runs) on {report['keys']:,} keys.",
            f"Runs whose decision changed: {report['runs_changed']:,}, on "
            f"{len(report['keys_changed']):,} keys; outputs changed: "
            f"{report['outputs_changed']:,}.",
            f"Runs with a failed activation: {report['runs_failed']:,} "
            "(counted apart: their decision is unknown, not changed).",
        ]
        spent = [
            f"Tokens in/out: recorded {total('recorded', 0):,}/{total('recorded', 1):,}, "
            f"candidate {total('candidate', 0):,}/{total('candidate', 1):,}.",
            f"Estimated cost: {cost['recorded']:.6f} recorded, {cost['candidate']:.6f} candidate "
            f"(delta {cost['delta']:+.6f}){unpriced}.",
        ]
    else:
        skipped = report["envelopes_skipped"]
        head = [
            f"Candidate `{report['candidate']}` over {report['runs']:,} external events "
            f"({report['activations']['candidate']:,} activations) on {report['keys']:,} keys"
            + (f"; {skipped:,} result and approval envelopes skipped." if skipped else "."),
            f"Decisions changed: {NO_BASELINE}; the candidate's own decisions are listed.",
            f"Runs with a failed activation: {report['runs_failed']:,}.",
        ]
        spent = [
            f"Tokens in/out: candidate {total('candidate', 0):,}/{total('candidate', 1):,}.",
            f"Estimated cost: {cost['candidate']:.6f} candidate; no baseline{unpriced}.",
        ]
    return [
        *head,
        f"Model calls: {report['model_calls']['reused']:,} answered from the record, "
        f"{report['model_calls']['new']:,} new; new read-only tool calls: "
        f"{report['new_tool_calls']:,}.",
        *spent,
        f"Runs that wait on a new effect: {report['runs_waiting_on_new_effects']:,}"
        + ("; drift: a new model or tool call under --strict." if report["drift"] else "."),
    ]


def _sections(report: Mapping[str, Any]) -> tuple[list[str], list[Table]]:
    baseline = report["baseline"]
    counted = ("added", "removed") if baseline else ("candidate",)
    tools = [
        [tool, *(str(counts.get(column, 0)) for column in counted)]
        for tool, counts in report["intents_by_tool"].items()
    ]
    keys: list[list[str]] | None = None
    if baseline:
        keys = [
            [entry["key"], str(entry["runs"]), str(entry["changed"])]
            for entry in report["decisions_changed_per_key"][:KEYS_SHOWN]
        ]
        hidden = len(report["decisions_changed_per_key"]) - KEYS_SHOWN
        if hidden > 0:
            keys.append([f"... and {hidden} more keys (see the JSON report)", "", ""])
    name = "change" if baseline else "decision"
    top = [
        [
            str(rank),
            entry[name],
            str(entry["runs"]),
            ", ".join(f"{e['key']} seq {e['seq']}" for e in entry["examples"]),
        ]
        for rank, entry in enumerate(report["top_changes" if baseline else "top_decisions"], 1)
    ]
    return _summary(report), [
        (
            "Intents added and removed, by tool"
            if baseline
            else "The candidate's intents, by tool",
            ["tool", *counted],
            tools,
        ),
        ("Decisions changed per key", ["key", "runs", "changed"], keys),
        (f"Most common {name}s", ["#", name, "runs", "examples"], top),
    ]


def _empty(rows: list[list[str]] | None) -> str:
    return "None." if rows is not None else NO_BASELINE[0].upper() + NO_BASELINE[1:] + "."


def render_markdown(report: Mapping[str, Any]) -> str:
    """The report as Markdown."""
    summary, tables = _sections(report)
    lines = ["# Backtest report", "", *(f"- {line}" for line in summary)]
    for title, headers, rows in tables:
        lines += ["", f"## {title}", ""]
        if not rows:
            lines.append(_empty(rows))
            continue
        lines.append("| " + " | ".join(headers) + " |")
        lines.append("|" + "---|" * len(headers))
        lines += [
            "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows
        ]
    return "\n".join(lines) + "\n"


def render_html(report: Mapping[str, Any]) -> str:
    """The report as a self-contained HTML page."""
    summary, tables = _sections(report)
    out = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8"><title>Backtest report</title>',
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}</style></head><body>",
        "<h1>Backtest report</h1>",
        "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in summary) + "</ul>",
    ]
    for title, headers, rows in tables:
        out.append(f"<h2>{html.escape(title)}</h2>")
        if not rows:
            out.append(f"<p>{html.escape(_empty(rows))}</p>")
            continue
        head = "".join(f"<th>{html.escape(header)}</th>" for header in headers)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
            for row in rows
        )
        out.append(f"<table><tr>{head}</tr>{body}</table>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"
