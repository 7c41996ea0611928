"""What an asynchronous server step costs beside a synchronous round of as many clients
(BENCHMARKS.md, "Asynchronous server steps").

    python benchmarks/async_step.py [--repeats 3] [--rounds 20]

For each model, FedAvg with K clients a round and FedBuff stepping after K arrivals of C in
flight (the K arriving clients trained from their start versions in the ring as one vmapped
computation), FedAsync one arrival a step, on the same data and heavy-tailed device speeds;
each run's wall seconds per round after the first (compilation) from its summary, the runs
interleaved and repeated, the median printed. Run it with nothing else on the machine.
"""

from __future__ import annotations

import argparse
import statistics

import mcfl

K = 10
MODELS = {
    "mclr": dict(dataset="fmnist", clients=100, model="mclr"),
    "cnn-fmnist": dict(dataset="fmnist", clients=100, model="cnn-fmnist"),
}
METHODS = {
    f"fedavg, {K} clients a round": dict(algorithm="fedavg", clients_per_round=K),
    f"fedbuff, K = {K} of C = {2 * K}": dict(algorithm="fedbuff", buffer_size=K,
                                             concurrency=2 * K),
    f"fedasync, 1 of C = {K}": dict(algorithm="fedasync", concurrency=K),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    seconds: dict = {}
    for _ in range(args.repeats):
        for model, data in MODELS.items():
            for method, own in METHODS.items():
                config = mcfl.RunConfig(**data, **own, rounds=args.rounds, local_steps=10,
                                        eval_every=args.rounds, embed_clients=0,
                                        device_speeds="lognormal:0,1")
                summary = mcfl.run(config).summary
                seconds.setdefault((model, method), []).append(summary["seconds_per_round"])
    print(f"| model | method | s per round or server step (median of {args.repeats}) | runs |")
    print("| --- | --- | --- | --- |")
    for (model, method), values in seconds.items():
        print(f"| {model} | {method} | {statistics.median(values):.4f} | "
              + ", ".join(f"{v:.4f}" for v in values) + " |")


if __name__ == "__main__":
    main()
