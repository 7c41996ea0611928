"""An LSTM layer's recurrence with a hand-written backward pass.

The layer's forward (`lstm_recurrence`): gates ``z_t = p_t + h_{t-1} R`` split as (i, f, g, o),
``c_t = s(f) c_{t-1} + s(i) tanh(g)``, ``h_t = s(o) tanh(c_t)`` (s the sigmoid; Hochreiter and
Schmidhuber, 1997, with the forget gate of Gers et al., 2000, as TensorFlow's BasicLSTMCell),
where ``p_t`` are the input projections of step t (computed for all steps at once by the
caller) and R the recurrent kernel [h, 4h].

Why a custom backward: autodiff of `jax.lax.scan` accumulates the recurrent kernel's gradient
one step at a time, ``dR += h_{t-1}^T dz_t``, a product whose contraction is the batch (B = 10
rows in LEAF's Shakespeare setting) followed by an add into a [h, 4h] buffer, T times. Under
`jax.vmap` over clients XLA:CPU runs each of those as one small product per client. The
backward pass here keeps only what must be sequential in the scan (``dh_{t-1} = dz_t R^T`` and
the cell's elementwise chain) and forms ``dR = H_prev^T dZ`` once, with the T * B rows of all
steps as the contraction: one large product per client, as cuDNN and PyTorch's fused LSTM do.
The values equal autodiff's up to float32 summation order (tests/test_models.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _gate_scale(width: int, dtype) -> jax.Array:
    """[4h]: 2 on the g gate's lanes, 1 on the others (i, f, o), so that
    ``scale * sigmoid(scale * z) - (scale - 1)`` is tanh on g and the sigmoid elsewhere
    (tanh(x) = 2 sigmoid(2x) - 1): all four gates in one elementwise pass."""
    return jnp.ones(4 * width, dtype).at[2 * width:3 * width].set(2)


def _cell(c, h, projected_t, recurrent):
    """One step: the new cell and hidden state, and the gates' activations [B, 4h]."""
    scale = _gate_scale(recurrent.shape[0], projected_t.dtype)
    z = projected_t + h @ recurrent
    gates = scale * jax.nn.sigmoid(scale * z) - (scale - 1)
    i, f, g, o = jnp.split(gates, 4, axis=-1)
    c = f * c + i * g
    return c, o * jnp.tanh(c), gates


@jax.custom_vjp
def lstm_recurrence(projected: jax.Array, recurrent: jax.Array) -> jax.Array:
    """The hidden states [T, B, h] of the recurrence over projections [T, B, 4h] (time first),
    starting from zero state and cell."""
    return _forward(projected, recurrent)[0]


def _forward(projected, recurrent):
    batch, width = projected.shape[1], recurrent.shape[0]
    zeros = jnp.zeros((batch, width), projected.dtype)

    def step(carry, projected_t):
        c, h = carry
        c, h, gates = _cell(c, h, projected_t, recurrent)
        return (c, h), (h, c, gates)

    _, (states, cells, gates) = jax.lax.scan(step, (zeros, zeros), projected)
    # a zero of the projections' dtype: their cotangent must come back in it (bfloat16 runs)
    return states, (states, cells, gates, recurrent, jnp.zeros((), projected.dtype))


def _backward(saved, d_states):
    states, cells, gates, recurrent, projected_zero = saved
    width = recurrent.shape[0]
    zeros = jnp.zeros_like(states[0])
    cells_prev = jnp.concatenate([zeros[None], cells[:-1]], axis=0)

    scale = _gate_scale(width, gates.dtype)
    recurrent_t = recurrent.T

    def step(carry, inputs):
        d_h_next, d_c_next = carry
        d_h_t, c_t, c_prev, gates_t = inputs
        i, f, g, o = jnp.split(gates_t, 4, axis=-1)
        tanh_c = jnp.tanh(c_t)
        d_h = d_h_t + d_h_next
        d_c = d_c_next + d_h * o * (1 - tanh_c * tanh_c)
        d_gates = (jnp.concatenate([d_c, d_c, d_c, d_h], axis=-1)
                   * jnp.concatenate([g, c_prev, i, tanh_c], axis=-1))
        # d gates / d z = (a + s - 1)(1 - a): a (1 - a) for a sigmoid, 1 - a^2 for tanh
        d_z = d_gates * (gates_t + scale - 1) * (1 - gates_t)
        return (d_z @ recurrent_t, d_c * f), d_z

    _, d_projected = jax.lax.scan(step, (zeros, zeros),
                                  (d_states, cells, cells_prev, gates), reverse=True)
    states_prev = jnp.concatenate([zeros[None], states[:-1]], axis=0)
    rows = states_prev.shape[0] * states_prev.shape[1]
    d_recurrent = states_prev.reshape(rows, width).T @ d_projected.reshape(rows, 4 * width)
    return d_projected.astype(projected_zero.dtype), d_recurrent.astype(recurrent.dtype)


lstm_recurrence.defvjp(_forward, _backward)
