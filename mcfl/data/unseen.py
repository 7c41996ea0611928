"""Clients held out of training and scored at test time (``--unseen-share``).

A share of a dataset's clients never trains: no round samples them, no statistic of theirs
reaches the server. At every evaluation each is given one of the trained models without its
labels (`FederatedAlgorithm.newcomers`: FLUX's descriptor rule, else the most confident model,
`mcfl.engine.newcomers`) and scored on its test rows. This is FLUX's test phase (Fenoglio et
al., NeurIPS 2025) with clients that are new, where FLUX re-scores its training clients' own
test splits as if they were unseen; and it is the newcomer of FedGroup / FlexCFL (paper 004,
Sec. 4.3) scored without the labelled warm-up their cold start uses.

Held-out clients are drawn at random with the data's seed, in proportion from every planted
group when the data has groups (so that every group has newcomers to score), and each group
keeps at least one training client.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mcfl.data.federated import FederatedDataset, subset_clients
from mcfl.errors import DataError


def held_out_clients(num_clients: int, share: float, groups, rng: np.random.Generator
                     ) -> np.ndarray:
    """Ascending ids of the clients to hold out: ``round(share * n)`` of every group of n
    clients (all clients one group without planted groups), at least one in all, leaving every
    group at least one training client."""
    groups = np.zeros(num_clients, np.int64) if groups is None else np.asarray(groups)
    chosen = []
    for group in np.unique(groups):  # a loop over the planted groups (a handful)
        members = np.flatnonzero(groups == group)
        count = min(int(round(share * members.size)), members.size - 1)
        chosen.append(rng.choice(members, count, replace=False))
    held = np.sort(np.concatenate(chosen)) if chosen else np.zeros(0, np.int64)
    if held.size == 0:
        raise DataError(f"--unseen-share {share:g} of {num_clients} clients holds out none; give "
                        f"a larger share or more clients")
    return held


def with_unseen(dataset: FederatedDataset, share: float, seed: int) -> FederatedDataset:
    """The training clients of `dataset` with the held-out ones attached as ``.unseen``
    (both renumbered from 0, their client ids and planted groups kept)."""
    held = held_out_clients(dataset.num_clients, share, dataset.true_cluster,
                            np.random.default_rng([seed, 0x5EE17]))
    kept = np.setdiff1d(np.arange(dataset.num_clients), held)
    training = subset_clients(dataset, kept)
    return dataclasses.replace(training, unseen=subset_clients(dataset, held))
