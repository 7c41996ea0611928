"""What a run records: its rows (one per round), what they come to, and its summary.

A row is ``{"round", **the round's metrics, "seconds"}`` plus the communication of the round
(`add_communication`) and, on evaluated rounds, the accuracy / F1 aggregates and the cluster
metrics (`cluster_metrics`). `outcome` turns a run's rows into its final and best scores (a
run's summary.json, a sweep member's line), `summary` adds what describes the run.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Optional

import jax
import numpy as np

from mcfl.data import FederatedDataset
from mcfl.runs.evaluation import ClientMetrics

EVAL_KEYS = ("accuracy_micro", "accuracy_macro", "f1_micro", "f1_macro")
PAPER_SCORE = "paper_best_accuracy_micro"


@dataclasses.dataclass
class MemberRecord:
    """What one run (alone, or a member of a sweep) has recorded so far."""

    rows: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    status: str = "running"  # then completed, diverged (or, for a run, interrupted / error)
    round_seconds: list[float] = dataclasses.field(default_factory=list)
    comm_total: int = 0  # parameters sent in all so far
    # [C] cluster of every client after each evaluated round (kept for runs), and those rounds
    assignments: list[np.ndarray] = dataclasses.field(default_factory=list)
    assignment_rounds: list[int] = dataclasses.field(default_factory=list)
    client_metrics: Optional[ClientMetrics] = None  # the last evaluation's, per client
    diverged_row: Optional[dict[str, Any]] = None  # the row with a non-finite value
    # [rounds] DP's epsilon after each round (`mcfl.privacy.plan`), None without DP
    epsilons: Optional[np.ndarray] = None

    @property
    def running(self) -> bool:
        return self.status == "running"


def outcome(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What a run's rows come to (summary.json; a sweep member's line): "final" (the last
    evaluated round) and "best" (the highest over evaluated rounds) of each of `EVAL_KEYS`,
    the paper's score, the last training loss and the parameters sent in all."""
    evaluated = [row for row in rows if "accuracy_micro" in row]
    out: dict[str, Any] = {}
    for key in EVAL_KEYS:
        values = [row[key] for row in evaluated]
        out[f"final_{key}"] = values[-1] if values else None
        out[f"best_{key}"] = max(values) if values else None
    out[PAPER_SCORE] = paper_score(evaluated)
    out["final_train_loss"] = rows[-1]["train_loss"] if rows else None
    out["comm_params_total"] = rows[-1]["comm_params_total"] if rows else 0
    if rows and "sim_time" in rows[-1]:  # the simulated clock's seconds (mcfl.system)
        out["sim_time"] = rows[-1]["sim_time"]
    return out


def paper_score(evaluated: list[dict[str, Any]]) -> Optional[float]:
    """FlexCFL's score (Duan et al., Sec. 5.1): the best micro accuracy over the evaluated
    rounds at which every client is in a group (`clients_waiting` 0; algorithms without
    groups to join have every client in from round 1); None before that ever happens. Each
    client is scored with the model the run evaluates it with: its group's current model, or
    under ``--evaluate-with last_received`` the one it last received."""
    scored = [row["accuracy_micro"] for row in evaluated
              if "accuracy_micro" in row and row.get("clients_waiting", 0) == 0]
    return max(scored) if scored else None


def add_communication(row: dict[str, Any], num_params: int, total_before: int) -> int:
    """Turn the round's model counts into parameters sent down and up (exact integers), with the
    running total; returns this round's parameters."""
    down = round(row["models_down"]) * num_params
    up = round(row["models_up"]) * num_params
    row.update(comm_params_down=down, comm_params_up=up,
               comm_params_total=total_before + down + up)
    return down + up


def cluster_metrics(assignment: np.ndarray, true_cluster: Optional[np.ndarray]) -> dict:
    """Cluster sizes (as text for the CSV) and, where the data has planted clusters, the
    adjusted Rand index and normalised mutual information against them (scikit-learn)."""
    sizes = np.bincount(assignment[assignment >= 0])  # -1: not yet in a cluster (FedGroup)
    out: dict[str, Any] = {"cluster_sizes": " ".join(str(int(n)) for n in sizes[sizes > 0]),
                           "clients_waiting": int(np.sum(assignment < 0))}
    if true_cluster is not None:
        from sklearn.metrics import adjusted_rand_score, normalized_mutual_info_score

        out["cluster_ari"] = float(adjusted_rand_score(true_cluster, assignment))
        out["cluster_nmi"] = float(normalized_mutual_info_score(true_cluster, assignment))
    return out


def divergence_message(plan, row: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """What a round with a non-finite metric says: which values, which rounds are kept, and what
    to change. Round 1 non-finite already points at the model or the data (a learning rate
    rarely overflows in one round); later, a smaller step: a tenth of the run's --lr, and a
    server step back to plain averaging (1) where the run's is above it."""
    bad = ", ".join(f"{k}={v}" for k, v in row.items()
                    if v is not None and not math.isfinite(v))
    kept = f"rounds 1-{rows[-1]['round']} were kept" if rows else "no round was kept"
    lr = plan.training.lr
    steps = [f"--lr {lr / 10:g} (a tenth of {lr:g})"]
    server_lr = getattr(plan.algorithm.params, "server_lr", None)
    if server_lr is not None and server_lr > 1:
        steps.append(f"--server-lr 1 (plain averaging; now {server_lr:g})")
    smaller = " or ".join(steps)
    if row["round"] == 1:
        return (f"training diverged in round 1: non-finite {bad}; {kept}. Values that are "
                f"non-finite from the first round usually come from the model or the data, "
                f"not the learning rate: check that the model gives finite logits and that the "
                f"data hold no extreme values; if both are sound, try a smaller step, "
                f"{smaller}")
    return (f"training diverged in round {row['round']}: non-finite {bad}; {kept}. Try a "
            f"smaller step, {smaller}, or check the data for extreme values")


def summary(plan, dataset: FederatedDataset, record: MemberRecord, started: float,
            run_plan, status: str) -> dict[str, Any]:
    """summary.json of a run (`plan`: its `mcfl.runs.plan.Plan`; `run_plan`: its
    `mcfl.runs.execution.RunPlan`)."""
    rows, round_seconds = record.rows, record.round_seconds
    out: dict[str, Any] = {
        "status": status,
        "config": plan.config.to_dict(),
        "dataset": {
            "name": dataset.name,
            "clients": dataset.num_clients,
            "train_samples": int(dataset.train_counts().sum()),
            "test_samples": int(dataset.test_counts().sum()),
            "num_classes": dataset.num_classes,
            **({} if dataset.unseen is None else
               {"unseen_clients": dataset.unseen.num_clients,
                "unseen_test_samples": int(dataset.unseen.test_counts().sum())}),
        },
        "num_params": run_plan.params_count,
        "clients_per_round": run_plan.clients_per_round,
        "block_size": run_plan.block_size,
        "rounds_completed": len(rows),
        "backend": jax.default_backend(),
        "device": str(jax.devices()[0].device_kind),
        "jax_version": jax.__version__,
    }
    out.update(outcome(rows))
    # the best accuracy by the run's --score (mcfl: the best evaluated round; paper: FlexCFL's)
    out["score"] = plan.evaluation.score
    out["best_score"] = out[PAPER_SCORE if plan.evaluation.score == "paper"
                            else "best_accuracy_micro"]
    if run_plan.privacy is not None:
        spent = float(record.epsilons[len(rows) - 1]) if rows else 0.0
        out.update(run_plan.privacy.summary(spent, plan.privacy.noise))
        out["dp_clip"] = plan.privacy.clip
        out["clients_reported"] = float(np.mean([r["clients_reported"] for r in rows])) \
            if rows and "clients_reported" in rows[-1] else None
    for key in ("cluster_ari", "cluster_nmi", "num_clusters", "intra_cluster_distance",
                "worst_group_accuracy", "smallest_group_accuracy", "unseen_accuracy_micro",
                "unseen_accuracy_macro", "unseen_worst_group_accuracy", "unseen_cluster_ari",
                "unseen_cluster_nmi"):
        if rows and key in rows[-1]:
            out[key] = rows[-1][key]
    out["wall_seconds"] = time.perf_counter() - started
    # Programs are compiled before round 1 (compile_seconds); round 1 still pays first-touch
    # costs (allocations), so the steady figure is the mean of the later rounds.
    steady = round_seconds[1:] or round_seconds
    out["first_round_seconds"] = round_seconds[0] if round_seconds else None
    out["seconds_per_round"] = float(np.mean(steady)) if steady else None
    return out


def client_table(dataset: FederatedDataset, metrics: ClientMetrics,
                 assignment: Optional[np.ndarray] = None) -> list[dict[str, Any]]:
    """clients.csv: each client's sizes, accuracy and F1, and its cluster (and planted one)."""
    n_train = dataset.train_counts()
    rows = []
    for i, client_id in enumerate(dataset.client_ids):
        row = {
            "client_id": client_id,
            "n_train": int(n_train[i]),
            "n_test": int(metrics.n_test[i]),
            "accuracy": float(metrics.accuracy[i]),
            "f1": float(metrics.f1[i]),
        }
        if assignment is not None:
            row["cluster"] = int(assignment[i])
        if dataset.true_cluster is not None:
            row["true_cluster"] = int(dataset.true_cluster[i])
        rows.append(row)
    return rows
