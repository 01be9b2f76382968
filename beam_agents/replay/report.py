"""The backtest report: per-key results summed up, rendered as JSON, Markdown and HTML.

:func:`build_report` turns the per-key results of ``keyrun.KeyBacktest`` into one JSON object
(everything sorted, nothing from the clock, so equal inputs give byte-identical reports) and
:func:`render_markdown` and :func:`render_html` draw the same tables from it. Cost is estimated
from a price table (:class:`Price` per model, per million tokens) the user passes. A backtest
over envelopes has no recorded side: what compares with one is ``null`` (:data:`COMPARED`) and
the candidate's own decisions are counted instead.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

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


COMPARED = (
    "runs_changed",
    "keys_changed",
    "decisions_changed_per_key",
    "outputs_changed",
    "top_changes",
    "changed_runs",
)
"""What only a backtest with a recorded side reports (``null`` without one)."""
CANDIDATE_ONLY = ("envelopes_skipped", "top_decisions", "candidate_runs")
"""What only a backtest over envelopes (no recorded side) reports (``null`` with one)."""
NO_BASELINE = "no baseline (a backtest over envelopes has no recorded side to compare with)"


def _by_tool(lines: Sequence[str], by_tool: dict[str, Counter[str]]) -> None:
    """Count the intent lines of a run's changes (``added``, ``removed``) or decisions."""
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
    """The whole report as JSON data (see the module docstring).

    ``baseline``: the results compare the candidate with a recording (``KeyBacktest.run``);
    else they are the candidate's alone (``KeyBacktest.run_envelopes``) and what compares is
    ``null``, the candidate's decisions counted instead of changes.
    """
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
        if result[listed]:
            per_key.append(
                {"key": result["key"], "runs": result["runs"], "changed": len(result[listed])}
            )
        for run in result[listed]:
            found = run[lines_of]
            outputs_changed += any(change.startswith("output") for change in found)
            waits += any(change.startswith("waits") for change in found)
            failed += any(change.startswith("activation failed") for change in found)
            _by_tool(found, by_tool)
            for change in sorted(set(found)):
                common[change] += 1
                shown = examples.setdefault(change, [])
                if len(shown) < EXAMPLES_PER_CHANGE:
                    shown.append({"key": result["key"], "seq": run["seq"]})
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
    for field in CANDIDATE_ONLY if baseline else COMPARED:
        report[field] = None
    if not baseline:
        report["cost"]["recorded"] = report["cost"]["delta"] = None
    return report


Table = tuple[str, list[str], list[list[str]] | None]
"""A section's title, column headers and rows (``None``: it compares, and there is no baseline)."""


def _summary(report: Mapping[str, Any]) -> list[str]:
    """The report's summary lines."""
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
        f"Runs that wait on a new effect: {report['runs_waiting_on_new_effects']:,}; runs with a "
        f"failed activation: {report['runs_failed']:,}"
        + ("; drift: a new model or tool call under --strict." if report["drift"] else "."),
    ]


def _sections(report: Mapping[str, Any]) -> tuple[list[str], list[Table]]:
    """The report's summary lines and tables, for either rendering."""
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
    """What a section without rows says."""
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
