"""The round loop on the host, written once for a run and for the members of a sweep.

The rounds run in chunks, one host call each (`round_chunks`: one round, or with scanned
rounds every round up to the next evaluation). After each chunk, for every member still
running: a row per round (``{"round", **metrics, "seconds"}``), the finite check (a non-finite
value stops the member: status "diverged", its rows before it kept), the communication
(`records.add_communication`); on evaluated rounds (every ``eval_every`` and the last), the
evaluation of every member at once, its accuracy / F1 aggregates and its cluster metrics. A
run is the loop with one member; `mcfl.run` turns its divergence into an error, a sweep keeps
its other members going.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, Optional

import jax
import numpy as np

from mcfl.data import FederatedDataset
from mcfl.runs.evaluation import aggregate, client_metrics, group_accuracies
from mcfl.runs.records import MemberRecord, add_communication, cluster_metrics


class RoundChunks(Sequence):
    """(first round, number of rounds) of each host call, as a sequence computed on demand: one
    round at a time, or, scanned, every round up to the next evaluation (every `eval_every`
    rounds and the last) or checkpoint round (every `checkpoint_every`) as one call. A million
    rounds take no list of a million pairs: unscanned chunks are implicit, scanned ones are the
    array of their last rounds. `after(done)` is what remains after round `done`."""

    def __init__(self, rounds: int, eval_every: int, scanned: bool,
                 checkpoint_every: Optional[int] = None, done: int = 0):
        self.rounds, self.scanned, self.done = rounds, scanned, done
        self.eval_every, self.checkpoint_every = eval_every, checkpoint_every
        self._ends = None
        if scanned:
            periods = [eval_every] + ([checkpoint_every] if checkpoint_every else [])
            ends = np.unique(np.concatenate(
                [np.arange(p, rounds + 1, p, dtype=np.int64) for p in periods]
                + [np.asarray([rounds], np.int64)]))
            self._ends = ends[ends > done]

    def __len__(self) -> int:
        return len(self._ends) if self.scanned else max(self.rounds - self.done, 0)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        if not self.scanned:
            return (self.done + index + 1, 1)
        end = int(self._ends[index])
        first = int(self._ends[index - 1]) + 1 if index > 0 else self.done + 1
        return (first, end - first + 1)

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None

    def after(self, done: int) -> RoundChunks:
        """The chunks after round `done` (a resumed run's: `done` ends a chunk)."""
        return RoundChunks(self.rounds, self.eval_every, self.scanned, self.checkpoint_every,
                           max(done, self.done))

    @property
    def evaluations(self) -> int:
        """How many of the chunks end at an evaluated round (every `eval_every`, the last)."""
        every, rounds, done = self.eval_every, self.rounds, self.done
        if done >= rounds:
            return 0
        return rounds // every - done // every + (rounds % every != 0)

    def lengths(self) -> dict[int, int]:
        """How many chunks have each length."""
        if not self.scanned:
            return {1: len(self)} if len(self) else {}
        firsts = np.concatenate([[self.done], self._ends[:-1]])
        counts, times = np.unique(self._ends - firsts, return_counts=True)
        return {int(c): int(t) for c, t in zip(counts, times)}


def round_chunks(rounds: int, eval_every: int, scanned: bool,
                 checkpoint_every: Optional[int] = None) -> RoundChunks:
    """The host calls of `rounds` rounds (`RoundChunks`): one round each, or, scanned, the
    rounds up to each evaluation or checkpoint round as one call (a few lengths, each one
    compilation)."""
    return RoundChunks(rounds, eval_every, scanned, checkpoint_every)


class LoopHooks:
    """What the loop tells its caller (all optional no-ops): a chunk about to run (its index),
    each member's new row, and a chunk done (its index, its last round and the state, whole
    here: a checkpoint may be taken, or the loop stopped by raising)."""

    def chunk_started(self, index: int) -> None: ...

    def row(self, member: int, row: dict[str, Any]) -> None: ...

    def chunk_finished(self, index: int, last_round: int, state) -> None: ...


def later_columns(program, dataset: FederatedDataset) -> tuple[str, ...]:
    """The columns only evaluated rounds have, which a run's and a sweep member's observers
    are told of at the start: cluster metrics, the planted groups' and the held-out
    clients'."""
    later = ()
    if program.clustered:  # cluster metrics arrive with evaluated rounds
        later = ("cluster_sizes", "clients_waiting") + (("cluster_ari", "cluster_nmi")
                                                      if dataset.true_cluster is not None
                                                      else ())
    if dataset.true_cluster is not None:  # (evaluated rounds: the planted groups')
        later += ("worst_group_accuracy", "smallest_group_accuracy")
    if dataset.unseen is not None:  # (evaluated rounds: the held-out clients')
        later += UNSEEN_KEYS
        if dataset.unseen.true_cluster is not None:
            later += UNSEEN_GROUP_KEYS + (UNSEEN_CLUSTER_KEYS if program.clustered else ())
    return later


class RoundInputs(NamedTuple):
    """What the members' rounds take beside their state: the traced `values` (a sweep's; {}
    for a run) and the `rounds_keys` (round r's key is ``fold_in(rounds_key, r)``)."""

    values: Any
    rounds_keys: Any


def run_rounds(program, dataset: FederatedDataset, state, inputs: RoundInputs,
               records: Sequence[MemberRecord], chunks: Sequence[tuple[int, int]],
               hooks: Optional[LoopHooks] = None, keep: bool = False):
    """Run `chunks` of rounds of `program` (`mcfl.runs.program.RoundProgram`) from `state`,
    adding to each member's record; returns the final state. The members share the program's
    plan (its schedule of evaluations, its rounds). With `keep`, each record also keeps every
    evaluated round's assignments and the last evaluation's per-client metrics (a run's files
    need them)."""
    hooks = hooks or LoopHooks()
    values, rounds_keys = inputs
    data = dataset.arrays
    params_count = program.run_plan.params_count
    eval_every, rounds = program.plan.evaluation.eval_every, program.run_plan.rounds
    for index, (first, count) in enumerate(chunks):
        hooks.chunk_started(index)
        t0 = time.perf_counter()
        state, metrics = program.rounds(count, values, state, data, rounds_keys, first)
        seconds = (time.perf_counter() - t0) / count
        if not program.members:
            metrics = {k: np.asarray(v)[None] for k, v in metrics.items()}
        fresh = [_chunk_rows(record, metrics, m, first, count, seconds, params_count)
                 for m, record in enumerate(records)]
        last = first + count - 1
        if (last % eval_every == 0 or last == rounds) and any(
                record.running for record in records):
            _evaluate(program, values, state, dataset, records, fresh, last, keep)
        for m, (record, rows) in enumerate(zip(records, fresh)):
            record.rows.extend(rows)
            for row in rows:
                hooks.row(m, row)
        if not any(record.running for record in records):
            return state
        hooks.chunk_finished(index, last, state)
    for record in records:
        if record.running:
            record.status = "completed"
    return state


def client_scores(program, values, state, dataset: FederatedDataset):
    """Every client's scores under `state` (a one-member program's evaluation): what a run's
    last evaluation gives, computed again for a run resumed after its last round."""
    counts, test_counts, _ = program.evaluate(values, state, dataset.arrays)
    return client_metrics(counts, np.asarray(test_counts))


def _chunk_rows(record: MemberRecord, metrics: dict, member: int, first: int, count: int,
                seconds: float, params_count: int) -> list[dict[str, Any]]:
    """A running member's rows of one chunk, up to a non-finite one (which stops it)."""
    rows: list[dict[str, Any]] = []
    if not record.running:
        return rows
    for j in range(count):
        row = {"round": first + j, **{k: float(v[member, j]) for k, v in metrics.items()},
               "seconds": seconds}
        if row.get("clients_reported") == 0:
            # nobody reported: the round trained nothing the server heard of, so it has no
            # training loss (an empty cell, skipped by plots), not a loss of 0
            row.update({k: None for k in REPORTED_METRICS if k in row})
        if not all(v is None or math.isfinite(v) for v in row.values()):
            record.status, record.diverged_row = "diverged", row
            break
        if record.epsilons is not None:  # (infinite without noise: not a divergence)
            row["dp_epsilon"] = float(record.epsilons[row["round"] - 1])
        record.round_seconds.append(seconds)
        record.comm_total += add_communication(row, params_count, record.comm_total)
        rows.append(row)
    return rows


# A round's metrics that average over the clients that reported: none when nobody did.
REPORTED_METRICS = ("train_loss", "discrepancy", "local_steps")
UNSEEN_KEYS = ("unseen_accuracy_micro", "unseen_accuracy_macro")
UNSEEN_GROUP_KEYS = ("unseen_worst_group_accuracy",)
UNSEEN_CLUSTER_KEYS = ("unseen_cluster_ari", "unseen_cluster_nmi")


def _unseen_scores(program, values, state, dataset: FederatedDataset) -> Optional[list[dict]]:
    """Per member, the scores of the clients held out of training (`mcfl.data.unseen`), each
    served the model its algorithm offers a newcomer without reading its labels: micro and
    macro accuracy, the worst planted group's, and for a clustered algorithm the agreement
    (ARI, NMI) of the models they were served with their planted groups. None without held-out
    clients, or for an algorithm with nothing to serve them."""
    if dataset.unseen is None:
        return None
    found = program.evaluate_unseen(values, state, dataset.arrays, dataset.unseen.arrays)
    if found is None:
        return None
    if not program.members:
        found = jax.tree.map(lambda a: np.asarray(a)[None], found)
    counts, test_counts, served = found
    true = dataset.unseen.true_cluster
    out = []
    for m in range(len(test_counts)):
        scores = client_metrics(jax.tree.map(lambda a, m=m: a[m], counts),
                                np.asarray(test_counts[m]))
        totals = aggregate(scores)
        row = {"unseen_accuracy_micro": totals["accuracy_micro"],
               "unseen_accuracy_macro": totals["accuracy_macro"]}
        if true is not None:
            worst = group_accuracies(scores, true).get("worst_group_accuracy")
            if worst is not None:
                row["unseen_worst_group_accuracy"] = worst
            if program.clustered:
                agreement = cluster_metrics(np.asarray(served[m]), true)
                row["unseen_cluster_ari"] = agreement["cluster_ari"]
                row["unseen_cluster_nmi"] = agreement["cluster_nmi"]
        out.append(row)
    return out


def _evaluate(program, values, state, dataset: FederatedDataset, records, fresh, last: int,
              keep: bool) -> None:
    """Evaluate every member; add the scores to each running member's last row."""
    counts, test_counts, assigned = program.evaluate(values, state, dataset.arrays)
    if not program.members:  # one member: give it the member axis
        counts, test_counts, assigned = jax.tree.map(lambda a: np.asarray(a)[None],
                                                     (counts, test_counts, assigned))
    newcomers = _unseen_scores(program, values, state, dataset)
    for m, (record, rows) in enumerate(zip(records, fresh)):
        if not record.running:
            continue
        if newcomers is not None:
            rows[-1].update(newcomers[m])
        own = jax.tree.map(lambda a, m=m: a[m], counts)
        scores = client_metrics(own, np.asarray(test_counts[m]))
        rows[-1].update(aggregate(scores))
        if dataset.true_cluster is not None:
            rows[-1].update(group_accuracies(scores, dataset.true_cluster))
        if assigned is not None:
            assignment = np.asarray(assigned[m])
            rows[-1].update(cluster_metrics(assignment, dataset.true_cluster))
            if keep:
                record.assignments.append(assignment)
                record.assignment_rounds.append(last)
        if keep:
            record.client_metrics = scores
