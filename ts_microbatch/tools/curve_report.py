"""The sweeps' report: every round's points, P99 compared at equal offered load.

Rounds of a sweep can stop at different rates, so nothing here takes a median over rounds:
a cell gives each round's figure and a rate only some rounds reached says which. Two
variants are compared at the rates both reached by the ratio of their P99s with its
bootstrap interval (intervals.compare_rounds): a win or a loss only when the interval
excludes 1.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from .curves import latencies_of, sustained, without_latencies
from .intervals import compare_rounds

Row = dict[str, Any]
# name -> offered rate -> round -> point
Rounds = dict[str, dict[float, dict[int, Row]]]


def by_round(runs: Iterable[Row]) -> Rounds:
    """Per variant (``handler``), per offered rate, per round (``repeat``): the point."""
    points: Rounds = {}
    for run in runs:
        for row in run.get("curve") or ():
            rates = points.setdefault(run["handler"], {})
            rates.setdefault(row["offered_per_s"], {})[run.get("repeat") or 1] = row
    return points


def rounds_of(runs: Iterable[Row], name: str) -> list[int]:
    return sorted({run.get("repeat") or 1 for run in runs if run["handler"] == name})


def held(runs: Sequence[Row], name: str, slo_p99_ms: float) -> str:
    """The rate ``name`` held within the objective in each of its rounds, in round order."""
    mine = sorted((r for r in runs if r["handler"] == name), key=lambda r: r.get("repeat") or 1)
    return ", ".join(f"{sustained(r.get('curve') or (), slo_p99_ms):g}" for r in mine)


def held_lines(runs: Sequence[Row], names: Sequence[str], slo_p99_ms: float | None) -> str:
    """Per variant, the rate held in each round: within the objective when given, else
    the highest with nothing lost and not past capacity (``curves.behind``)."""
    slo = math.inf if slo_p99_ms is None else slo_p99_ms
    within = "nothing lost" if slo_p99_ms is None else f"within P99 {slo_p99_ms:g} ms"
    return "\n".join(
        f"{name}: held {held(runs, name, slo)} req/s {within}, not behind (round by round)"
        for name in names
    )


NO_VERDICT = "no verdict"


def compare_curves(runs: Sequence[Row], pairs: Sequence[tuple[str, str]]) -> list[Row]:
    """For each pair (numerator, denominator variant) and each offered rate both reached in
    some round: P99 numerator / denominator with its 95% interval and call, from the
    rounds in which both reached it (``rounds``; ``all_rounds`` says whether that was every
    round either ran) and neither point was busy: **a busy point decides nothing** (others
    used the machine through it), it is left out (``busy_rounds``), and a rate whose every
    round was busy gets ``NO_VERDICT``. ``answers``: the fewest answers a P99 rests on.
    Points without stored latencies are left out."""
    points = by_round(runs)
    out = []
    for numerator, denominator in pairs:
        a, b = points.get(numerator, {}), points.get(denominator, {})
        ran = sorted(set(rounds_of(runs, numerator)) | set(rounds_of(runs, denominator)))
        for rate in sorted(set(a) & set(b)):
            stored = [n for n in sorted(set(a[rate]) & set(b[rate]))
                      if latencies_of(a[rate][n]) and latencies_of(b[rate][n])]  # fmt: skip
            busy = [n for n in stored if a[rate][n].get("busy") or b[rate][n].get("busy")]
            both = [n for n in stored if n not in busy]
            head = {"comparison": f"{numerator} / {denominator}", "offered_per_s": rate}
            if not both:
                if busy:
                    out.append({**head, "call": NO_VERDICT, "busy_rounds": busy})
                continue
            found = compare_rounds(
                [latencies_of(a[rate][n]) for n in both],
                [latencies_of(b[rate][n]) for n in both],
                99,
            )
            per_round = found.pop("rounds")
            answers = min(len(latencies_of(p[rate][n])) for p in (a, b) for n in both)
            out.append(
                {**head, **found, "rounds": both, "all_rounds": both == ran,
                 "per_round": per_round, "busy_rounds": busy, "answers": answers}
            )  # fmt: skip
    return out


def _ms(value: float) -> str:
    return "lost" if math.isinf(value) else f"{value:.0f}"


def format_comparisons(comparisons: Sequence[Row]) -> str:
    """P99 ratios at equal offered load, a line each: ratio [95% interval], the call, and
    the rounds it rests on."""
    lines = []
    for c in comparisons:
        left_out = ", ".join(str(n) for n in c.get("busy_rounds") or ())
        if c["call"] == NO_VERDICT:
            lines.append(
                f"{c['comparison']} at {c['offered_per_s']:g} req/s offered: {NO_VERDICT}, "
                f"every round's point was busy (rounds {left_out}: others used the machine)"
            )
            continue
        rounds = ", ".join(str(n) for n in c["rounds"])
        partial = "" if c["all_rounds"] else " (only these reached it)"
        if left_out:
            partial += f"; busy, left out: rounds {left_out}"
        how = "pooled" if c["pooled"] else "per round, each must agree"
        per = "" if c["pooled"] else " (" + "; ".join(
            f"{r['ratio']:.2f}x [{r['low']:.2f}, {r['high']:.2f}] {r['call']}"
            for r in c["per_round"]
        ) + ")"  # fmt: skip
        lines.append(
            f"{c['comparison']} at {c['offered_per_s']:g} req/s offered: P99 "
            f"{c['ratio']:.2f}x [{c['low']:.2f}, {c['high']:.2f}] (95%, {how}): "
            f"**{c['call']}**; rounds {rounds}{partial}; at least {c.get('answers', '?')} "
            f"answers a P99{per}"
        )
    return "\n".join(lines)


def _p99(r: Row) -> str:
    if "p99_low_ms" not in r:  # a point stored before intervals were
        return _ms(r["p99_ms"])
    return f"{_ms(r['p99_ms'])} [{_ms(r['p99_low_ms'])}, {_ms(r['p99_high_ms'])}]"


def _others(r: Row) -> str:
    cores = r.get("other_cpu_cores", math.nan)
    if cores is None or math.isnan(cores):
        return "-"
    return f"{cores:.2f}" + (" BUSY" if r.get("busy") else "")


# (header, one round's cell) of format_curves' tables, after the rate and the rounds.
_COLUMNS: tuple[tuple[str, Callable[[Row], str]], ...] = (
    ("achieved/s", lambda r: f"{r['achieved_per_s']:.1f}"),
    ("P99 ms [95% interval]", _p99),
    ("answers", lambda r: str(r.get("answers", "-"))),
    ("errors", lambda r: str(r["errors"])),
    ("timeouts", lambda r: str(r["timeouts"])),
    ("late sends", lambda r: str(r["late_sends"])),
    ("others' CPU, cores", _others),
)


def floor_line(runs: Sequence[Row], name: str) -> str:
    """``name``'s floor (drive.floor: one request at a time) in each round, "" if none."""
    mine = sorted((r for r in runs if r["handler"] == name), key=lambda r: r.get("repeat") or 1)
    floors = [r["floor"] for r in mine if r.get("floor")]
    if not floors:
        return ""
    each = " · ".join(
        f"{_p99(f)} of {f['requests']}" + (f" ({f['errors']} errors)" if f.get("errors") else "")
        for f in floors
    )
    return f"one request at a time on the idle server, its window included: P99 ms {each}"


def format_curves(runs: Sequence[Row], slo_p99_ms: float | None) -> str:
    """A markdown table per variant, one line per offered rate, each cell every round's
    figure in round order ("-": that round stopped before this rate; a rate only some
    rounds reached is marked in the rounds column)."""
    lines = []
    marked = False
    for name, rates in by_round(runs).items():
        rounds = rounds_of(runs, name)
        within = ""
        if slo_p99_ms is not None:
            each = held(runs, name, slo_p99_ms)
            within = f", holds {each} req/s within P99 {slo_p99_ms:g} ms (round by round)"
        lines += [f"**{name}**{within}", ""]
        alone = floor_line(runs, name)
        if alone:
            lines += [alone, ""]
        lines.append("| offered/s | rounds | " + " | ".join(h for h, _ in _COLUMNS) + " |")
        lines.append("|---|---|" + "---|" * len(_COLUMNS))
        for rate, rows in sorted(rates.items()):
            reached = sorted(rows)
            shown = "all"
            if reached != rounds:
                shown = f"only {', '.join(map(str, reached))} of {len(rounds)} †"
                marked = True
            cells = [
                " · ".join(cell(rows[n]) if n in rows else "-" for n in rounds)
                for _, cell in _COLUMNS
            ]
            lines.append(f"| {rate:g} | {shown} | " + " | ".join(cells) + " |")
        lines.append("")
    if marked:
        lines.append("† a rate only those rounds reached: the others had stopped before it.")
    if any(r["achieved_per_s"] > rate for rates in by_round(runs).values()
           for rate, rows in rates.items() for r in rows.values()):  # fmt: skip
        lines.append(
            "achieved/s above offered/s: the offered rate is the schedule's nominal one; its "
            "seeded random (Poisson) arrivals came a little faster by chance."
        )
    if any(r.get("busy") for rates in by_round(runs).values()
           for rows in rates.values() for r in rows.values()):  # fmt: skip
        lines.append("BUSY: others used the machine through that point; it decides nothing.")
    return "\n".join(lines)


def write_curves(
    out: Path,
    runs: Sequence[Row],
    slo_p99_ms: float | None,
    pairs: Sequence[tuple[str, str]] = (),
) -> str:
    """curves.json (every round's points, without their latencies, and the comparisons of
    ``pairs``) and curves.md in ``out``; returns the markdown."""
    comparisons = compare_curves(runs, pairs)
    every = [
        {"handler": r["handler"], "round": r.get("repeat"),
         "curve": without_latencies(r["curve"])}
        for r in runs if r.get("curve")
    ]  # fmt: skip
    (out / "curves.json").write_text(
        json.dumps({"runs": every, "comparisons": comparisons}, indent=2) + "\n"
    )
    table = format_curves(runs, slo_p99_ms)
    if comparisons:
        table += "\nP99 at equal offered load:\n\n" + format_comparisons(comparisons) + "\n"
    (out / "curves.md").write_text(table + "\n")
    return table
