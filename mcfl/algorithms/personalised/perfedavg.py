"""Per-FedAvg (Fallah, Mokhtari and Ozdaglar, NeurIPS 2020, "Personalized Federated Learning
with Theoretical Guarantees: A Model-Agnostic Meta-Learning Approach"), Algorithm 1.

The global model w is trained for the MAML objective  F_i(w) = f_i(w - alpha grad f_i(w))
(Eq. 3): a model from which one gradient step on a client's own data does well there. Each
local step of a sampled client, on independent batches D, D' (and D''):

    w~ <- w - alpha grad f_i(w; D)
    FO:  w <- w - beta grad f_i(w~; D')                                  (first order)
    HF:  w <- w - beta (I - alpha hess f_i(w; D'')) grad f_i(w~; D')     (Hessian-free)

with beta the run's learning rate (`--lr`), alpha `perfedavg_alpha`. The server takes the plain
mean of the sampled clients' models (Algorithm 1). mcfl splits each local step's batch into D,
D' (and D'') by rows in turn (row j goes to set j mod 2, or mod 3), so that a short last batch
still feeds every set; the Hessian-vector product is exact (automatic differentiation), where
the paper approximates it by finite differences for cost.

Each client is evaluated, as the paper evaluates, with its personalised model: one step from w
on its own training loss, w - alpha grad f_i(w) (the full gradient over its rows, so the
personalised model is a function of the state and the data alone).
"""

from __future__ import annotations

import dataclasses

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import (
    FederatedAlgorithm,
    PerClientModels,
    refuse_stateful,
    stack,
)
from mcfl.algorithms.framework.registry import AlgorithmContext, register
from mcfl.algorithms.framework.skeleton import global_start, skeleton_algorithm
from mcfl.engine import (
    block_size_for,
    by_length,
    ceil_div,
    gradient_of_client,
    map_clients,
)
from mcfl.engine.client_data import CLIENT_ROWS_CHUNK
from mcfl.engine.training import masked_cross_entropy
from mcfl.settings import setting

VARIANTS = ("fo", "hf")


@dataclasses.dataclass(frozen=True)
class PerFedAvgParams:
    alpha: float = setting(0.01, "alpha: the step of the personalising gradient step (Eq. 3), "
                           "in training and in evaluation", key="perfedavg_alpha", above=0)
    variant: str = setting("fo", "fo: first-order MAML step; hf: with the Hessian-vector "
                           "product on a third batch", key="perfedavg_variant",
                           choices=VARIANTS)


class PerFedAvgState(flax.struct.PyTreeNode):
    params: object  # the global model w
    alpha: jax.Array  # the personalising step, kept for evaluation (a sweep's own per member)


def personalised_models(apply_fn, data, params, alpha, clients, block_size=None):
    """[b] models w - alpha grad f_i(w), each client i of `clients` on all its training rows."""
    inputs = {"client": clients, "start": jnp.zeros_like(clients),
              "chunks": ceil_div(data.train_counts[clients], CLIENT_ROWS_CHUNK)}
    start = stack(params)
    gradient = by_length(gradient_of_client(apply_fn, data, start), "chunks")
    grads, _ = map_clients(gradient, inputs, inputs["chunks"],
                           block_size_for(start, clients.shape[0], block_size))
    return jax.tree.map(lambda w, g: w[None] - alpha * g, params, grads)


def maml_objective(apply_fn, alpha, variant: str):
    """The local objective of one step on a batch split into D, D' (, D''): its gradient in
    w is FO's grad f(w~; D') or HF's (I - alpha hess f(w; D'')) grad f(w~; D')."""
    parts = 2 if variant == "fo" else 3

    def loss_on(p, xb, yb, mask, part):
        return masked_cross_entropy(apply_fn(p, xb), yb,
                                    mask * (jnp.arange(yb.shape[0]) % parts == part))

    def objective(p, xb, yb, mask):
        inner = jax.lax.stop_gradient(jax.grad(loss_on)(p, xb, yb, mask, 0))
        if variant == "hf":  # the step's value is w - alpha g_D; its Jacobian I - alpha H_D''
            curvature = jax.grad(loss_on)(p, xb, yb, mask, 2)
            inner = jax.tree.map(lambda g, h: g + h - jax.lax.stop_gradient(h), inner,
                                 curvature)
        adapted = jax.tree.map(lambda w, g: w - alpha * g, p, inner)
        loss = loss_on(adapted, xb, yb, mask, 1)
        return loss, loss

    return objective


@register("perfedavg", PerFedAvgParams, reference="Fallah et al., 2020, Per-FedAvg",
          summary="clients train w for the MAML objective f_i(w − alpha ∇f_i(w)) (Eq. 3), by "
          "first-order or Hessian-free steps; plain mean of their models; each client "
          "evaluated after one step w − alpha ∇f_i(w) on its own data")
def perfedavg(context: AlgorithmContext) -> FederatedAlgorithm:
    """Per-FedAvg; the state is the global model w (and alpha, for evaluation)."""
    model = context.model
    refuse_stateful(model, "perfedavg")

    def init(data, key, hp):
        del data
        return PerFedAvgState(model.init(key), jnp.asarray(hp.params.alpha, jnp.float32))

    def start(state, data, clients, hp):
        objective = maml_objective(model.apply, hp.params.alpha, hp.params.variant)
        training = hp.training.replace(objective=objective).per_client()
        # The plain mean of Algorithm 1 (a client without rows adds nothing).
        weights = (data.train_counts[clients] > 0).astype(jnp.float32)
        return global_start(state.params, clients, weights, training)

    def server(state, summed, data, hp):
        params = jax.tree.map(lambda m: m[0], summed.mean(stack(state.params)))
        return state.replace(params=params), summed.metrics(data)

    def client_models(state, data):
        """Each client's model is one step from w on its own data."""
        def of_clients(clients):
            return personalised_models(model.apply, data, state.params, state.alpha, clients,
                                       context.block_size)

        return PerClientModels(of_clients, made_from=stack(state.params))

    return skeleton_algorithm(context, init, start, server, client_models)
