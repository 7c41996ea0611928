"""Sattler et al.'s own CFL code beside mcfl's CFL on the same planted Fashion-MNIST clients:
which clusters each finds (final ARI against the planted groups), how many, and in which rounds
the splits happened.

    .venv/bin/python benchmarks/peers/cfl_sattler.py --checkout /tmp/sattler_cfl
    .venv/bin/python benchmarks/peers/cfl_sattler.py --checkout DIR --kinds rotated \\
        --groups equal --seeds 0 1 2 --relative
    .venv/bin/python benchmarks/peers/cfl_sattler.py --checkout DIR --rounds 3 --kinds rotated \\
        --groups equal                                     # smoke test (no split can happen)

Their code: github.com/felisat/clustered-federated-learning (PyTorch; checked against commit
23a1c38, "updated notebook"), the reference code of Sattler, Mueller and Samek, "Clustered
Federated Learning: Model-Agnostic Distributed Multitask Optimization Under Privacy
Constraints" (2020). Nothing of that repository is copied here: the user clones it and passes
the folder as ``--checkout``; this script puts that folder on ``sys.path`` and imports
``fl_devices.py`` from it, and only that file (not ``models.py``, ``data_utils.py`` or
``helper.py``, which hold the notebook's EMNIST ConvNet, data split and plots). From it the
harness uses the classes ``Client`` and ``Server`` and their methods
(``synchronize_with_server``, ``compute_weight_update``, ``reset``, ``select_clients``,
``compute_pairwise_similarities``, ``compute_max_update_norm``, ``compute_mean_update_norm``,
``cluster_clients``, ``aggregate_clusterwise``, ``evaluate``) and the module's ``flatten``.

Their training loop is not in a module but in a cell of ``clustered_federated_learning.ipynb``,
so `run_theirs` is a loop written here that makes the same calls in the same order each round:
the first round copies the server's model into every client; then every client (their
``select_clients`` with frac 1.0) computes its weight update and resets its weights to the
round's start; the server computes the cosine similarities of all clients' updates; each
cluster whose mean update norm is below eps1 while its largest member update norm is above
eps2, with more than two members, after round 20 (the notebook's constants; ``--warmup``), is
cut in two by their ``cluster_clients`` (complete-linkage agglomerative clustering of the
negated similarities); finally each cluster's members add their cluster's mean update.
Where this loop departs from the notebook, on purpose:

* the notebook appends the halves ``cluster_clients`` returns as they are, i.e. as positions
  within the parent's similarity sub-matrix, which are client indices only when the parent is
  the whole population (the first split); this loop maps them back to client indices
  (``idc[c1]``, ``idc[c2]``), so later splits act on the clients the split saw;
* it leaves out the notebook's per-round ``client.evaluate()`` on each client's internal
  validation split and ``server.cache_model`` (they only feed the notebook's plots and its
  final table of models); with ``train_frac = 1`` (below) that split is empty.

The data are `planted_groups.planted` (240 clients, 4 planted groups: rotated, permuted or
label_swap, equal or uneven sizes; the data seed is ``--data-seed``, as planted_groups.py
builds one dataset per setting). Each of their ``Client``s gets a ``TensorDataset`` of exactly
the training rows mcfl's client trains on, with ``train_frac=1.0`` (their ``Client`` would
otherwise keep 20% back for its own validation split; with 1.0 it trains on all the rows it is
given and its validation split is empty). The accuracy reported for their side is micro
accuracy on mcfl's test rows of each client, measured with their ``Client.evaluate`` given a
loader of those rows, so both codes are scored on the same rows.

Settings (both codes): MCLR (their side: ``torch.nn.Linear(784, 10)`` on the flat 784 inputs,
torch's default initialisation; mcfl: ``--model mclr``, LeCun-normal kernel, zero bias), plain
SGD lr 0.05 (their ``optimizer_fn``; one optimizer per client, kept across rounds as in their
code), B = 10, E = 5 (their ``compute_weight_update(epochs=5)``), 60 rounds, every client
every round. Their code multiplies each client's learning rate by 0.99 before every update
(lr 0.05 * 0.99^t in round t), mcfl keeps it constant; ``--no-lr-decay`` undoes the decay from
the harness (it sets the optimizer's lr to lr / 0.99 before each call) to isolate it.

Thresholds: their EPS_1 = 0.4, EPS_2 = 1.6 are absolute update norms for the notebook's EMNIST
ConvNet (lr 0.1, momentum 0.9, E = 1). ``--eps1 --eps2`` set them (absolute by default, for
both codes: mcfl's ``cfl_thresholds="absolute"``); ``--relative`` makes both multiples of the
update scale, the clients' mean update norm averaged over the first ``--warmup`` rounds (mcfl's
default, eps1 0.4 and eps2 0.5 unless given): mcfl computes its scale itself, this loop the
same quantity from their updates (``torch.norm(flatten(client.dW))``), so each code applies the
same relative thresholds to its own scale.

Three columns (``--codes``): ``sattler`` (their code, this loop); ``mcfl-paper``: mcfl's CFL set
to the paper's algorithm (``cfl_rejoin="stay"``: clients stay where a split put them, as under
full participation; ``cfl_separation=-2``: no test that the halves separate, which
mcfl adds by default; the same thresholds); ``mcfl-default``: mcfl's CFL with its own defaults
(rejoin "all", separation 0.1, relative thresholds 0.4 / 0.5, warm-up 20). Their code
has no limit on the number of clusters; mcfl has at most K = ``--clusters`` (8) slots.

Run-time compatibility edits (their files are never modified):

* scikit-learn 1.4 removed ``AgglomerativeClustering(affinity=...)`` in favour of ``metric=``;
  their ``Server.cluster_clients`` passes ``affinity="precomputed"``. When the installed
  scikit-learn no longer takes ``affinity``, the harness rebinds the name
  ``AgglomerativeClustering`` inside the imported ``fl_devices`` module to a small function
  that passes ``affinity`` on as ``metric`` (`_agglomerative_compat`). Nothing else is changed.
* Their ``Server`` is given the pooled test rows as its data (the notebook gives it its test
  set); it never uses them here.

Output: one Markdown row per (data, groups, seed, code): final ARI (scikit-learn
``adjusted_rand_score`` against the planted groups), clusters, the rounds in which splits
happened (a round listed twice had two splits), the warm-up update scale, micro accuracy on
the clients' test rows, mean seconds per round (rounds 2..R; mcfl's excludes compilation) and
the run's seconds (mcfl's include compilation). torch runs ``--threads`` threads (1 by
default: on a shared 2-core machine that is the steadier choice; see README.md).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # benchmarks/

import numpy as np  # noqa: E402
from planted_groups import GROUP_SIZES, planted  # noqa: E402
from sklearn.metrics import adjusted_rand_score  # noqa: E402

import mcfl  # noqa: E402
from mcfl.data.export import row_indices_of_clients  # noqa: E402

CODES = ("sattler", "mcfl-paper", "mcfl-default")
LR, BATCH, EPOCHS = 0.05, 10, 5
ABSOLUTE_EPS = (0.4, 1.6)  # the notebook's EPS_1, EPS_2
RELATIVE_EPS = (0.4, 0.5)  # mcfl's defaults (CFLParams)


def import_theirs(checkout: Path):
    """Their ``fl_devices`` module from `checkout`, with the compatibility edit applied; returns
    (module, list of edits applied)."""
    if not (checkout / "fl_devices.py").is_file():
        sys.exit(f"--checkout {checkout}: no fl_devices.py there (clone "
                 "github.com/felisat/clustered-federated-learning and pass its folder)")
    sys.path.insert(0, str(checkout))
    fl = importlib.import_module("fl_devices")
    edits = []
    from sklearn.cluster import AgglomerativeClustering

    if "affinity" not in inspect.signature(AgglomerativeClustering).parameters:
        def _agglomerative_compat(*args, affinity=None, **kwargs):
            """Compatibility edit (harness code): scikit-learn >= 1.4 calls `affinity`
            `metric`."""
            if affinity is not None:
                kwargs.setdefault("metric", affinity)
            return AgglomerativeClustering(*args, **kwargs)

        fl.AgglomerativeClustering = _agglomerative_compat
        edits.append("fl_devices.AgglomerativeClustering: affinity= passed as metric=")
    return fl, edits


def run_theirs(fl, data, seed: int, rounds: int, eps: tuple[float, float], relative: bool,
               warmup: int, lr_decay: bool, verbose: bool) -> dict:
    """Their CFL (fl_devices' Client and Server) in a loop making the notebook's calls."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    a = data.arrays
    x_train, y_train = np.asarray(a.x_train, np.float32), np.asarray(a.y_train, np.int64)
    x_test, y_test = np.asarray(a.x_test, np.float32), np.asarray(a.y_test, np.int64)
    features = int(np.prod(data.feature_shape))

    def model_fn():
        return torch.nn.Linear(features, data.num_classes)

    def optimizer_fn(params):
        return torch.optim.SGD(params, lr=LR)

    def rows(x, y, idx):
        return TensorDataset(torch.from_numpy(x[idx].reshape(len(idx), -1)),
                             torch.from_numpy(y[idx]))

    n = data.num_clients
    clients = [fl.Client(model_fn, optimizer_fn, rows(x_train, y_train, idx), idnum=i,
                         batch_size=BATCH, train_frac=1.0)
               for i, idx in enumerate(row_indices_of_clients(data, "train"))]
    server = fl.Server(model_fn, rows(x_test, y_test, np.arange(len(y_test))))

    cluster_indices = [np.arange(n).astype("int")]
    splits, scale_sum, scale_rounds, round_seconds = [], 0.0, 0, []
    for c_round in range(1, rounds + 1):
        start = time.perf_counter()
        if c_round == 1:
            for client in clients:
                client.synchronize_with_server(server)
        participating = server.select_clients(clients, frac=1.0)
        for client in participating:
            if not lr_decay:  # --no-lr-decay (harness): their *= 0.99 then gives LR again
                client.optimizer.param_groups[0]["lr"] = LR / 0.99
            client.compute_weight_update(epochs=EPOCHS)
            client.reset()
        similarities = server.compute_pairwise_similarities(clients)
        if c_round <= max(warmup, 1):  # the update scale (used by --relative)
            scale_sum += float(np.mean([torch.norm(fl.flatten(c.dW)).item() for c in clients]))
            scale_rounds += 1
        scale = scale_sum / scale_rounds
        eps1, eps2 = (eps[0] * scale, eps[1] * scale) if relative else eps
        cluster_indices_new = []
        for idc in cluster_indices:
            max_norm = server.compute_max_update_norm([clients[i] for i in idc])
            mean_norm = server.compute_mean_update_norm([clients[i] for i in idc])
            if mean_norm < eps1 and max_norm > eps2 and len(idc) > 2 and c_round > warmup:
                c1, c2 = server.cluster_clients(similarities[idc][:, idc])
                cluster_indices_new += [idc[c1], idc[c2]]  # (the notebook: [c1, c2])
                splits.append(c_round)
            else:
                cluster_indices_new += [idc]
            if verbose:
                print(f"  sattler round {c_round}: cluster of {len(idc)}: mean norm "
                      f"{mean_norm:.4g} (eps1 {eps1:.4g}), max norm {max_norm:.4g} (eps2 "
                      f"{eps2:.4g})", file=sys.stderr, flush=True)
        cluster_indices = cluster_indices_new
        client_clusters = [[clients[i] for i in idcs] for idcs in cluster_indices]
        server.aggregate_clusterwise(client_clusters)
        round_seconds.append(time.perf_counter() - start)

    assignment = np.empty(n, int)
    for k, idc in enumerate(cluster_indices):
        assignment[idc] = k
    correct = total = 0
    for client, idx in zip(clients, row_indices_of_clients(data, "test")):
        if len(idx):
            loader = DataLoader(rows(x_test, y_test, idx), batch_size=512, shuffle=False)
            correct += client.evaluate(loader) * len(idx)
            total += len(idx)
    return {"assignment": assignment, "splits": splits, "scale": scale,
            "accuracy": correct / total if total else float("nan"),
            "round_seconds": round_seconds}


def run_mcfl(code: str, data, seed: int, rounds: int, clusters: int,
             eps: tuple[float, float], relative: bool, warmup: int) -> dict:
    """mcfl's CFL, set to the paper's algorithm (`mcfl-paper`) or with its defaults."""
    settings = {}
    if code == "mcfl-paper":
        settings = dict(cfl_rejoin="stay", cfl_separation=-2.0, cfl_eps1=eps[0],
                        cfl_eps2=eps[1], cfl_warmup=warmup,
                        cfl_thresholds="relative" if relative else "absolute")
    config = mcfl.RunConfig(algorithm="cfl", model="mclr", lr=LR, local_epochs=EPOCHS,
                            batch_size=BATCH, clusters=clusters, rounds=rounds,
                            eval_every=rounds, clients_per_round=1.0, embed_clients=0,
                            clients=data.num_clients, seed=seed, **settings)
    result = mcfl.run(config, dataset=data)
    counts = [r["num_clusters"] for r in result.rounds]
    splits = [r["round"] for before, r in zip([1] + counts, result.rounds)
              for _ in range(int(round(r["num_clusters"] - before)))]
    s = result.summary
    return {"assignment": np.asarray(result.assignments[-1]), "splits": splits,
            "scale": result.rounds[-1]["update_scale"],
            "accuracy": s["final_accuracy_micro"],
            "round_seconds": [s["first_round_seconds"]]
            + [s["seconds_per_round"]] * (rounds > 1)}


def row(kind, groups, seed, code, thresholds, out, truth, seconds) -> str:
    steady = out["round_seconds"][1:] or out["round_seconds"]
    splits = ", ".join(map(str, out["splits"])) or "none"
    return (f"| {kind} | {groups} | {seed} | {code} | {thresholds} | "
            f"{adjusted_rand_score(truth, out['assignment']):.3f} | "
            f"{len(np.unique(out['assignment']))} | {splits} | {out['scale']:.3g} | "
            f"{out['accuracy']:.3f} | {np.mean(steady):.2f} | {seconds:.0f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkout", type=Path, required=True,
                        help="a clone of github.com/felisat/clustered-federated-learning")
    parser.add_argument("--kinds", nargs="+", default=["rotated", "permuted", "label_swap"])
    parser.add_argument("--groups", nargs="+", choices=tuple(GROUP_SIZES),
                        default=["equal", "uneven"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--codes", nargs="+", choices=CODES, default=list(CODES))
    parser.add_argument("--clusters", type=int, default=8, help="mcfl's K (at most K clusters)")
    parser.add_argument("--relative", action="store_true",
                        help="eps1, eps2 as multiples of the warm-up update scale (both codes)")
    parser.add_argument("--eps1", type=float, default=None,
                        help="default: 0.4 (absolute, the notebook's; relative, mcfl's)")
    parser.add_argument("--eps2", type=float, default=None,
                        help="default: 1.6 absolute (the notebook's), 0.5 relative (mcfl's)")
    parser.add_argument("--warmup", type=int, default=20,
                        help="no split before round warmup + 1 (the notebook's c_round > 20)")
    parser.add_argument("--no-lr-decay", action="store_true",
                        help="undo their lr *= 0.99 per update (harness edit, for isolation)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--verbose", action="store_true", help="their per-round norms (stderr)")
    args = parser.parse_args()
    default = RELATIVE_EPS if args.relative else ABSOLUTE_EPS
    eps = (default[0] if args.eps1 is None else args.eps1,
           default[1] if args.eps2 is None else args.eps2)
    thresholds = f"{'rel' if args.relative else 'abs'} {eps[0]:g} / {eps[1]:g}"
    fl = None
    if "sattler" in args.codes:
        import torch

        torch.set_num_threads(args.threads)
        fl, edits = import_theirs(args.checkout.resolve())
        print(f"their fl_devices from {args.checkout}; run-time edits: "
              f"{'; '.join(edits) or 'none'}; torch {torch.__version__}, "
              f"{torch.get_num_threads()} threads; their lr decay "
              f"{'off (--no-lr-decay)' if args.no_lr_decay else 'on'}\n")
    print("| data | groups | seed | code | eps1 / eps2 | ARI | clusters | split rounds | "
          "update scale | micro acc | s/round | s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for kind in args.kinds:
        for groups in args.groups:
            data = planted(kind, GROUP_SIZES[groups], args.data_seed)
            for seed in args.seeds:
                for code in args.codes:
                    start = time.perf_counter()
                    if code == "sattler":
                        out = run_theirs(fl, data, seed, args.rounds, eps, args.relative,
                                         args.warmup, not args.no_lr_decay, args.verbose)
                        label = thresholds
                    else:
                        out = run_mcfl(code, data, seed, args.rounds, args.clusters, eps,
                                       args.relative, args.warmup)
                        label = thresholds if code == "mcfl-paper" else "rel 0.4 / 0.5"
                    print(row(kind, groups, seed, code, label, out, data.true_cluster,
                              time.perf_counter() - start), flush=True)


if __name__ == "__main__":
    main()
