"""Choosing K before a full run (FeSEM paper, Sec. 5.2): run each candidate K for a few rounds
on a sample of clients, compare accuracy and intra-cluster distance, and keep the best.

The paper runs about 100 sampled clients for about 3 rounds per candidate and picks the best
accuracy or intra-cluster distance. Two recommendations come back: by accuracy, the smallest K
whose final micro accuracy is within `tolerance` of the best candidate's; and, since the
intra-cluster distance falls with every extra cluster, its elbow: the K whose step from the
previous candidate cut the distance most more than the next step does. After few rounds,
accuracy tends to favour more clusters (each has less to fit); the elbow is the better guide
then (on 4 planted clusters of digits, 10 rounds: accuracy picked 6, the elbow 4).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Optional

import numpy as np

from mcfl.config import RunConfig
from mcfl.data import FederatedDataset
from mcfl.data.federated import subset_clients
from mcfl.errors import ConfigError
from mcfl.runs.runner import load_dataset, run

# The paper's sample: about 100 clients (every client of a dataset with fewer).
DEFAULT_SAMPLE = 100


def select_k(config: RunConfig, candidates: Sequence[int], sample: Optional[int] = None,
             rounds: int = 3, tolerance: float = 0.005,
             dataset: Optional[FederatedDataset] = None,
             progress: Optional[Callable[[dict], None]] = None, model: Any = None
             ) -> dict[str, Any]:
    """Each candidate K of ``config.algorithm`` (a clustered one) for `rounds` rounds on
    `sample` clients drawn with the config's seed (default: `DEFAULT_SAMPLE`, or every client
    of a dataset with fewer; a sample above the dataset's clients is refused, as it would
    sample no more than all of them). Returns {"rows": one dict per K (final accuracy micro /
    macro, intra-cluster distance, seconds), "recommended": K, "clients": the sampled client
    ids}. `model`: a user's model, as in `mcfl.run`."""
    if not config.clustered:
        raise ConfigError(f"select-k needs a clustered algorithm, not {config.algorithm!r}")
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not (
            0 <= tolerance < math.inf):
        raise ConfigError(f"--tolerance must be a finite accuracy gap >= 0 (the recommended K "
                          f"is the smallest within it of the best), got {tolerance!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError(f"--candidate-rounds must be a whole number of rounds >= 1, got "
                          f"{rounds!r}")
    candidates = sorted(set(candidates))
    if not candidates or min(candidates) < 1:
        raise ConfigError(f"candidate K values must be integers >= 1, got {candidates}")
    dataset = dataset if dataset is not None else load_dataset(config)
    clients = dataset.num_clients
    if sample is not None and (isinstance(sample, bool) or not isinstance(sample, int)
                               or not 1 <= sample <= clients):
        raise ConfigError(f"--sample must be a number of clients from 1 to the dataset's "
                          f"{clients}, got {sample!r}")
    size = min(DEFAULT_SAMPLE, clients) if sample is None else sample
    if max(candidates) > size:
        raise ConfigError(f"K = {max(candidates)} exceeds the {size} sampled clients; "
                          f"allowed: K up to {size}")
    rng = np.random.default_rng(config.seed)
    chosen = np.sort(rng.choice(dataset.num_clients, size, replace=False))
    subset = subset_clients(dataset, chosen)
    rows = []
    for k in candidates:
        trial = config.replace(clusters=k, clients=size, rounds=rounds, eval_every=rounds,
                               embed_clients=0)
        summary = run(trial, dataset=subset, model=model).summary
        row = {"k": k, "accuracy_micro": summary["final_accuracy_micro"],
               "accuracy_macro": summary["final_accuracy_macro"],
               "intra_cluster_distance": summary.get("intra_cluster_distance"),
               "seconds": summary["wall_seconds"]}
        rows.append(row)
        if progress is not None:
            progress(row)
    best = max(r["accuracy_micro"] for r in rows)
    recommended = min(r["k"] for r in rows if r["accuracy_micro"] >= best - tolerance)
    return {"rows": rows, "recommended": recommended, "elbow": distance_elbow(rows),
            "clients": chosen.tolist(), "sample": size, "rounds": rounds,
            "tolerance": tolerance}


def distance_elbow(rows: list[dict]) -> Optional[int]:
    """The K (of rows sorted by K) after which the intra-cluster distance stops falling fast:
    the largest drop from the previous candidate minus the drop to the next. None with fewer
    than three candidates or without distances."""
    distances = [r["intra_cluster_distance"] for r in rows]
    if len(rows) < 3 or any(d is None for d in distances):
        return None
    drops = -np.diff(np.asarray(distances, np.float64))  # drops[i]: from K_i to K_{i+1}
    gains = drops[:-1] - drops[1:]  # for K_1 .. K_{n-2}
    return rows[int(np.argmax(gains)) + 1]["k"]
