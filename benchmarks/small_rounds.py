"""FeSEM's small rounds: the block rule and round scanning forced on and off, beside `mcfl plan`'s
bound, in one process.

    .venv/bin/python benchmarks/small_rounds.py --out runs/small-rounds

FeSEM (K = 4), MCLR 60 -> 10, 100,000 clients (`mcfl bench`'s planted data, 50 rows each), 100
a round of 5 steps, 30 rounds; s/round is the median of rounds 2-30. The dataset is built once;
the variants run one after another, `--passes` times over (the first pass compiles each one):
- ``block8-off``: blocks of 8, a host call a round (the defaults before issue 42);
- ``block8-on``: blocks of 8, the rounds scanned;
- ``default-off``: the block rule's size, a host call a round (``--scan-rounds off``);
- ``default``: the defaults (the block rule, ``--scan-rounds auto``).
Prints each variant's s/round and its ratio to the bound for ``cpu-here`` (this CPU's matmul
rate and copy bandwidth, measured in the same process), and writes OUT/small_rounds.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mcfl import run  # noqa: E402
from mcfl.apps.bench_data import benchmark_dataset  # noqa: E402
from mcfl.apps.bench_point import FEATURES, Point, _planned, training_config  # noqa: E402
from mcfl.files.atomic import write_json  # noqa: E402

VARIANTS = {"block8-off": {"block_size": 8, "scan_rounds": "off"},
            "block8-on": {"block_size": 8, "scan_rounds": "on"},
            "default-off": {"scan_rounds": "off"},
            "default": {}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/small-rounds"))
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    point = Point("fesem", "mclr", args.clients, rounds=30, clients_per_round=100)
    base = training_config(point)
    dataset = benchmark_dataset(point.clients, FEATURES[point.model], point.rows_per_client,
                                seed=0)
    bound = _planned(base, dataset)
    document = {"plan": bound, "variants": {name: [] for name in VARIANTS}}
    print(f"plan's bound: {1000 * bound['plan_round_seconds']:.3f} ms a round "
          f"({bound['plan_bound_by']}-bound)", flush=True)
    for number in range(args.passes):
        for name, changes in VARIANTS.items():
            result = run(base.replace(**changes), dataset=dataset)
            seconds = statistics.median(row["seconds"] for row in result.rounds[1:])
            document["variants"][name].append(
                {"seconds_per_round": seconds, "block_size": result.summary["block_size"]})
            write_json(args.out / "small_rounds.json", document)
            print(f"pass {number + 1} {name:<12} {1000 * seconds:7.3f} ms a round, block "
                  f"{result.summary['block_size']}, "
                  f"{seconds / bound['plan_round_seconds']:.1f}x the bound", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
