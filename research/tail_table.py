"""The held-out table of docs/tail_validation.md from ``research.tail_study`` JSON output.

    .venv/bin/python -m research.tail_table /tmp/tailfam/held_out.json \\
        --extra /tmp/tailfam/held_out_tail.json
"""

from __future__ import annotations

import argparse
import json

NAMES = ("sample", "count", "evt", "evt_support", "evt@50", "evt-avg", "tail", "tail_pooled")


def _covered(r: dict, cell: dict, key: str) -> bool:
    return cell[key][0] <= r["truth"] <= cell[key][1]


def table(rows: list[dict]) -> list[str]:
    groups = {
        "all": rows,
        "cosine": [r for r in rows if r["params"]["score"] == "cosine"],
        "inner product": [r for r in rows if r["params"]["score"] == "inner"],
        "near-duplicates": [r for r in rows if r["params"]["dup_rate"] > 0],
        "no near-duplicates": [r for r in rows if r["params"]["dup_rate"] == 0],
    }
    out = [
        "| group (worlds) | estimator | mean abs err | bias | worst | coverage (CI) | "
        "coverage (CI + thr) | flagged | s / world |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for label, rs in groups.items():
        for name in NAMES:
            cells = [(r, r[name]) for r in rs if name in r]
            if not cells:
                continue
            errs = [c["err"] for _, c in cells]
            worst_r, worst_c = max(cells, key=lambda rc: abs(rc[1]["err"]))
            cover = sum(_covered(r, c, "ci") for r, c in cells) / len(cells)
            total = (
                f"{sum(_covered(r, c, 'total_ci') for r, c in cells) / len(cells):.2f}"
                if all("total_ci" in c for _, c in cells)
                else "–"
            )
            fk = {"evt": "flags", "evt_support": "flags_support"}.get(name)
            if fk and all(fk in r for r, _ in cells):
                flagged = f"{sum(bool(r[fk]) for r, _ in cells)}/{len(cells)}"
            else:
                flagged = "–"
            seconds = sum(c["seconds"] for _, c in cells) / len(cells)
            out.append(
                f"| {label} ({len(cells)}) | {name} | {sum(map(abs, errs)) / len(errs):.4f} | "
                f"{sum(errs) / len(errs):+.4f} | {worst_r['world']} {worst_c['err']:+.3f} | "
                f"{cover:.2f} | {total} | {flagged} | {seconds:.2f} |"
            )
    return out


def flag_lines(rows: list[dict]) -> list[str]:
    out = []
    for name, fk in (("evt", "flags"), ("evt_support", "flags_support")):
        if not all(name in r and fk in r for r in rows):
            continue  # a run without diagnostics (--no-diag)
        parts = []
        for label, keep in (
            ("|err| > 0.03", lambda e: e > 0.03),
            ("|err| > 0.02", lambda e: e > 0.02),
            ("|err| ≤ 0.01", lambda e: e <= 0.01),
        ):
            g = [r for r in rows if keep(abs(r[name]["err"]))]
            parts.append(f"{label}: {sum(bool(r[fk]) for r in g)}/{len(g)} flagged")
        out.append(f"- `{name}`: " + "; ".join(parts))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("json")
    p.add_argument("--extra", action="append", default=[], help="more runs on the same worlds")
    args = p.parse_args(argv)
    with open(args.json) as f:
        rows = {r["id"]: r for r in json.load(f)["rows"]}
    for path in args.extra:
        with open(path) as f:
            for r in json.load(f)["rows"]:
                rows[r["id"]].update({k: v for k, v in r.items() if k in NAMES})
    rows = list(rows.values())
    print("\n".join(table(rows)))
    print()
    print("\n".join(flag_lines(rows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
