"""Client-level distribution shift (FlexCFL, paper 004, Sec. 5.3), for any algorithm.

Before each round's training (FlexCFL's order), the rows' owners change:
- ``swap_all``: with probability p, two random clients swap all their train and test rows
  (FlexCFL's code draws the pair among clients already in a group; here any two clients, so
  the shift is the same for every algorithm);
- ``swap_part``: with probability p, two random clients each give the other the rows of one
  label the other does not hold (a no-op if either has no such label);
- ``incremental``: a client holds 25% of its training rows at first, 50% after `interval`
  rounds, then 75%, then all (FlexCFL: every 50 rounds); the rest are held by nobody.
Rows never move in memory: a shift changes owners, and the per-round `view` re-derives each
client's offsets, counts and the owner-sorted row order (fixed shapes, so nothing recompiles).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.algorithms.base import FederatedAlgorithm
from mcfl.config import SHIFTS  # noqa: F401  (re-exported: the shift kinds)
from mcfl.data.federated import FederatedData, client_label_counts


class ShiftState(flax.struct.PyTreeNode):
    train_owner: jax.Array  # [N_train] current owner of each row (C: nobody)
    test_owner: jax.Array  # [N_test]
    round: jax.Array


def _layout(owner: jax.Array, num_clients: int):
    """Offsets, counts and owner-sorted order of rows with these owners (owner C last)."""
    order = jnp.argsort(owner, stable=True).astype(jnp.int32)
    counts = jnp.zeros((num_clients + 1,), jnp.int32).at[owner].add(1)[:num_clients]
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts)[:-1]])
    return offsets.astype(jnp.int32), counts, order


def view(data: FederatedData, state: ShiftState) -> FederatedData:
    """The dataset as the clients hold it now."""
    c = data.num_clients
    tr_off, tr_cnt, tr_ord = _layout(state.train_owner, c)
    te_off, te_cnt, te_ord = _layout(state.test_owner, c)
    return data.replace(
        train_owner=state.train_owner, train_offsets=tr_off, train_counts=tr_cnt,
        train_order=tr_ord, test_owner=state.test_owner, test_offsets=te_off,
        test_counts=te_cnt, test_order=te_ord,
        # a swap can leave a client more rows than any held as built
        max_train_count=int(state.train_owner.shape[0]),
    )


def _incremental_owner(data: FederatedData, fraction) -> jax.Array:
    """Owners with each client holding the first `fraction` of its training rows (as built)."""
    rows = jnp.arange(data.train_owner.shape[0], dtype=jnp.int32)
    rank = rows - data.train_offsets[data.train_owner]  # as built, rows are sorted by client
    visible = rank < jnp.ceil(fraction * data.train_counts[data.train_owner])
    return jnp.where(visible, data.train_owner, data.num_clients)


def _swap(owner, a, b):
    return jnp.where(owner == a, b, jnp.where(owner == b, a, owner))


def with_shift(algorithm: FederatedAlgorithm, kind: str, prob: float = 0.05,
               interval: int = 50) -> FederatedAlgorithm:
    """`algorithm` trained and evaluated on data that shifts as `kind` says, each round."""
    if kind == "none":
        return algorithm

    def fraction(round_index):
        return jnp.minimum(0.25 * (1 + round_index // interval), 1.0)

    def initial(data):
        owner = data.train_owner
        if kind == "incremental":
            owner = _incremental_owner(data, fraction(0))
        return ShiftState(owner, data.test_owner, jnp.zeros((), jnp.int32))

    def advance(shift: ShiftState, data: FederatedData, key) -> ShiftState:
        if kind == "incremental":
            owner = _incremental_owner(data, fraction(shift.round))
            return shift.replace(train_owner=owner)
        coin_key, pair_key, label_key = jax.random.split(key, 3)
        happens = jax.random.uniform(coin_key) < prob
        a, b = jax.random.choice(pair_key, data.num_clients, (2,), replace=False)
        train_owner, test_owner = shift.train_owner, shift.test_owner
        if kind == "swap_all":
            new_train, new_test = _swap(train_owner, a, b), _swap(test_owner, a, b)
        else:  # swap_part
            held = client_label_counts(train_owner, data.y_train, data.num_clients,
                                       data.num_classes) > 0
            ka, kb = jax.random.split(label_key)
            only_a, only_b = held[a] & ~held[b], held[b] & ~held[a]
            la = jax.random.choice(ka, data.num_classes, p=only_a / jnp.maximum(only_a.sum(), 1))
            lb = jax.random.choice(kb, data.num_classes, p=only_b / jnp.maximum(only_b.sum(), 1))
            happens = happens & only_a.any() & only_b.any()

            def move(owner, labels):
                owner = jnp.where((owner == a) & (labels == la), b - data.num_clients - 1, owner)
                owner = jnp.where((owner == b) & (labels == lb), a, owner)
                return jnp.where(owner < 0, owner + data.num_clients + 1, owner)  # the a->b rows

            new_train, new_test = move(train_owner, data.y_train), move(test_owner, data.y_test)
        return shift.replace(train_owner=jnp.where(happens, new_train, train_owner),
                             test_owner=jnp.where(happens, new_test, test_owner))

    def init(data, key):
        shift = initial(data)
        return algorithm.init(view(data, shift), key), shift

    def round_(state, data, key):
        inner, shift = state
        shift_key, inner_key = jax.random.split(key)
        shift = advance(shift, data, shift_key)
        before = state[1].train_owner
        inner, metrics = algorithm.round(inner, view(data, shift), inner_key)
        metrics["shifted_rows"] = jnp.sum(shift.train_owner != before).astype(jnp.float32)
        return (inner, shift.replace(round=shift.round + 1)), metrics

    assignments = None
    if algorithm.assignments is not None:
        assignments = lambda state: algorithm.assignments(state[0])  # noqa: E731
    return FederatedAlgorithm(
        algorithm.name, init, round_, lambda state: algorithm.client_models(state[0]),
        assignments=assignments, view=lambda state, data: view(data, state[1]),
    )
