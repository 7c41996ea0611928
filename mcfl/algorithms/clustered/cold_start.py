"""FedGroup's and FlexCFL's pre-training (Duan et al., paper 004): what a client trains from
W_0 to give the clustering, or the choice of a newcomer's group, its direction dW_i.

Three forms (`FedGroupParams.pretrain`, `pretrain_steps`):

* "epoch" (default), the paper's: "the pre-training procedure does not occupy a whole
  communication round, the client can continue to train E - 1 epochs and upload the parameters
  updates for the intra-group aggregation" (Sec. 3.4, its last paragraph). dW_i is one local
  epoch from W_0 (ceil(n_i / B) steps; with `local_steps` L, min(that, L)); the client goes on
  from where it got to for the rest of its round (E - 1 epochs, shuffled by the round's key)
  and its model joins its group's FedAvg: E epochs in all, one round of communication (W_0
  down; dW_i and the model up). The group cold start's clients do so at initialisation (a
  group's first model is their mean weighted by n_i, the intra-group aggregation of Alg. 2), a
  newcomer in the round it joins (it starts from its pre-trained model, not the group's;
  ``newcomer_join="update"`` enters it as its update from W_0 applied to the group's model).
* ``pretrain_steps`` N, the authors' code (their fedgroup.py lines 82 and 299: 50 mini-batch
  steps of B): dW_i is N steps from W_0; a group's first model is the plain mean of its
  members' pre-trained models (Alg. 3 line 16; their simply_averaging_aggregate); a newcomer
  then trains its E epochs from its group's model, like every member.
* "full", mcfl's earlier form (neither the paper's nor the authors'): dW_i is the whole local
  training (E epochs) from W_0, then as ``pretrain_steps``. Kept to reproduce earlier results.

A migrating client (FlexCFL) pre-trains the same way, outside the round's training.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

from mcfl.algorithms.clustered.shared import flat_models, write_received
from mcfl.algorithms.framework.base import stack
from mcfl.algorithms.framework.skeleton import transformed
from mcfl.engine import (
    RoundClients,
    Start,
    client_num_steps,
    segment_mean,
    train_and_aggregate,
    train_and_collect,
)

PRETRAINS = ("epoch", "full")


def pretraining(training, params):
    """The local training of the pre-training from W_0 (Alg. 3 line 5): one epoch (the
    paper), `pretrain_steps` steps (the authors' code) or the whole local training ("full")."""
    if params.pretrain_steps is not None:
        return training.replace(local_epochs=1, local_steps=params.pretrain_steps)
    if params.pretrain == "full":
        return training
    return training.replace(local_epochs=1, local_steps=None)


def continues(params) -> bool:
    """Whether a pre-trained client goes on from its pre-trained model for the rest of its
    round (the paper, Sec. 3.4) instead of training a round from its group's model."""
    return params.pretrain == "epoch" and params.pretrain_steps is None


def pretrain(data, key, w0, clients, hp, active=None, *, exchange=None, block_size=None):
    """The pre-training of `clients` from W_0 (only the `active` ones train; the others take no
    step): their updates dW [S, d] (zeros for the inactive), models [S, ...], steps taken [S]
    and summed training losses [S]. In the paper's form a client pre-trains one epoch, at most
    its round's steps. In a round (`exchange` given) the clients start from their own
    normalisation layers and dW, which they send, goes through the run's transform; the
    models they go on from stay as trained."""
    round_steps = None
    if continues(hp.params):
        round_steps = client_num_steps(data.train_counts[clients], hp.training)
    trained, stats, _ = train_and_collect(
        Start(stack(w0), RoundClients(clients, jnp.zeros_like(clients), active, steps=round_steps),
              training=pretraining(hp.training, hp.params)),
        data, key, exchange=exchange, sent=None, block_size=block_size)
    updates = flat_models(trained) - ravel_pytree(w0)[0][None]
    if exchange is not None:
        updates = transformed(exchange, updates)
    steps = stats.steps.astype(jnp.int32)
    return updates, trained, steps, stats.loss * steps


def group_models_going_on(data, key, pretrained, clients, taken, labels, num_groups: int, hp,
                          block_size=None):
    """[K, ...] group models after the paper's group cold start: each pre-training client goes
    on from its pre-trained model for the rest of its round's steps (its round's count less the
    `taken` ones), and each group takes its members' mean weighted by n_i (an empty group:
    zeros)."""
    counts = data.train_counts[clients]
    rest = client_num_steps(counts, hp.training) - taken
    index = jnp.arange(clients.shape[0], dtype=jnp.int32)
    sums, weight_sums, _, _, _ = train_and_aggregate(
        Start(pretrained, RoundClients(clients, index, steps=rest), counts, labels, num_groups,
              training=hp.training),
        data, key, block_size=block_size)
    return segment_mean(sums, weight_sums, jax.tree.map(jnp.zeros_like, sums))


def round_start(models, pretrained, clients, group, newcomer, taken, counts, training):
    """The start models and `RoundClients` of a round: each client starts from its group's
    model (row g of `models` [K, ...]), except, when `pretrained` [S, ...] is given (the
    paper's form), a newcomer, which goes on from its pre-trained model (row K + j) for the
    rest of its round's steps."""
    if pretrained is None:
        return models, RoundClients(clients, group)
    num_groups = jax.tree.leaves(models)[0].shape[0]
    start_models = jax.tree.map(lambda g, p: jnp.concatenate([g, p]), models, pretrained)
    own = num_groups + jnp.arange(clients.shape[0], dtype=jnp.int32)
    steps = client_num_steps(counts, training) - taken
    return start_models, RoundClients(clients, jnp.where(newcomer, own, group), steps=steps)


def newcomers_as_updates(sums, models, w0, weights, newcomer, group):
    """Group sums [K, ...] of n_i w_i in which each newcomer i (went on from W_0) counts as its
    update applied to its group's model, n_i (w_g + w_i - W_0), instead of its model: the
    paper's newcomer "upload[s] the parameters updates for the intra-group aggregation"
    (Sec. 3.4), which aggregates updates (Sec. 3.1; the authors' group.py adds the members'
    mean update to the group's model)."""
    num_groups = jax.tree.leaves(models)[0].shape[0]
    # [K] each group's summed newcomer weight
    newcomer_weights = jnp.where(newcomer, weights, 0).astype(jnp.float32) @ jax.nn.one_hot(
        group, num_groups)

    def leaf(s, g, w):
        scale = newcomer_weights.reshape((-1,) + (1,) * (g.ndim - 1))
        return s + scale * (g - w[None]).astype(s.dtype)

    return jax.tree.map(leaf, sums, models, w0)


def with_pretraining(stats, taken, loss_sums, going_on: bool):
    """The round's client stats counting the pre-training's steps; when the client went on
    from it (the paper's form: it is the round's first epoch), its loss too."""
    steps = stats.steps + taken
    if going_on:
        loss = (stats.loss * stats.steps + loss_sums) / jnp.maximum(steps, 1)
        stats = stats._replace(loss=loss)
    return stats._replace(steps=steps)


def with_w0(models, w0):
    """The group models [K, ...] and W_0 as row K: [K + 1, ...]."""
    return jax.tree.map(lambda g, w: jnp.concatenate([g, w[None]]), models, w0)


def received_models(received, models, w0, clients, group, newcomer, going_on: bool):
    """`received` [C, ...] with the round's clients' start models written in: their group's,
    or W_0 for a newcomer going on from its pre-training epoch (`evaluate_with`
    last_received)."""
    if not going_on:
        return write_received(received, models, clients, group)
    num_groups = jax.tree.leaves(models)[0].shape[0]
    return write_received(received, with_w0(models, w0), clients,
                          jnp.where(newcomer, num_groups, group))
