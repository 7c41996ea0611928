"""A plain per-client Python loop, the reference the vectorised engine must agree with.

It follows the engine's documented batch rule (step s of a client with n rows uses batch
``s % ceil(n/B)`` of epoch ``s // ceil(n/B)``, whose order is `batch_rule.epoch_positions`, the
whole permutation computed at once) with one jitted gradient step per call and no vmap,
blocks, masks or sorting.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mcfl.engine import LocalTraining
from mcfl.engine.batch_rule import epoch_positions


def reference_local_train(training: LocalTraining, data, round_key, params, client: int,
                          correction=None, anchor=None):
    """One client's local training, step by step; `correction` (a tree) is added to every
    step's gradient (FedDANE, SCAFFOLD); the proximal term pulls to `anchor` (default: the
    start `params`; Ditto: the global model)."""
    n = int(data.train_counts[client])
    steps = training.local_steps or training.local_epochs * -(-n // training.batch_size)
    anchor = params if anchor is None else anchor
    optimizer = training.transform()
    opt_state = optimizer.init(params)

    @jax.jit
    def step(p, opt_state, xb, yb):
        def objective(q):
            loss = jnp.mean(
                optax.softmax_cross_entropy_with_integer_labels(training.apply_fn(q, xb), yb)
            )
            sq = sum(
                jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(q), jax.tree.leaves(anchor))
            )
            return loss + 0.5 * (training.mu or 0.0) * sq

        grads = jax.grad(objective)(p)
        if correction is not None:
            grads = jax.tree.map(jnp.add, grads, correction)
        updates, opt_state = optimizer.update(grads, opt_state, p)
        return optax.apply_updates(p, updates), opt_state

    for xb, yb in reference_batches(training, data, round_key, client):
        params, opt_state = step(params, opt_state, xb, yb)
    return params, steps


def client_train_rows(data, client: int):
    """(x, y): all of one client's training rows, in the data's order."""
    lo, n = int(data.train_offsets[client]), int(data.train_counts[client])
    rows = np.asarray(data.train_order)[lo:lo + n]
    return data.x_train[rows], data.y_train[rows]


def reference_batches(training: LocalTraining, data, round_key, client: int):
    """The batches (x, y) of one client's local steps in a round, in order, as the batch rule
    documents them (a partial last batch of an epoch is short, not masked)."""
    offset = int(data.train_offsets[client])
    n = int(data.train_counts[client])
    B = training.batch_size
    steps_per_epoch = -(-n // B)
    steps = training.local_steps or training.local_epochs * steps_per_epoch
    orders = {}
    for s in range(steps):
        epoch, b = divmod(s, steps_per_epoch)
        if epoch not in orders:
            orders[epoch] = np.asarray(epoch_positions(round_key, client, epoch, n))
        pos = np.arange(b * B, min((b + 1) * B, n))
        rows = np.asarray(data.train_order)[offset + orders[epoch][pos]]
        yield data.x_train[rows], data.y_train[rows]


def reference_fedavg_round(training, data, params, round_key, clients_per_round: int):
    """One FedAvg round as `mcfl.algorithms.global_model.fedavg` keys it (the round key split into
    sampling and training keys): each sampled client trains from `params`; average weighted by
    n_i."""
    from mcfl.engine.sampling import sample_clients

    sample_key, train_key = jax.random.split(round_key)
    clients = sample_clients(sample_key, data.num_clients, clients_per_round)
    models, weights = [], []
    for c in np.asarray(clients):
        trained, _ = reference_local_train(training, data, train_key, params, int(c))
        models.append(trained)
        weights.append(float(data.train_counts[c]))
    w = np.asarray(weights) / np.sum(weights)
    return jax.tree.map(lambda *leaves: sum(wi * leaf for wi, leaf in zip(w, leaves)), *models)
