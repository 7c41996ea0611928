"""What client-level DP costs a round: the same run with and without --dp-clip / --dp-noise,
interleaved (A B A B) in one process, steady seconds per round (summary.json's
seconds_per_round: rounds 2 onward). Usage: python benchmarks/dp_overhead.py [--repeats 2]"""

from __future__ import annotations

import argparse
import json

import mcfl

WORKLOADS = {
    "fedavg-mlp": dict(algorithm="fedavg", model="mlp", hidden=(200,)),
    "ifca-mlp": dict(algorithm="ifca", model="mlp", hidden=(200,), clusters=4),
    "fedavg-cnn": dict(algorithm="fedavg", model="cnn-fmnist", clients_per_round=20),
}
BASE = dict(dataset="fmnist", partition="rotated:4", clients=240, samples_per_client=100,
            clients_per_round=60, rounds=6, eval_every=6, embed_clients=0, lr=0.05)
DP = dict(dp_clip=1.0, dp_noise=1.0)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    out = {}
    for name, own in WORKLOADS.items():
        config = mcfl.RunConfig(**{**BASE, **own})
        data = mcfl.load_dataset(config)
        times = {"plain": [], "dp": []}
        for _ in range(args.repeats):
            for kind, extra in (("plain", {}), ("dp", DP)):
                result = mcfl.run(config.replace(**extra), dataset=data)
                times[kind].append(result.summary["seconds_per_round"])
        out[name] = {k: min(v) for k, v in times.items()}
        out[name]["ratio"] = out[name]["dp"] / out[name]["plain"]
        print(name, json.dumps(out[name]), flush=True)


if __name__ == "__main__":
    main()
