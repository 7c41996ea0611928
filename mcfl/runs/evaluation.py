"""Per-client accuracy and macro-F1, and their micro / macro aggregates over clients.

Definitions (as the FeSEM and FlexCFL evaluations use them): F1 is computed per client, macro
over the classes present in that client's labels or predictions (scikit-learn's
``average="macro"``); **micro** aggregates weight clients by their test samples (for accuracy,
the same as pooling all test samples), **macro** is the plain mean over clients.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mcfl.engine import EvalCounts


class ClientMetrics(NamedTuple):
    """Per-client test metrics, each [C] (NaN for a client without test samples)."""

    n_test: np.ndarray
    accuracy: np.ndarray
    f1: np.ndarray
    loss: np.ndarray


def client_metrics(counts: EvalCounts, n_test: np.ndarray) -> ClientMetrics:
    """Accuracy, macro-F1 and mean loss of each client from its confusion counts."""
    n = np.asarray(n_test, np.float64)
    tp = np.asarray(counts.true_pos, np.float64)
    fp = np.asarray(counts.false_pos, np.float64)
    fn = np.asarray(counts.false_neg, np.float64)
    denom = 2 * tp + fp + fn
    present = denom > 0  # classes in the client's labels or predictions
    per_class = np.divide(2 * tp, denom, out=np.zeros_like(tp), where=present)
    with np.errstate(invalid="ignore", divide="ignore"):
        f1 = per_class.sum(1) / present.sum(1)
        accuracy = np.asarray(counts.correct, np.float64) / n
        loss = np.asarray(counts.loss_sum, np.float64) / n
    has_test = n > 0
    return ClientMetrics(
        n_test=np.asarray(n_test),
        accuracy=np.where(has_test, accuracy, np.nan),
        f1=np.where(has_test, f1, np.nan),
        loss=np.where(has_test, loss, np.nan),
    )


def group_accuracies(metrics: ClientMetrics, groups: np.ndarray) -> dict[str, float]:
    """The micro accuracy (test rows pooled) of two planted groups of clients:
    ``worst_group_accuracy``, the group scored lowest (the fairness score of clustered-FL
    benchmarks: a method that serves the big groups and fails a small one looks good on the
    average alone), and ``smallest_group_accuracy``, the group with the fewest clients (ties: the
    lowest group id), the clients DP's noise on a cluster's model hurts most, since the noise on
    a cluster's mean scales as z C / n_k. Groups without test rows are skipped."""
    groups = np.asarray(groups)
    has = metrics.n_test > 0
    ids, sizes = np.unique(groups, return_counts=True)
    scored = {}
    for group in ids:  # a loop over the R planted groups (a handful), on the host
        members = (groups == group) & has
        if members.any():
            w = metrics.n_test[members].astype(np.float64)
            scored[int(group)] = float(np.sum(w * metrics.accuracy[members]) / np.sum(w))
    if not scored:
        return {}
    out = {"worst_group_accuracy": min(scored.values())}
    smallest = int(ids[np.argmin(sizes)])
    if smallest in scored:
        out["smallest_group_accuracy"] = scored[smallest]
    return out


def aggregate(metrics: ClientMetrics) -> dict[str, float]:
    """Micro (test-sample-weighted) and macro (mean over clients) accuracy and F1."""
    has = metrics.n_test > 0
    w = metrics.n_test[has].astype(np.float64)
    acc, f1, loss = metrics.accuracy[has], metrics.f1[has], metrics.loss[has]
    return {
        "accuracy_micro": float(np.sum(w * acc) / np.sum(w)),
        "accuracy_macro": float(np.mean(acc)),
        "f1_micro": float(np.sum(w * f1) / np.sum(w)),
        "f1_macro": float(np.mean(f1)),
        "test_loss": float(np.sum(w * loss) / np.sum(w)),
    }
