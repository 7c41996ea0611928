"""What the TPU compiler's programs waste, per program, for mcfl's headline workloads: the
bytes its layouts add to arguments and outputs (8 x 128 tiles), the temporaries, and the work
against mcfl's own count of the same run built for this CPU (`mcfl.planning.cost`, every loop
as it runs), from the compiled programs alone (`mcfl.planning.tpu_compile`).

    python benchmarks/tpu_padding.py --out benchmarks/results/tpu-padding-after.json
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from tpu_fit import WORKLOADS, shaped_dataset  # noqa: E402

from mcfl import load_dataset  # noqa: E402
from mcfl.apps.bench_point import Point, training_config  # noqa: E402
from mcfl.config import RunConfig  # noqa: E402
from mcfl.files.atomic import write_json  # noqa: E402
from mcfl.planning import tpu_compile  # noqa: E402
from mcfl.planning.estimate import client_loop_trips, estimate_run  # noqa: E402

CASES = {
    "fedavg-mlp-2000": (RunConfig(algorithm="fedavg", dataset="synthetic", clients=2000,
                                  model="mlp", rounds=10), None),
    "fesem-mclr-20000": (WORKLOADS["fesem-mclr"], 20_000),
    "fedavg-cnn-2000": (WORKLOADS["fedavg-cnn"], 2_000),
}
TARGETS = ("tpu-v5e-1", "tpu-v2-8")


def case(name: str):
    spec, clients = CASES[name]
    if isinstance(spec, Point):
        config = training_config(dataclasses.replace(spec, clients=clients))
        return config, shaped_dataset(spec, clients)
    return spec, load_dataset(spec)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    results = {"libtpu": tpu_compile.libtpu_version(), "cases": {}}
    for name in CASES:
        config, dataset = case(name)
        here = estimate_run(config, dataset=dataset, compile=False)  # traced: counts only
        results["cases"][name] = {"cpu_count": {p.name: p.cost._asdict()
                                                for p in here.programs}}
        for target in TARGETS:
            run = tpu_compile.compile_run(config, dataset, target, client_loop_trips(dataset))
            results["cases"][name][target] = {
                "need_bytes": run.need_bytes, "fits": run.fits,
                "programs": {p.name: {"need_bytes": p.need_bytes,
                                      "argument_bytes": p.argument_bytes,
                                      "output_bytes": p.output_bytes,
                                      "temp_bytes": p.temp_bytes,
                                      "logical_bytes": p.logical_bytes,
                                      "padding_bytes": p.padding_bytes,
                                      "fusions": p.fusions,
                                      "xla_flops": p.flops,
                                      "xla_bytes_accessed": p.bytes_accessed,
                                      "counted": p.counted._asdict(),
                                      "counted_once": p.counted_once._asdict(),
                                      "per_device": p.per_device()._asdict()}
                             for p in run.programs}}
            for p in run.programs:
                work = p.per_device()
                print(f"{name:<17} {target:<10} {p.name:<9} need {p.need_bytes / 2**20:9.1f} MiB"
                      f"  temps {p.temp_bytes / 2**20:8.1f}  padding "
                      f"{p.padding_bytes / 2**20:7.1f} of {p.logical_bytes / 2**20:8.1f} MiB"
                      f"  {work.flops / 1e9:9.3f} GFLOP  {work.bytes / 1e9:7.3f} GB"
                      f"  {p.fusions:4d} fusions", flush=True)
        write_json(Path(args.out), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
