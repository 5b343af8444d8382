"""The small-sample study's table per sample size (``research.tail_small_study`` output).

PYTHONPATH=. .venv/bin/python -m research.tail_small_table /tmp/tailsmall/held_out.pt

``--estimators``: the table of the estimators a ``--estimators`` study run added
(coverage of each one's ``ci`` and ``ci_total``; time without its checks).
"""

from __future__ import annotations

import argparse

import torch

SIZES = {10: "10k", 20: "20k", 100: "100k"}


def size_of(row: dict) -> str:
    return SIZES[int(round(row["S"] / 10_000)) * 10 if row["S"] >= 15_000 else 10]


def world_errors(row: dict) -> dict[str, float]:
    ok = row["query_ok"]
    out = {
        name: float(row["per_query"][name][ok].mean()) - row["truth"]
        for name in ("sample", "count", "evt@200")
    }
    out["default"] = row["default"]["map"] - row["truth"]
    return out


def table(rows: list[dict]) -> str:
    lines = [
        "| S | estimator | mean abs err | bias | worst world | coverage (ci_total) | flagged "
        "| abs err > 0.05 flagged | s / world |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for size in ("10k", "20k", "100k"):
        group = [r for r in rows if size_of(r) == size]
        if not group:
            continue
        errs = [world_errors(r) for r in group]
        for name in ("sample", "count", "evt@200", "default"):
            e = [w[name] for w in errs]
            worst = max(range(len(e)), key=lambda i: abs(e[i]))
            cells = [size, f"`{name}`", f"{sum(map(abs, e)) / len(e):.4f}",
                     f"{sum(e) / len(e):+.4f}", f"{group[worst]['key']} {e[worst]:+.3f}"]  # fmt: skip
            if name == "default":
                tot = [r["default"]["ci_total"] for r in group]
                cov = sum(lo <= r["truth"] <= hi for r, (lo, hi) in zip(group, tot))
                flagged = [bool(r["default"]["flags"]) for r in group]
                big = [i for i, x in enumerate(e) if abs(x) > 0.05]
                secs = sum(r["seconds"]["default"] for r in group) / len(group)
                cells += [f"{cov}/{len(group)}", f"{sum(flagged)}/{len(group)}",
                          f"{sum(flagged[i] for i in big)}/{len(big)}", f"{secs:.1f}"]  # fmt: skip
            else:
                cells += ["–", "–", "–", "–"]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def per_world(rows: list[dict]) -> str:
    lines = ["| world | truth | count | evt@200 | default | flags |", "|---|---|---|---|---|---|"]
    for r in rows:
        e = world_errors(r)
        flags = "; ".join(f.split(":")[0] for f in r["default"]["flags"]) or "–"
        lines.append(
            f"| {r['key']} | {r['truth']:.3f} | {e['count']:+.3f} | {e['evt@200']:+.3f} "
            f"| {e['default']:+.3f} | {flags} |"
        )
    return "\n".join(lines)


def estimators_table(rows: list[dict]) -> str:
    """Per sample size and added estimator: mean |err|, bias, worst world, ``ci`` coverage, time."""
    lines = [
        "| S | estimator | mean abs err | bias | worst world | coverage (ci) "
        "| coverage (ci_total) | flagged | s / world |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    names = list(rows[0]["estimators"]) if rows else []
    for size in ("10k", "20k", "100k"):
        group = [r for r in rows if size_of(r) == size]
        for name in names if group else ():
            cells = [r["estimators"][name] for r in group]
            e = [c["map"] - r["truth"] for r, c in zip(group, cells)]
            worst = max(range(len(e)), key=lambda i: abs(e[i]))
            cov = sum(c["ci"][0] <= r["truth"] <= c["ci"][1] for r, c in zip(group, cells))
            tot = sum(
                c["ci_total"][0] <= r["truth"] <= c["ci_total"][1] for r, c in zip(group, cells)
            )
            flagged = sum(bool(c["flags"]) for c in cells)
            secs = sum(c["seconds"] for c in cells) / len(cells)
            lines.append(
                f"| {size} | `{name}` | {sum(map(abs, e)) / len(e):.4f} | {sum(e) / len(e):+.4f} "
                f"| {group[worst]['key']} {e[worst]:+.3f} | {cov}/{len(group)} "
                f"| {tot}/{len(group)} | {flagged}/{len(group)} | {secs:.2f} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("results")
    p.add_argument("--worlds", action="store_true", help="also the per-world errors")
    p.add_argument("--estimators", action="store_true", help="also the added estimators' table")
    args = p.parse_args(argv)
    rows = torch.load(args.results)
    print(table(rows))
    if args.estimators:
        print()
        print(estimators_table(rows))
    if args.worlds:
        print()
        print(per_world(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
