"""`mcfl plan`'s bound recomputed for the points of a `mcfl bench` record, on this machine.

    .venv/bin/python benchmarks/replan.py benchmarks/results/h200-2026-11-26/suite.json \
        --target h200 [--only fesem] [--out runs/replan.json]

A suite run on a rented accelerator records, beside each measured round, the bound `mcfl plan`
computed there (`Point.plan`). When the plan's counting changes afterwards, the bound can be
recomputed here without the accelerator: the count is taken on the traced program (nothing is
compiled or run), for the point's config, data shape and block size as recorded, and the
named target's datasheet figures (`mcfl.planning.targets`). Prints, for each planned point, the
measured round, the bound recorded with it, the recomputed bound and measured / recomputed.
The point's generated data is built here, so a point needs its data's memory on this machine
(FeSEM at 1,000,000 clients: about 14 GB).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcfl.apps.bench_data import benchmark_dataset  # noqa: E402
from mcfl.apps.bench_point import FEATURES, Point, training_config  # noqa: E402
from mcfl.files import atomic  # noqa: E402
from mcfl.planning.estimate import bound_on, estimate_run  # noqa: E402
from mcfl.planning.targets import TARGETS  # noqa: E402


def recorded_point(record: dict) -> Point:
    """The `Point` a record measured. Its block size is the one the run used (the record's
    `block_size`), not the rule's choice here: the rule depends on the device's memory."""
    fields = {f.name for f in dataclasses.fields(Point)}
    return Point(**{k: v for k, v in record.items() if k in fields})


def replan(record: dict, target_name: str) -> dict:
    point = recorded_point(record)
    dataset = benchmark_dataset(point.clients, FEATURES[point.model], point.rows_per_client,
                                seed=point.seed)
    estimate = estimate_run(training_config(point), dataset, compile=False)
    del dataset
    bound = bound_on(estimate, TARGETS[target_name], record.get("config", {}).get(
        "precision", "float32"))
    cost = estimate.program("round").cost
    return {"label": record["label"], "measured_seconds": record["seconds_per_round"],
            "recorded_bound_seconds": record.get("plan_round_seconds"),
            "bound_seconds": bound.round_seconds, "bound_by": bound.limit,
            "round_flops": cost.flops, "round_bytes": cost.bytes,
            "block_size": point.block_size}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", help="a bench.json / suite.json of `mcfl bench`")
    parser.add_argument("--target", required=True, choices=sorted(TARGETS))
    parser.add_argument("--only", default="", help="comma-separated label prefixes")
    parser.add_argument("--out", help="also write the rows here as JSON")
    args = parser.parse_args()
    points = json.loads(Path(args.records).read_text())["points"]
    prefixes = tuple(p for p in args.only.split(",") if p)
    chosen = [p for p in points if p.get("plan") and p.get("status") == "ok"
              and (not prefixes or p["label"].startswith(prefixes))]
    rows = []
    print("| point | measured s/round | bound recorded | bound now | measured / bound | "
          "bound by |\n| --- | ---: | ---: | ---: | ---: | --- |")
    for record in chosen:
        row = replan(record, args.target)
        rows.append(row)
        recorded = row["recorded_bound_seconds"]
        print(f"| {row['label']} | {row['measured_seconds']:.4f} | "
              f"{'' if recorded is None else f'{recorded:.5f}'} | {row['bound_seconds']:.5f} | "
              f"{row['measured_seconds'] / row['bound_seconds']:.1f} | {row['bound_by']} |",
              flush=True)
    if args.out:
        atomic.write_json(Path(args.out), {"records": args.records, "target": args.target,
                                           "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
