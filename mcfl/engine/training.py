"""One client's local training (unbatched; `mcfl.engine.clients` runs it over blocks).

A client's epoch is ``ceil(n_i / B)`` steps whose batches follow `mcfl.engine.batch_rule`; the
last batch of an epoch is partial and its missing rows are masked out of the loss. A block's
clients run one loop as long as its longest client; the extra steps of a shorter client are
masked (they leave parameters and optimizer state untouched).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from mcfl.data.federated import FederatedData
from mcfl.engine.batch_rule import client_shuffle_keys, step_rows_keyed
from mcfl.models.spec import trainable_part, with_trainable_part

PyTree = Any
ApplyFn = Callable[[PyTree, jax.Array], jax.Array]


OPTIMIZERS = ("sgd", "momentum", "adam")
DECAYED = ("all", "kernels")  # which parameters weight decay acts on


def kernel_mask(params: PyTree) -> PyTree:
    """True at every leaf named ``kernel`` (the weights of dense and conv layers), False at
    the others (biases, norm scales, embeddings): `LocalTraining.weight_decay_on` "kernels"."""
    def is_kernel(path, _):
        last = path[-1] if path else None
        return getattr(last, "key", getattr(last, "name", None)) == "kernel"

    return jax.tree_util.tree_map_with_path(is_kernel, params)


class FastPaths(NamedTuple):
    """Where a client's update may run on a factored fast path instead of the per-client one:
    the model's `dense_layers` when it is a ReLU dense stack (`mcfl.engine.lowrank`), or its
    one large layer (`factored`: the CNNs, `models.FactoredLayer`, whose kernel change
    `local_train_factored` keeps as factors); `low_rank` auto (when cheaper) / on / off. Both
    paths need plain SGD (`LocalTraining.plain_sgd`)."""

    dense_layers: Optional[tuple[str, ...]] = None
    factored: Optional[Any] = None
    low_rank: str = "auto"


class LocalTraining(flax.struct.PyTreeNode):
    """What a client does in a round: the optimizer on the cross-entropy of `apply_fn`, plus
    ``(mu / 2) * ||W - anchor||^2`` (FedProx, Li et al. 2020, Eq. 2) when `mu` is set.

    The client runs `local_epochs` epochs of batches of `batch_size`, or exactly `local_steps`
    steps when that is set (cycling through epochs of its data).

    A pytree whose leaves are the numbers a sweep may vary, `lr`, `momentum` and `mu` (traced
    arrays, or Python floats baked into the program); everything else is static structure.
    `mu` None means no proximal term at all (an algorithm without one, FedAvg); a value, even
    0, keeps the term in the program. `lr` is the one learning rate of a run: the optimizer is
    built from it (`transform`) and the factored fast paths read it.
    """

    apply_fn: ApplyFn = flax.struct.field(pytree_node=False)
    batch_size: int = flax.struct.field(pytree_node=False)
    lr: Any = 0.01
    local_epochs: int = flax.struct.field(pytree_node=False, default=1)
    local_steps: Optional[int] = flax.struct.field(pytree_node=False, default=None)
    # "sgd", "momentum" (with `momentum`), "adam", or any function lr -> optax
    # GradientTransformation (e.g. optax.adamw)
    optimizer: Any = flax.struct.field(pytree_node=False, default="sgd")
    momentum: Any = 0.9
    weight_decay: float = flax.struct.field(pytree_node=False, default=0.0)  # L2, static
    # "all": weight decay on every parameter; "kernels": on the layers' kernels only (the
    # FlexCFL authors' code puts its L2 on the kernel, their mclr.py)
    weight_decay_on: str = flax.struct.field(pytree_node=False, default="all")
    mu: Any = None
    # Which factored fast path may train it (`FastPaths`: a hint about the model, not the
    # update: any path gives the same clients to float rounding).
    fast: FastPaths = flax.struct.field(pytree_node=False, default=FastPaths())
    # A stateful model (dropout, batch norm; `mcfl.models.spec`): the training-step forward
    # (model, x, key) -> (logits, model) and the model's mutable collections. Gradients then
    # train the model's "params" only.
    train_apply: Optional[Callable] = flax.struct.field(pytree_node=False, default=None)
    collections: tuple[str, ...] = flax.struct.field(pytree_node=False, default=())
    # An algorithm's own local objective in place of the cross-entropy of `apply_fn`:
    # (params, x [B, ...], y [B], mask [B]) -> (objective, reported loss), where params is
    # whatever the clients train (APFL's (w, v, alpha), pFedMe's (w, theta)); the optimizer and
    # the proximal term act on it as on a model. Trains on the per-client path.
    objective: Optional[Callable] = flax.struct.field(pytree_node=False, default=None)
    # Record the minibatch loss of each of the first `record_losses` steps (taken before the
    # step, as it is summed into the mean) in `ClientStats.step_losses`: FedGWC's loss curves.
    # 0 records nothing (the default program). Trains on the per-client path.
    record_losses: int = flax.struct.field(pytree_node=False, default=0)

    def per_client(self) -> LocalTraining:
        """This update on the per-client path (an algorithm's own objective, recorded step
        losses: what the factored paths do not compute)."""
        return self.replace(fast=self.fast._replace(low_rank="off"))

    def transform(self) -> optax.GradientTransformation:
        """The clients' optax optimizer (weight decay as an L2 gradient term before it: wd * W
        added to the gradient, on every parameter or, with `weight_decay_on` "kernels", on the
        kernels only)."""
        if callable(self.optimizer):
            opt = self.optimizer(self.lr)
        elif self.optimizer == "sgd":
            opt = optax.sgd(self.lr)
        elif self.optimizer == "momentum":
            opt = optax.sgd(self.lr, momentum=self.momentum)
        elif self.optimizer == "adam":
            opt = optax.adam(self.lr)
        else:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; allowed: "
                             f"{', '.join(OPTIMIZERS)} or a function of the learning rate")
        if self.weight_decay_on not in DECAYED:
            raise ValueError(f"unknown weight_decay_on {self.weight_decay_on!r}; allowed: "
                             f"{', '.join(DECAYED)}")
        if self.weight_decay > 0:
            mask = kernel_mask if self.weight_decay_on == "kernels" else None
            opt = optax.chain(optax.add_decayed_weights(self.weight_decay, mask), opt)
        return opt

    @property
    def plain_sgd(self) -> bool:
        """Whether the optimizer is ``optax.sgd(lr)`` and nothing else (the fast paths)."""
        return isinstance(self.optimizer, str) and self.optimizer == "sgd" and \
            self.weight_decay == 0


class TrainingSpec(NamedTuple):
    """The clients' local training as a run's settings resolve it, before a model exists
    (`LocalTraining` adds the model's functions): the learning rate, the batch size, E epochs
    or a fixed step count, the optimizer with its momentum (None unless ``momentum``), weight
    decay with what it decays (None without decay), and whether the factored dense paths are
    asked for (``low_rank`` auto / on / off). Anything with ``local_epochs``, ``local_steps``
    and ``batch_size`` counts steps as `LocalTraining` does (`client_num_steps`)."""

    lr: float = 0.01
    batch_size: int = 10
    local_epochs: int = 1
    local_steps: Optional[int] = None
    optimizer: str = "sgd"
    momentum: Optional[float] = None
    weight_decay: float = 0.0
    weight_decay_on: Optional[str] = None
    low_rank: str = "auto"

    def local_training(self, model, lr=None, momentum=None) -> LocalTraining:
        """What a client of `model` (a `mcfl.models.ModelSpec`) does in a round; `lr` and
        `momentum` replace this spec's (a sweep member's traced values)."""
        return LocalTraining(
            apply_fn=model.apply,
            batch_size=self.batch_size,
            lr=self.lr if lr is None else lr,
            local_epochs=self.local_epochs,
            local_steps=self.local_steps,
            optimizer=self.optimizer,
            # (a traced leaf of every run's training, read only by the momentum optimizer)
            momentum=(0.9 if self.momentum is None else self.momentum) if momentum is None
            else momentum,
            weight_decay=self.weight_decay,
            weight_decay_on=self.weight_decay_on or "all",
            fast=FastPaths(model.dense_layers, model.factored, self.low_rank),
            train_apply=model.train_apply,
            collections=model.collections,
        )


class ClientStats(NamedTuple):
    """Per-client by-products of local training, each [S]."""

    loss: jax.Array  # mean training loss over the client's steps (without the proximal term)
    steps: jax.Array  # local steps actually taken
    update_norm: jax.Array  # ||W_i(after) - W_i(start)||, FlexCFL Eq. 3's summand
    sq_norm: jax.Array  # ||W_i(after)||^2, for intra-cluster distances of streamed M-steps
    # 1.0 for the clients that report, 0.0 for a Poisson round's empty slots (which train but
    # send nothing: `mcfl.privacy.sampling`); None: all report
    reported: Optional[jax.Array] = None
    # [S, L] each step's minibatch loss, 0 after the steps taken (`LocalTraining.record_losses`
    # L > 0); None: not recorded
    step_losses: Optional[jax.Array] = None


def ceil_div(a, b):
    return (a + b - 1) // b


def client_num_steps(counts: jax.Array, training: LocalTraining) -> jax.Array:
    """Local steps of each client in a round: ``E * ceil(n_i / B)``, or the fixed step count."""
    if training.local_steps is not None:
        return jnp.full_like(counts, training.local_steps)
    return training.local_epochs * ceil_div(counts, training.batch_size)


def steps_key(schedule) -> str:
    """The name of the loop over a client's local steps under `schedule` (anything with
    ``local_epochs``, ``local_steps`` and ``batch_size``: a `LocalTraining`, a `TrainingSpec`).
    `mcfl.planning.cost` counts such a loop `mean_steps` times: a pre-training epoch and a round
    of E epochs are loops of different lengths."""
    if schedule.local_steps is not None:
        return f"steps_fixed_{int(schedule.local_steps)}"
    return f"steps_epochs_{int(schedule.local_epochs)}_batch_{int(schedule.batch_size)}"


def mean_steps(key: str, train_counts) -> Optional[float]:
    """The mean local steps over clients with `train_counts` rows of the loop `steps_key`
    named `key` (None for another name)."""
    parts = key.split("_")
    if parts[:2] == ["steps", "fixed"] and len(parts) == 3:
        return float(parts[2])
    if parts[:2] == ["steps", "epochs"] and len(parts) == 5 and parts[3] == "batch":
        epochs, batch = int(parts[2]), int(parts[4])
        return float(epochs * np.mean(np.ceil(np.asarray(train_counts, np.float64) / batch)))
    return None


def masked_cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean cross-entropy over the rows where `mask` is true (0 if there are none)."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return jnp.sum(losses * mask) / jnp.maximum(jnp.sum(mask), 1)


def squared_distance(a: PyTree, b: PyTree) -> jax.Array:
    """||a - b||^2 summed over all leaves of two parameter trees."""
    return sum(jnp.sum(jnp.square(x - y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _select(pred, new: PyTree, old: PyTree) -> PyTree:
    return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


class ClientTask(NamedTuple):
    """One client's part of a block's training: its id, its real steps `num_steps` of the
    block's `loop_length` iterations (its longest client's), the scale of its proximal weight
    (``training.mu * prox_scale``: FeSEM weighs it per client, Eq. 8), and whether its steps
    are masked (False: the caller promises ``num_steps == loop_length``, a block of one)."""

    client: jax.Array
    num_steps: jax.Array
    loop_length: jax.Array
    prox_scale: jax.Array | float = 1.0
    masked: bool = True


def local_train(
    training: LocalTraining,
    data: FederatedData,
    key: jax.Array,
    params: PyTree,
    anchor: PyTree,
    task: ClientTask,
    correction: Optional[PyTree] = None,
) -> tuple[PyTree, jax.Array, jax.Array]:
    """One client's local training (unbatched; the engine vmaps it over a block): `task`'s
    `loop_length` iterations, of which the first `num_steps` are real (`ClientTask`). Step s
    reads `batch_rule.step_rows_keyed` of the round `key`; the proximal term pulls to
    `anchor`. A `correction` tree c adds the linear term ``<c, W>`` to the objective, so every
    step's gradient gains c (FedDANE's gradient correction).
    Returns the trained parameters, the summed training loss of the real steps, and the number
    of steps that changed the parameters (counted, not assumed); with ``training.record_losses``
    L > 0, also the [L] losses of the first L steps (0 after the real ones).
    """
    if training.train_apply is not None:
        if training.objective is not None:
            raise ValueError("an algorithm's own local objective needs a model without "
                             "mutable collections or dropout")
        return _local_train_stateful(training, data, key, params, anchor, task, correction)
    client, num_steps, loop_length, prox_scale, masked = task
    batch = training.batch_size
    optimizer = training.transform()
    objective = _client_objective(training, anchor, prox_scale)
    shuffle_keys = client_shuffle_keys(key, client)  # once, not a threefry draw per step

    def step(s, carry):
        p, opt_state, loss_sum, taken, record = carry
        rows, mask = step_rows_keyed(shuffle_keys, data, client, s, batch)
        (_, loss), grads = jax.value_and_grad(objective, has_aux=True)(
            p, data.x_train[rows], data.y_train[rows], mask
        )
        if correction is not None:
            grads = jax.tree.map(jnp.add, grads, correction)
        updates, new_opt_state = optimizer.update(grads, opt_state, p)
        if not masked:
            return (optax.apply_updates(p, updates), new_opt_state, loss_sum + loss, taken + 1,
                    _recorded(record, s, loss))
        active = s < num_steps
        p = _select(active, optax.apply_updates(p, updates), p)
        opt_state = _select(active, new_opt_state, opt_state)
        loss = jnp.where(active, loss, 0.0)
        return p, opt_state, loss_sum + loss, taken + active, _recorded(record, s, loss)

    zero = jnp.zeros((), jnp.int32)
    init = (params, optimizer.init(params), jnp.zeros((), jnp.float32), zero,
            _record(training))
    params, _, loss_sum, taken, record = jax.lax.fori_loop(0, loop_length, step, init)
    return (params, loss_sum, taken) + (() if record is None else (record,))


def _client_objective(training: LocalTraining, anchor: PyTree, prox_scale) -> Callable:
    """``(params, x, y, mask) -> (objective, reported loss)``: the algorithm's own objective
    or the masked cross-entropy, plus the proximal pull to `anchor` when ``training.mu`` is
    set."""
    def objective(p, xb, yb, mask):
        if training.objective is not None:
            total, loss = training.objective(p, xb, yb, mask)
        else:
            loss = masked_cross_entropy(training.apply_fn(p, xb), yb, mask)
            total = loss
        if training.mu is not None:
            total = total + 0.5 * training.mu * prox_scale * squared_distance(p, anchor)
        return total, loss

    return objective


def _factored_objective(training: LocalTraining, kernel0, anchor: PyTree, prox_scale
                        ) -> Callable:
    """`local_train_factored`'s objective of the parameters without the large kernel and of
    the zero offset on its pre-activations, given the kernel's factored change so far
    (``hist_in^T hist_grad``); its aux is the loss and the layer's inputs h."""
    layer = training.fast.factored

    def objective(rest, offset, xb, yb, mask, hist_in, hist_grad):
        h = layer.trunk(rest, xb)  # [B, in]
        z = h @ kernel0 + (h @ hist_in.T) @ hist_grad + rest[layer.name]["bias"] + offset
        loss = masked_cross_entropy(layer.head(rest, z), yb, mask)
        total = loss
        if training.mu is not None:
            total = total + 0.5 * training.mu * prox_scale * squared_distance(rest, anchor)
        return total, (loss, h)

    return objective


def _record(training: LocalTraining):
    """The loop's record of step losses: [L] zeros (`LocalTraining.record_losses`), or None."""
    if not training.record_losses:
        return None
    return jnp.zeros((training.record_losses,), jnp.float32)


def _recorded(record, s, loss):
    """`record` with step `s`'s loss written (steps past its length are not kept)."""
    if record is None:
        return None
    return record.at[s].set(loss, mode="drop")


def dropout_key(round_key: jax.Array, client, step) -> jax.Array:
    """The dropout key of local step `step` of client `client` (distinct per client and step,
    and from the batch order's keys)."""
    salted = jax.random.fold_in(round_key, 0x64726F70)  # "drop"
    return jax.random.fold_in(jax.random.fold_in(salted, client), step)


def _local_train_stateful(training, data, key, model, anchor, task: ClientTask, correction):
    """`local_train` for a model with a train mode (dropout) or mutable collections (batch
    norm): each step runs ``training.train_apply`` with a per-client, per-step dropout key;
    gradients (and the optimizer, the proximal term, a correction) act on ``params`` only, and
    the step's updated collections replace the old ones."""
    client, num_steps, loop_length, prox_scale, masked = task
    batch, collections = training.batch_size, training.collections
    optimizer = training.transform()
    anchor_params = trainable_part(anchor, collections)

    def objective(p, rest, xb, yb, mask, step_key):
        logits, updated = training.train_apply(with_trainable_part(rest, p, collections), xb,
                                               step_key)
        loss = masked_cross_entropy(logits, yb, mask)
        total = loss
        if training.mu is not None:
            total = total + 0.5 * training.mu * prox_scale * squared_distance(p, anchor_params)
        return total, (loss, updated)

    shuffle_keys = client_shuffle_keys(key, client)  # once, not a threefry draw per step

    def step(s, carry):
        m, opt_state, loss_sum, taken, record = carry
        rows, mask = step_rows_keyed(shuffle_keys, data, client, s, batch)
        p = trainable_part(m, collections)
        (_, (loss, updated)), grads = jax.value_and_grad(objective, has_aux=True)(
            p, m, data.x_train[rows], data.y_train[rows], mask, dropout_key(key, client, s))
        if correction is not None:
            grads = jax.tree.map(jnp.add, grads, trainable_part(correction, collections))
        updates, new_opt_state = optimizer.update(grads, opt_state, p)
        new_model = with_trainable_part(updated, optax.apply_updates(p, updates), collections)
        if not masked:
            return (new_model, new_opt_state, loss_sum + loss, taken + 1,
                    _recorded(record, s, loss))
        active = s < num_steps
        m = _select(active, new_model, m)
        opt_state = _select(active, new_opt_state, opt_state)
        loss = jnp.where(active, loss, 0.0)
        return m, opt_state, loss_sum + loss, taken + active, _recorded(record, s, loss)

    zero = jnp.zeros((), jnp.int32)
    init = (model, optimizer.init(trainable_part(model, collections)),
            jnp.zeros((), jnp.float32), zero, _record(training))
    model, _, loss_sum, taken, record = jax.lax.fori_loop(0, loop_length, step, init)
    return (model, loss_sum, taken) + (() if record is None else (record,))


def local_train_factored(
    training: LocalTraining,
    data: FederatedData,
    key: jax.Array,
    params: PyTree,
    task: ClientTask,
    capacity: int,
) -> tuple[PyTree, jax.Array, jax.Array]:
    """`local_train` with plain SGD for a model ``head(trunk(x) @ K + b)`` around one large
    dense kernel K (``training.fast.factored``), whose change is kept as factors.

    Why: a step's gradient of K is ``h^T delta`` (rank B); written out, it and the update of K
    move two [in, out] arrays per step (the FashionMNIST CNN's 3136 x 1024 kernel: a third
    of a client step's time on CPU). After t steps ``K_t = K_0 + H^T G`` (H the past steps'
    inputs h, G their ``-lr * decay * delta``), so the forward is ``h K_0 + (h H^T) G`` and
    the backward touches only [B, t B] products; delta is the gradient of the loss at a zero
    offset added to the layer's pre-activations, so K's gradient is never formed. The
    proximal pull to the start (FedProx, FeSEM) decays G by ``1 - lr mu'`` each step, as it
    decays K - K_0. `capacity` (static) bounds the steps; K is formed once, at the end. Equal
    to `local_train` to float rounding (tests/test_engine.py).
    """
    client, num_steps, loop_length, prox_scale, masked = task
    layer, lr, batch = training.fast.factored, training.lr, training.batch_size
    kernel0 = params[layer.name]["kernel"]
    rest = {**params, layer.name: {k: v for k, v in params[layer.name].items() if k != "kernel"}}
    rows_cap = capacity * batch

    objective = _factored_objective(training, kernel0, rest, prox_scale)
    shuffle_keys = client_shuffle_keys(key, client)  # once, not a threefry draw per step

    def step(s, carry):
        rest, hist_in, hist_grad, loss_sum, taken = carry
        rows, mask = step_rows_keyed(shuffle_keys, data, client, s, batch)
        offset = jnp.zeros((batch, kernel0.shape[1]), jnp.float32)
        (_, (loss, h)), (grads, delta) = jax.value_and_grad(objective, argnums=(0, 1),
                                                            has_aux=True)(
            rest, offset, data.x_train[rows], data.y_train[rows], mask, hist_in, hist_grad)
        active = jnp.asarray(True) if not masked else s < num_steps
        scale = jnp.where(active, -lr, 0.0)
        rest = jax.tree.map(lambda p, g: p + scale * g, rest, grads)
        if training.mu is not None:
            hist_grad = hist_grad * jnp.where(active, 1.0 - lr * training.mu * prox_scale, 1.0)
        at = jnp.minimum(s, capacity - 1) * batch
        hist_in = jax.lax.dynamic_update_slice_in_dim(hist_in, h, at, axis=0)
        hist_grad = jax.lax.dynamic_update_slice_in_dim(hist_grad, scale * delta, at, axis=0)
        return rest, hist_in, hist_grad, loss_sum + jnp.where(active, loss, 0.0), taken + active

    init = (rest, jnp.zeros((rows_cap, kernel0.shape[0]), jnp.float32),
            jnp.zeros((rows_cap, kernel0.shape[1]), jnp.float32), jnp.zeros((), jnp.float32),
            jnp.zeros((), jnp.int32))
    rest, hist_in, hist_grad, loss_sum, taken = jax.lax.fori_loop(0, loop_length, step, init)
    kernel = kernel0 + jnp.dot(hist_in.T, hist_grad, precision=jax.lax.Precision.HIGHEST)
    trained = {**rest, layer.name: {**rest[layer.name], "kernel": kernel}}
    return trained, loss_sum, taken
