"""Exact local SGD for dense ReLU networks, with each client's weight change kept low-rank.

Why: a client's SGD step on a dense layer changes its kernel by ``-lr * h^T delta``, a rank-B
outer product (B = batch size). Run naively, every client step writes a full [in, out] gradient
and rewrites the client's kernel: on CPU that traffic, not arithmetic, is the cost (a B = 10
weight-gradient runs at ~1/3 of the matmul peak of this machine, see BENCHMARKS.md).

The algebra: with plain SGD (learning rate lr) and an optional proximal pull ``mu'`` to the
start model (FedProx, Li et al. 2020, Eq. 2; FeSEM's per-client weight, Eq. 8), a client that
started from kernel ``W0`` holds after t steps

    W_t = W0 + D_t,   D_t = sum_{s<t} -lr * (1 - lr mu')^(t-1-s) * h_s^T delta_s,

so D_t is ``H^T Dl`` with H the stacked layer inputs of the past steps ([t B, in]) and Dl their
scaled output gradients ([t B, out]). The forward pass ``h W_t = h W0 + (h H^T) Dl`` and the
backward pass ``delta W_t^T = delta W0^T + (delta Dl^T) H`` only touch the *shared* start kernel
(one large matmul over every client of a block: the same arithmetic as centralised training) and
[B, tB] Gram corrections. FedAvg's average of the clients' kernels is ``W0 + sum_i w_i H_i^T
Dl_i / sum_i w_i``: one more large matmul. No per-client kernel is ever formed on that path.

The result equals `engine.local_train` with ``optax.sgd(lr)`` to float rounding (tests check
it). It pays off while the history t B stays small next to the layer widths
(`worth_low_rank`); biases are tiny and kept dense per client.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from mcfl.engine.batch_rule import client_shuffle_keys, step_rows_keyed

PyTree = Any

# Capacities (steps) up to this are unrolled with a static triangular history; longer ones
# loop over the full-capacity buffers (the factored path is rarely worth it there anyway).
UNROLL_STEPS = 12


class LowRankClient(NamedTuple):
    """A block of clients after local training, as factors ([b] leading axis on every field).

    Kernel l of client i is ``start_i[l] + inputs[l][i].T @ scaled_grads[l][i]``; bias l is
    ``start_i[l] + bias_delta[l][i]``.
    """

    inputs: tuple  # per layer [b, R, in]: layer inputs of every step (R = capacity rows)
    scaled_grads: tuple  # per layer [b, R, out]: -lr * decay * output gradients
    bias_delta: tuple  # per layer [b, out]
    loss_sum: jax.Array  # [b] summed training loss of the steps taken
    taken: jax.Array  # [b] steps taken
    kernel_change_sq: jax.Array  # [b] sum over layers of ||inputs^T scaled_grads||^2
    kernel_cross: jax.Array  # [b] sum over layers of <start kernel, inputs^T scaled_grads>


def layer_shapes(params: PyTree, layers: Sequence[str]) -> list[tuple[int, int]]:
    """(in, out) of each dense layer of a parameter tree (stacked or not; shapes suffice)."""
    return [tuple(params[name]["kernel"].shape[-2:]) for name in layers]


def worth_low_rank(history_rows: int, shapes: Sequence[tuple[int, int]]) -> bool:
    """Whether the factored form is cheaper than per-client kernels: its history (rows x
    (in + out) per layer) must stay below 0.6 x the kernels it stands for (in x out).

    Measured on one CPU core, a FedAvg round of MLP 784-200-200-10 clients with B = 10 (history
    rows = 10 x steps; the ratio is 0.4 per 50 rows): 300 clients x 5 steps 0.27 s factored
    vs 0.44 s per-client; 200 clients x 10 steps 0.50 vs 0.56; x 20 steps 1.89 vs 1.19.
    MCLR 60 -> 10 never qualifies.
    """
    factored = history_rows * sum(i + o for i, o in shapes)
    dense = sum(i * o for i, o in shapes)
    return 5 * factored <= 3 * dense


class LowRankSGD(NamedTuple):
    """Plain SGD of a block on the factored path: the dense `layers` by name, the learning
    rate `lr` and proximal weight `mu` (None: no pull), the `batch` size and the most steps
    any client takes, `capacity` (static)."""

    layers: Sequence[str]
    lr: Any
    mu: Any
    batch: int
    capacity: int


def train_block(sgd: LowRankSGD, data, key: jax.Array, start: PyTree, shared_start: bool,
                block: dict, loop_length: jax.Array) -> LowRankClient:
    """Local SGD of a block of clients (``block``: [b] "client", "steps", "prox_scale", and
    "start" when the start models differ), for `loop_length` steps, of which client i takes
    ``block["steps"][i]``; each step's batch is chosen exactly as `engine.local_train` does.

    `start` is one model (``shared_start``: every client of the block starts from it, and the
    start-kernel products are one matmul over the block's rows) or a stacked tree indexed by
    ``block["start"]``.

    The first layer's inputs are the data, known before training: its start-kernel product
    for every row a client will visit is one large matmul, up front (`_BlockStep`); the steps
    only add [B, past] x [past, out] corrections. Deeper layers keep a history of their
    inputs, written step by step. Update and model norms are running sums (see
    `_BlockStep.__call__`), so nothing is left to compute from the factors afterwards.
    """
    step = _BlockStep(sgd, data, key, start, shared_start, block)
    size, rows_cap, batch = step.size, sgd.capacity * sgd.batch, sgd.batch
    shapes = [k.shape[-2:] for k in step.kernels]
    zeros = lambda *shape: jnp.zeros((size,) + shape, jnp.float32)  # noqa: E731
    carry = (
        (step.x,) + tuple(zeros(rows_cap, i) for i, _ in shapes[1:]),
        tuple(zeros(rows_cap, o) for _, o in shapes),
        tuple(zeros(o) for _, o in shapes),
        zeros(), jnp.zeros((size,), jnp.int32), zeros(), zeros(),
    )
    if sgd.capacity <= UNROLL_STEPS:
        for s in range(sgd.capacity):
            # steps past the block's longest client are skipped, not computed and masked
            carry = jax.lax.cond(s < loop_length, functools.partial(step, s, past=s * batch),
                                 lambda c: c, carry)
    else:
        carry = jax.lax.fori_loop(0, loop_length, functools.partial(step, past=None), carry)
    return LowRankClient(*carry)


def _upto(a, rows):
    return a if rows is None else a[:, :rows]


def _upto_cols(a, cols):
    return a if cols is None else a[:, :, :cols]


class _BlockStep:
    """One SGD step of a block on the factored path, with what every step shares: the start
    kernels and biases, every row each client visits and the first layer's products with
    them, computed up front."""

    def __init__(self, sgd: LowRankSGD, data, key, start: PyTree, shared_start: bool,
                 block: dict):
        self.sgd, self.block, self.shared_start = sgd, block, shared_start
        self.num_layers = len(sgd.layers)
        self.size = size = block["client"].shape[0]
        capacity, batch = sgd.capacity, sgd.batch
        rows_cap = capacity * batch

        def params_of(layer, kind):
            leaf = start[layer][kind]
            return leaf if shared_start else leaf[block["start"]]

        self.kernels = [params_of(name, "kernel") for name in sgd.layers]
        self.biases = [params_of(name, "bias") for name in sgd.layers]
        # Every row each client visits, step after step: [b, R] (R = capacity * batch).
        rows, mask = jax.vmap(
            lambda c: visit_rows(data, key, c, capacity, batch)
        )(block["client"])
        x = data.x_train[rows.reshape(-1)]
        self.x = x = x.reshape((size, rows_cap, -1)).astype(jnp.float32)
        self.labels = data.y_train[rows].reshape(size, capacity, batch)
        self.maskf = mask.astype(jnp.float32).reshape(size, capacity, batch)
        self.first_shared = self.times_kernel(x, 0)  # [b, R, out0]
        # Every step reads its rows of the first layer's Gram, computed up front in one
        # product. (Unrolled steps used to form only the triangle they need, 3x fewer FLOPs
        # at 5 steps, but as 5 batched products, which XLA:CPU runs one client at a time:
        # 14.5 ms a block of 50 MLP clients against 5.9 ms for the whole Gram once; EPYC,
        # 2026-11-28 profile.)
        self.first_gram = jnp.einsum("bri,bsi->brs", x, x)

    def times_kernel(self, h, layer):
        """[b, r, in] @ kernel -> [b, r, out]; one matmul over all rows when shared."""
        k = self.kernels[layer]
        if self.shared_start:
            return (h.reshape(-1, h.shape[-1]) @ k).reshape(h.shape[:-1] + (k.shape[-1],))
        return jnp.einsum("bri,bio->bro", h, k)

    def times_kernel_t(self, d, layer):
        """[b, r, out] @ kernel^T -> [b, r, in]."""
        k = self.kernels[layer]
        if self.shared_start:
            return (d.reshape(-1, d.shape[-1]) @ k.T).reshape(d.shape[:-1] + (k.shape[0],))
        return jnp.einsum("bro,bio->bri", d, k)

    def rows_of_step(self, a, s, axis=1):
        """Rows ``s * batch ... + batch`` of every client's [b, R, ...] array."""
        return jax.lax.dynamic_slice_in_dim(a, s * self.sgd.batch, self.sgd.batch, axis=axis)

    def __call__(self, s, carry, past):
        """Step `s`. Unrolled, `s` is static and only ``past = s * batch`` history rows can be
        non-zero, so the corrections touch only those (a triangular history: 10 of 25 row
        blocks at 5 steps); in the loop, ``past`` is None and the corrections span all R.

        Besides the factors, the step updates each client's ``||D||^2`` and ``<W0, D>`` (D the
        kernel change, W0 the start kernel) from products it forms anyway: with
        ``D' = decay D + h^T g``, ``||D'||^2 = decay^2 ||D||^2 + 2 decay <g, h D> +
        <h h^T, g g^T>`` (h D is the forward's correction) and ``<W0, D'> = decay <W0, D> +
        <g, h W0>`` (h W0 its shared product)."""
        hist_in, hist_grad, bias_delta, loss_sum, taken, change_sq, cross = carry
        forward, hist_in = self.forward(s, hist_in, hist_grad, bias_delta, past)
        loss, delta, active = self.loss_and_delta(s, forward.out)
        grads = self.backward(delta, forward.pre_acts, hist_in, hist_grad, past)
        hist_grad, new_bias, change_sq, cross = self.update(
            s, active, grads, forward, hist_grad, bias_delta, change_sq, cross)
        return (hist_in, hist_grad, new_bias, loss_sum + jnp.where(active, loss, 0.0),
                taken + active, change_sq, cross)

    def forward(self, s, hist_in, hist_grad, bias_delta, past):
        """Step `s`'s forward pass through every layer: the `_Forward` and the input history
        with this step's deeper-layer inputs written in."""
        batch = self.sgd.batch
        seen = None if past is None else past + batch  # history rows incl. this step's
        bases, corrections, own_grams, pre_acts = [], [], [], []
        h = None  # the current layer's inputs, from the second layer on
        for layer in range(self.num_layers):
            if layer == 0:
                base = self.rows_of_step(self.first_shared, s)
                gram = _upto_cols(self.rows_of_step(self.first_gram, s), seen)
            else:
                base = self.times_kernel(h, layer)
                # this step's inputs join the history now: their gradient rows are still zero
                hist_in = _write(hist_in, layer, h, s * batch)
                gram = jnp.einsum("bri,bsi->brs", h, _upto(hist_in[layer], seen))
            own_grams.append(self.rows_of_step(gram, s, axis=2) if past is None
                             else gram[:, :, past:])
            z = base + (self.biases[layer] + bias_delta[layer])[:, None, :]
            correction = None
            if past != 0:
                past_gram = gram if past is None else gram[:, :, :past]
                correction = jnp.einsum("brs,bso->bro", past_gram,
                                        _upto(hist_grad[layer], past))
                z = z + correction
            bases.append(base)
            corrections.append(correction)
            pre_acts.append(z)
            h = jax.nn.relu(z) if layer < self.num_layers - 1 else z
        return _Forward(bases, corrections, own_grams, pre_acts, h), hist_in

    def loss_and_delta(self, s, out):
        """Step `s`'s mean masked cross-entropy [b], its gradient with respect to the logits
        `out` (the last layer's delta) and which clients take the step."""
        step_mask = jax.lax.dynamic_index_in_dim(self.maskf, s, axis=1, keepdims=False)
        step_labels = jax.lax.dynamic_index_in_dim(self.labels, s, axis=1, keepdims=False)
        log_probs = jax.nn.log_softmax(out)
        onehot = jax.nn.one_hot(step_labels, out.shape[-1], dtype=out.dtype)
        n = jnp.maximum(jnp.sum(step_mask, axis=1), 1.0)
        loss = -jnp.sum(jnp.sum(onehot * log_probs, -1) * step_mask, axis=1) / n
        active = s < self.block["steps"]
        delta = (jnp.exp(log_probs) - onehot) * (step_mask / n[:, None])[..., None]
        return loss, delta, active

    def backward(self, delta, pre_acts, hist_in, hist_grad, past) -> list:
        """Every layer's output gradient, from the last layer's `delta` back."""
        grads = [None] * self.num_layers
        for layer in reversed(range(self.num_layers)):
            grads[layer] = delta
            if layer > 0:
                back = self.times_kernel_t(delta, layer)
                if past != 0:
                    back = back + jnp.einsum(
                        "brs,bsi->bri",
                        jnp.einsum("bro,bso->brs", delta, _upto(hist_grad[layer], past)),
                        _upto(hist_in[layer], past),
                    )
                delta = back * (pre_acts[layer - 1] > 0)
        return grads

    def update(self, s, active, grads, forward, hist_grad, bias_delta, change_sq, cross):
        """The step's SGD update as factors: the gradient history, the biases and the running
        norms. Inactive steps (past a client's last) write zero gradients: no effect."""
        lr, mu = self.sgd.lr, self.sgd.mu
        scale = jnp.where(active, -lr, 0.0)[:, None, None]
        decay = (jnp.ones(active.shape, jnp.float32) if mu is None
                 else jnp.where(active, 1.0 - lr * mu * self.block["prox_scale"], 1.0))
        new_bias = []
        if mu is not None:  # the pull shrinks the change so far
            change_sq, cross = decay * decay * change_sq, decay * cross
        for layer in range(self.num_layers):
            g = scale * grads[layer]
            own = jnp.sum(forward.own_grams[layer] * jnp.einsum("bro,bso->brs", g, g),
                          axis=(1, 2))
            if forward.corrections[layer] is not None:
                own = own + 2.0 * decay * jnp.sum(g * forward.corrections[layer], axis=(1, 2))
            change_sq = change_sq + own
            cross = cross + jnp.sum(g * forward.bases[layer], axis=(1, 2))
            if mu is not None:
                hist_grad = hist_grad[:layer] + (hist_grad[layer] * decay[:, None, None],) \
                    + hist_grad[layer + 1:]
            hist_grad = _write(hist_grad, layer, g, s * self.sgd.batch)
            b = bias_delta[layer] * decay[:, None] if mu is not None else bias_delta[layer]
            new_bias.append(b + scale[:, :, 0] * jnp.sum(grads[layer], axis=1))
        return hist_grad, tuple(new_bias), change_sq, cross


class _Forward(NamedTuple):
    """A step's forward pass, per layer: the start-kernel product, the history's correction
    (None at the first step), this step's own Gram rows and the pre-activations; and the
    output logits."""

    bases: list
    corrections: list
    own_grams: list
    pre_acts: list
    out: jax.Array


def visit_rows(data, key: jax.Array, client, capacity: int, batch: int):
    """[capacity * batch] rows client `client` visits in its first `capacity` steps of the
    round keyed `key`, in order, and the mask of real ones (`batch_rule.step_rows_keyed`)."""
    steps = jnp.arange(capacity, dtype=jnp.int32)
    shuffle_keys = client_shuffle_keys(key, client)
    rows, mask = jax.vmap(lambda s: step_rows_keyed(shuffle_keys, data, client, s, batch))(steps)
    return rows.reshape(-1), mask.reshape(-1)


def _write(buffers: tuple, layer: int, rows: jax.Array, at) -> tuple:
    """`buffers` with ``buffers[layer][:, at : at + len(rows)]`` replaced by `rows`."""
    updated = jax.lax.dynamic_update_slice_in_dim(buffers[layer], rows, at, axis=1)
    return buffers[:layer] + (updated,) + buffers[layer + 1:]


def _start_leaves(start: PyTree, layers: Sequence[str], kind: str, shared: bool, index):
    return [start[n][kind] if shared else start[n][kind][index] for n in layers]


def kernel_deltas(result: LowRankClient) -> list[jax.Array]:
    """Per layer [b, in, out]: each client's kernel change ``H^T Dl``."""
    return [jnp.einsum("bri,bro->bio", h, g) for h, g in zip(result.inputs, result.scaled_grads)]


def materialize(start: PyTree, layers: Sequence[str], shared: bool, index,
                result: LowRankClient) -> PyTree:
    """The block's trained models as a stacked parameter tree [b, ...] shaped like `start`."""
    kernels = _start_leaves(start, layers, "kernel", shared, index)
    biases = _start_leaves(start, layers, "bias", shared, index)
    trained = {}
    for name, k, b, dk, db in zip(layers, kernels, biases, kernel_deltas(result),
                                  result.bias_delta):
        trained[name] = {"kernel": k + dk, "bias": b + db}
    return trained


def update_and_model_norms(start: PyTree, layers: Sequence[str], shared: bool, index,
                           result: LowRankClient) -> tuple[jax.Array, jax.Array]:
    """[b] ``||W_i - W0_i||`` and ``||W_i||^2`` without forming W_i: the kernels' share comes
    from the running sums `train_block` keeps (``||D||^2``, ``<W0, D>``), the biases' from
    the dense bias changes."""
    change = result.kernel_change_sq
    model = change + 2.0 * result.kernel_cross
    kernels = _start_leaves(start, layers, "kernel", shared, index)
    biases = _start_leaves(start, layers, "bias", shared, index)
    for k, b, db in zip(kernels, biases, result.bias_delta):
        change = change + jnp.sum(jnp.square(db), axis=-1)
        model = model + jnp.sum(jnp.square(k), axis=(-2, -1)) + jnp.sum(jnp.square(b + db), -1)
    return jnp.sqrt(jnp.maximum(change, 0.0)), model


def weighted_sum(start: PyTree, layers: Sequence[str], result: LowRankClient,
                 weights: jax.Array) -> PyTree:
    """``sum_i w_i W_i`` over a block of clients that all started from the one model `start`:
    ``(sum w) W0 + H_all^T (w * Dl_all)``, one matmul over every history row of the block."""
    total = jnp.sum(weights)
    summed = {}
    for name, h, g, db in zip(layers, result.inputs, result.scaled_grads, result.bias_delta):
        weighted = g * weights[:, None, None]
        dk = h.reshape(-1, h.shape[-1]).T @ weighted.reshape(-1, g.shape[-1])
        summed[name] = {
            "kernel": total * start[name]["kernel"] + dk,
            "bias": total * start[name]["bias"] + weights @ db,
        }
    return summed
