"""Planted clusters on CIFAR-10-format data with the FedAvg paper's CIFAR CNN (`cnn-cifar`):
FedAvg, IFCA, FeSEM, FlexCFL and CFL on `rotated:4` and `label_swap:4`, ARI reported.

    python benchmarks/planted_cifar.py --data-dir DIR   # the real CIFAR-10 binary version
    python benchmarks/planted_cifar.py                  # no CIFAR-10 here: Fashion-MNIST
                                                        # written in CIFAR-10's binary format

CIFAR-10 cannot be downloaded on the machine this table was made on, so by default the script
writes Fashion-MNIST (Debian's dataset-fashion-mnist) as CIFAR-10 binary files, each 28x28
image padded to 32x32 and repeated over the three channels, and reads them back through
mcfl's `cifar10` loader: the loader, the model and the recipes are those of CIFAR-10; the
images are not.

Reduced to run on 2 cores: 40 clients of 40 rows (32 train, 8 test), every client every
round, 12 rounds, E = 1, B = 10, lr = 0.05, K = 4 (CFL: at most 4 clusters, its thresholds
from the update norms of this problem after 3 warm-up rounds; FlexCFL: its cold start on
5 K = 20 clients, as 20 K would be more clients than there are).
"""

from __future__ import annotations

import argparse
import gzip
import tempfile
import time
from pathlib import Path

import numpy as np

import mcfl
from mcfl import load_dataset

ALGORITHMS = {
    "fedavg": {},
    "ifca": {},
    "fesem": {},
    "flexcfl": {"pretrain_scale": 5},  # its cold start: 5 K = 20 of the 40 clients
    "cfl": {"cfl_eps1": 0.4, "cfl_eps2": 0.9, "cfl_warmup": 3},
}
FMNIST = Path("/usr/share/datasets/fashion-mnist")


def _idx(path: Path, header: int) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        return np.frombuffer(f.read(), np.uint8)[header:]


def write_cifar_format(out: Path) -> Path:
    """Fashion-MNIST as CIFAR-10 binary batches in `out`/cifar-10-batches-bin: records of one
    label byte and 3 x 1024 pixel bytes (R, G, B planes, rows of 32)."""
    folder = out / "cifar-10-batches-bin"
    folder.mkdir(parents=True, exist_ok=True)
    for split, files in (("train", [f"data_batch_{i}.bin" for i in range(1, 6)]),
                         ("t10k", ["test_batch.bin"])):
        images = _idx(FMNIST / f"{split}-images-idx3-ubyte.gz", 16).reshape(-1, 28, 28)
        labels = _idx(FMNIST / f"{split}-labels-idx1-ubyte.gz", 8)
        padded = np.pad(images, ((0, 0), (2, 2), (2, 2)))
        planes = np.repeat(padded[:, None], 3, axis=1).reshape(len(labels), 3072)
        records = np.concatenate([labels[:, None], planes], axis=1).astype(np.uint8)
        for name, part in zip(files, np.array_split(records, len(files))):
            part.tofile(folder / name)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data-dir", default=None, help="CIFAR-10 binary version (default: "
                        "Fashion-MNIST written in its format)")
    parser.add_argument("--partitions", nargs="+", default=["rotated:4", "label_swap:4"])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--clients", type=int, default=40)
    parser.add_argument("--algorithms", nargs="+", default=list(ALGORITHMS))
    args = parser.parse_args()
    data_dir = args.data_dir or str(write_cifar_format(Path(tempfile.mkdtemp())))
    base = mcfl.RunConfig(dataset="cifar10", data_dir=data_dir, clients=args.clients,
                          samples_per_client=40, rounds=args.rounds, embed_clients=0,
                          clients_per_round=1.0, model="cnn-cifar", lr=0.05, local_epochs=1,
                          batch_size=10, clusters=4, eval_every=args.rounds, seed=0)
    print("| partition | algorithm | micro acc | macro acc | ARI | clusters | wall |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for partition in args.partitions:
        config = base.replace(partition=partition)
        data = load_dataset(config)
        for name in args.algorithms:
            start = time.perf_counter()
            s = mcfl.run(config.replace(algorithm=name, **ALGORITHMS[name]),
                         dataset=data).summary
            ari = s.get("cluster_ari")
            print(f"| {partition} | {name} | {s['final_accuracy_micro']:.3f} | "
                  f"{s['final_accuracy_macro']:.3f} | {'-' if ari is None else f'{ari:.2f}'} | "
                  f"{s.get('num_clusters', 1):g} | {time.perf_counter() - start:.0f} s |",
                  flush=True)


if __name__ == "__main__":
    main()
