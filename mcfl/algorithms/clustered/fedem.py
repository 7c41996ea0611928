"""FedEM (Marfoq, Neglia, Bellet, Kameni and Vidal, NeurIPS 2021, "Federated Multi-Task
Learning under a Mixture of Distributions"), Algorithm 2 with full-batch E-steps.

Every client's data is modelled as a mixture of K shared components: client t draws a sample
from component m with probability pi_tm, and predicts with the mixture of the components'
predictions,  p_t(y | x) = sum_m pi_tm p_m(y | x; theta_m).  A round, for each sampled client
(EM on the client's own rows, from the round's components theta^t):

    E-step    q_t(z_i = m)  ∝  pi_tm exp(-l(theta_m^t; x_i, y_i))      (each training row i)
    M-step    pi_tm <- (1 / n_t) sum_i q_t(z_i = m)
              theta_m <- E local epochs of the optimizer on
                         (1 / n_t) sum_i q_t(z_i = m) l(theta_m; x_i, y_i)

and the server averages each component over the sampled clients, weighted by n_t. The K
components start from K independent random initialisations and every client's pi_t from
1 / K, as in the paper; a client's pi_t is its row of the run's client store
(`mcfl.algorithms.framework.stored`), K numbers. Each client is evaluated with its own mixture (its
personalised model); its hard cluster, reported for the ARI, is the component of largest
pi_tm, as of its last round (the closing embedding trains each client from that component).

The local solver trains all K components on the same batches, each on its weighted loss (the
gradient separates by component, so this is K local solvers side by side), and recomputes a
batch's weights q from the round's starting components: K forward passes more a step.

Defaults: K = --clusters components (the paper's M), pi from 1 / K, full-batch E-steps; no
hyperparameter of its own.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import jax
import jax.numpy as jnp

from mcfl.algorithms.clustered.shared import cluster_count
from mcfl.algorithms.framework.base import (
    ClientState,
    FederatedAlgorithm,
    RowModels,
    refuse_stateful,
    sampled,
    stack,
    training_key,
    training_metrics,
)
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import weighted_mean_of
from mcfl.algorithms.framework.stored import at_storage_precision
from mcfl.data.federated import FederatedData
from mcfl.engine import (
    CLIENT_ROWS_CHUNK,
    ApplyFn,
    PyTree,
    RoundClients,
    Start,
    part_at,
    row_losses,
    sums_over_client_rows,
    train_and_collect,
)


class FedEMShared(NamedTuple):
    """What FedEM's clients share: the K components [K, ...], and each client's hard cluster
    [C] (argmax of its pi as of its last round; the pis themselves are client rows); FedRC
    also the clients' summed soft label counts [K, classes] (None for FedEM)."""

    components: PyTree
    cluster_of: jax.Array
    label_totals: Optional[jax.Array] = None


def mixture_apply(apply_fn: ApplyFn) -> ApplyFn:
    """The apply of a client's mixture ``{"components": [K, ...], "log_pi": [K]}``: the log of
    sum_m pi_m softmax(f_m(x)), a valid logit vector (its softmax is the mixture's
    probabilities, its cross-entropy the mixture's negative log-likelihood)."""
    def apply(params, x):
        log_probs = jax.vmap(lambda c: jax.nn.log_softmax(apply_fn(c, x), -1))(
            params["components"])
        return jax.nn.logsumexp(params["log_pi"][:, None, None] + log_probs, axis=0)

    return apply


def responsibilities(losses: jax.Array, log_pi: jax.Array, y: jax.Array,
                     log_prior: Optional[jax.Array] = None) -> jax.Array:
    """[K, B] E-step posteriors q(z_i = m) ∝ pi_m exp(-loss_mi), from [K, B] losses of rows
    with labels `y` [B]; with FedRC's `log_prior` [K, classes], divided by P_m(y_i)."""
    logits = log_pi[:, None] - losses
    if log_prior is not None:
        logits = logits - log_prior[:, y]
    return jax.nn.softmax(logits, axis=0)


def responsibility_sums(apply_fn: ApplyFn, data: FederatedData, components: PyTree,
                        log_pi: jax.Array, clients: jax.Array,
                        log_prior: Optional[jax.Array] = None, chunk: int = CLIENT_ROWS_CHUNK,
                        block_size: Optional[int] = None) -> tuple[jax.Array, jax.Array]:
    """Over each client's training rows, with its own `log_pi` [S, K], the sums of its E-step
    posteriors [S, K] and of them by label [S, K, classes] (FedRC's soft label counts), in
    chunks of `chunk` rows (memory does not grow with the client)."""
    classes = data.num_classes

    def per_chunk(x, y, mask, inp):
        q = responsibilities(row_losses(apply_fn, components, x, y), inp["log_pi"], y,
                             log_prior) * mask
        return jnp.sum(q, axis=1), q @ jax.nn.one_hot(y, classes, dtype=q.dtype)

    zeros = (jnp.zeros(log_pi.shape[1:], jnp.float32),
             jnp.zeros(log_pi.shape[1:] + (classes,), jnp.float32))
    return sums_over_client_rows(data, clients, components, per_chunk, zeros,
                                 {"log_pi": log_pi}, chunk, block_size)


def label_log_prior(totals: jax.Array) -> jax.Array:
    """[K, classes] log P_m(y): each component's share of the clients' soft label counts,
    floored at 1e-8 as the FedRC authors' code does."""
    floored = jnp.maximum(totals, 1e-8)
    return jnp.log(floored / jnp.sum(floored, axis=1, keepdims=True))


def log_weights(pi: jax.Array) -> jax.Array:
    # Floored: a weight EM drove to 0 gives its component a posterior of ~e^-69, not log 0's
    # -inf (which the optimizer's weight decay would turn into NaN).
    return jnp.log(jnp.maximum(pi, 1e-30))


@register("fedem", reference="Marfoq et al., 2021, FedEM", clustered=True,
          summary="K shared components; each sampled client weighs its rows by the E-step "
          "posteriors (∝ pi_tm times component m's likelihood), sets pi_t to their mean and "
          "trains every component on its weighted loss; components averaged by n_t; evaluated "
          "with the pi_t-weighted mixture of the components' predictions")
def fedem(context: AlgorithmContext) -> FederatedAlgorithm:
    """FedEM with K = ``context.num_clusters`` components; a client's row is its pi_t [K].
    A client's message is its K components' update (through the run's transform); pi_t stays
    with it. The round (an E-step over the client's rows, then the components' training and
    their mean) is written here."""
    return mixture_of_components(context, "fedem", label_prior=False)


def mixture_of_components(context: AlgorithmContext, name: str,
                          label_prior: bool) -> FederatedAlgorithm:
    """FedEM, or with `label_prior` FedRC's E-step (`mcfl.algorithms.clustered.fedrc`): a client's
    row is its pi_t [K], and with `label_prior` also its soft label counts [K, classes]."""
    model = context.model
    num_components = context.num_clusters
    refuse_stateful(model, name)

    def init(data, key, hp):
        del hp
        components = jax.vmap(model.init)(jax.random.split(key, num_components))
        # Every client starts with 1 / classes of each label for each component, so the
        # first prior is uniform and cancels out, as in the authors' code.
        totals = (jnp.full((num_components, data.num_classes),
                           data.num_clients / data.num_classes, jnp.float32)
                  if label_prior else None)
        return FedEMShared(components, jnp.zeros((data.num_clients,), jnp.int32), totals)

    def fresh(shared, clients):
        pi = jnp.full(clients.shape + (num_components,), 1.0 / num_components, jnp.float32)
        if not label_prior:
            return pi
        classes = shared.label_totals.shape[1]
        return pi, jnp.full(clients.shape + (num_components, classes), 1.0 / classes,
                            jnp.float32)

    def round_(shared, data, key, hp, exchange):
        clients, rows = exchange.clients, exchange.rows
        train_key = training_key(key)
        pi = rows[0] if label_prior else rows
        start = shared.components
        log_pi = log_weights(pi)
        log_prior = label_log_prior(shared.label_totals) if label_prior else None
        counts = data.train_counts[clients]
        sums, label_sums = responsibility_sums(model.apply, data, start, log_pi, clients,
                                               log_prior, block_size=context.block_size)
        held = counts[:, None] > 0
        new_pi = jnp.where(held, sums / jnp.maximum(counts, 1)[:, None], pi)

        def objective(p, xb, yb, mask):
            weights = jax.lax.stop_gradient(responsibilities(
                row_losses(model.apply, start, xb, yb), p["log_pi"], yb, log_prior))
            losses = row_losses(model.apply, p["components"], xb, yb)
            rows = jnp.maximum(jnp.sum(mask), 1)
            mixture_loss = -jax.nn.logsumexp(p["log_pi"][:, None] - losses, axis=0)
            return (jnp.sum(weights * losses * mask) / rows,
                    jnp.sum(jax.lax.stop_gradient(mixture_loss) * mask) / rows)

        size = clients.shape[0]
        local = {"components": stack(start, size), "log_pi": jax.lax.stop_gradient(log_pi)}
        trained, stats, exchange = train_and_collect(
            Start(local, RoundClients(clients, jnp.arange(size, dtype=jnp.int32)),
                  training=hp.training.replace(objective=objective).per_client()),
            data, train_key, exchange=exchange, sent=part_at("components"),
            block_size=context.block_size)
        weights = counts.astype(jnp.float32)
        averaged, exchange = weighted_mean_of(trained["components"], weights, exchange,
                                              start)
        components = jax.tree.map(lambda new, old: jnp.where(jnp.sum(weights) > 0, new, old),
                                  averaged, start)
        cluster_of = shared.cluster_of.at[clients].set(
            jnp.argmax(new_pi, axis=1).astype(jnp.int32))
        new_rows, totals = new_pi, shared.label_totals
        if label_prior:  # the server's sums move by what the round's clients changed
            new_labels = jnp.where(held[:, :, None], label_sums, rows[1])
            stored = at_storage_precision(new_labels, context.store_dtype)
            totals = totals + jnp.sum(stored - rows[1], axis=0)
            new_rows = (new_pi, new_labels)
        metrics = training_metrics(weights, stats)  # train_loss: the mixtures' loss
        metrics["models_down"] = metrics["models_down"] * num_components
        metrics["models_up"] = metrics["models_up"] * num_components
        metrics["pi_max_mean"] = jnp.mean(jnp.max(new_pi, axis=1))
        metrics["num_clusters"] = cluster_count(  # components some client leans to
            jnp.zeros((num_components,), jnp.int32).at[cluster_of].add(1))
        return FedEMShared(components, cluster_of, totals), metrics, \
            exchange.replace(rows=new_rows)

    def models(shared, rows, clients):
        del clients
        pi = rows[0] if label_prior else rows
        return {"components": stack(shared.components, pi.shape[0]), "log_pi": log_weights(pi)}

    evaluated_with = mixture_apply(model.apply)

    def client_models(shared, data):
        """Mixtures from the rows, evaluated with their own apply; the closing embedding
        trains each client from its hard cluster's component."""
        del data
        return RowModels(apply=evaluated_with,
                         train_from=(shared.components, shared.cluster_of))

    return FederatedAlgorithm(init, sampled(context.clients_per_round), round_, client_models,
                              lambda shared: shared.cluster_of,
                              ClientState(fresh, models, context.store_dtype))
