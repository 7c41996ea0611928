"""Client-level distribution shift (FlexCFL, paper 004, Sec. 5.3), for any algorithm.

Before each round's training (FlexCFL's order), the rows' owners change:
- ``swap_all``: with probability p, two random clients swap all their train and test rows
  (FlexCFL's code draws the pair among clients already in a group; here any two clients, so
  the shift is the same for every algorithm);
- ``swap_part``: with probability p, two random clients each give the other the rows of one
  label the other does not hold (a no-op if either has no such label);
- ``incremental``: a client holds 25% of its training rows at first, 50% after `interval`
  rounds, then 75%, then all (FlexCFL: every 50 rounds); the rest are held by nobody.
Rows never move in memory: a shift changes owners, and the view's per-client offsets, counts,
owner-sorted row order and label counts are re-derived (fixed shapes, so nothing recompiles).

A round without a shift event costs nothing here: the layout lives in the state and is
re-derived (a sort of the rows) only in the rounds where owners change, under `lax.cond`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.algorithms.framework.base import (
    FederatedAlgorithm,
    PopulationStart,
    training_key,
    wrapping,
)
from mcfl.data.federated import FederatedData, client_label_counts
from mcfl.engine import occasional_cond
from mcfl.engine.sampling import sample_clients


class Layout(flax.struct.PyTreeNode):
    """Who holds which rows now, and everything derived from it."""

    train_owner: jax.Array  # [N_train] current owner of each row (C: nobody)
    test_owner: jax.Array  # [N_test]
    train_offsets: jax.Array  # [C]
    train_counts: jax.Array  # [C]
    train_order: jax.Array  # [N_train] rows sorted by owner
    test_offsets: jax.Array
    test_counts: jax.Array
    test_order: jax.Array
    label_counts: jax.Array  # [C, num_classes] training label counts


class ShiftState(flax.struct.PyTreeNode):
    layout: Layout
    changed: jax.Array  # bool: owners changed in the last advance
    round: jax.Array


def _segments(owner: jax.Array, num_clients: int):
    """Offsets, counts and owner-sorted order of rows with these owners (owner C last)."""
    order = jnp.argsort(owner, stable=True).astype(jnp.int32)
    counts = jnp.zeros((num_clients + 1,), jnp.int32).at[owner].add(1)[:num_clients]
    offsets = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(counts)[:-1]])
    return offsets.astype(jnp.int32), counts, order


def layout_of(data: FederatedData, train_owner: jax.Array, test_owner: jax.Array) -> Layout:
    """The layout of `data`'s rows held by these owners (a sort of the rows: O(N log N))."""
    c = data.num_clients
    tr_off, tr_cnt, tr_ord = _segments(train_owner, c)
    te_off, te_cnt, te_ord = _segments(test_owner, c)
    labels = client_label_counts(train_owner, data.y_train, c, data.num_classes)
    return Layout(train_owner, test_owner, tr_off, tr_cnt, tr_ord, te_off, te_cnt, te_ord, labels)


def apply_layout(data: FederatedData, layout: Layout, changed=False) -> FederatedData:
    """The dataset as the clients hold it under `layout`."""
    return data.replace(
        train_owner=layout.train_owner, train_offsets=layout.train_offsets,
        train_counts=layout.train_counts, train_order=layout.train_order,
        test_owner=layout.test_owner, test_offsets=layout.test_offsets,
        test_counts=layout.test_counts, test_order=layout.test_order,
        train_label_counts=layout.label_counts,
        owners_changed=jnp.asarray(changed, bool),
        # a swap can leave a client more rows than any held as built
        max_train_count=int(layout.train_owner.shape[0]),
    )


def view(data: FederatedData, state: ShiftState) -> FederatedData:
    """The dataset as the clients hold it now (O(1): the layout is part of the state)."""
    return apply_layout(data, state.layout, state.changed)


def view_with_owners(data: FederatedData, train_owner, test_owner) -> FederatedData:
    """The dataset with these row owners (for tests and one-off views)."""
    return apply_layout(data, layout_of(data, jnp.asarray(train_owner, jnp.int32),
                                        jnp.asarray(test_owner, jnp.int32)), True)


def _incremental_owner(data: FederatedData, fraction) -> jax.Array:
    """Owners with each client holding the first `fraction` of its training rows (as built)."""
    rows = jnp.arange(data.train_owner.shape[0], dtype=jnp.int32)
    rank = rows - data.train_offsets[data.train_owner]  # as built, rows are sorted by client
    visible = rank < jnp.ceil(fraction * data.train_counts[data.train_owner])
    return jnp.where(visible, data.train_owner, data.num_clients)


def _swap(owner, a, b):
    return jnp.where(owner == a, b, jnp.where(owner == b, a, owner))


class ShiftSpec(NamedTuple):
    """A run's distribution shift: `kind` (swap_all | swap_part | incremental), the chance of a
    swap a round (`prob`, for the swaps; traced: ``hp.shift_prob``) and the rounds between
    releases of more data (`interval`, for incremental); the other is None."""

    kind: str
    prob: Optional[float] = None
    interval: Optional[int] = None


def with_shift(algorithm: FederatedAlgorithm, kind: str,
               interval: int = 50) -> FederatedAlgorithm:
    """`algorithm` trained and evaluated on data that shifts as `kind` says, each round; a
    swap happens with probability ``hp.shift_prob`` a round."""
    if kind == "none":
        return algorithm

    def fraction(round_index):
        return jnp.minimum(0.25 * (1 + round_index // interval), 1.0)

    def initial(data):
        owner = data.train_owner
        if kind == "incremental":
            owner = _incremental_owner(data, fraction(0))
        return ShiftState(layout_of(data, owner, data.test_owner), jnp.zeros((), bool),
                          jnp.zeros((), jnp.int32))

    def event(shift: ShiftState, data: FederatedData, key, prob):
        """Whether owners change this round, and a function giving the new (train, test)
        owners (called only when they do)."""
        now = shift.layout
        if kind == "incremental":
            r = shift.round
            happens = (r > 0) & (r % interval == 0) & (fraction(r - 1) < 1.0)
            return happens, lambda: (_incremental_owner(data, fraction(r)), now.test_owner)
        coin_key, pair_key, label_key = jax.random.split(key, 3)
        happens = jax.random.uniform(coin_key) < prob
        a, b = sample_clients(pair_key, data.num_clients, 2)
        if kind == "swap_all":
            return happens, lambda: (_swap(now.train_owner, a, b), _swap(now.test_owner, a, b))
        held = now.label_counts[jnp.stack([a, b])] > 0  # [2, num_classes]
        only_a, only_b = held[0] & ~held[1], held[1] & ~held[0]
        ka, kb = jax.random.split(label_key)
        la = jax.random.choice(ka, data.num_classes, p=only_a / jnp.maximum(only_a.sum(), 1))
        lb = jax.random.choice(kb, data.num_classes, p=only_b / jnp.maximum(only_b.sum(), 1))

        def move(owner, labels):
            owner = jnp.where((owner == a) & (labels == la), b - data.num_clients - 1, owner)
            owner = jnp.where((owner == b) & (labels == lb), a, owner)
            return jnp.where(owner < 0, owner + data.num_clients + 1, owner)  # the a->b rows

        happens = happens & only_a.any() & only_b.any()
        return happens, lambda: (move(now.train_owner, data.y_train),
                                 move(now.test_owner, data.y_test))

    def advance(shift: ShiftState, data: FederatedData, key, prob):
        """The next round's shift state and the number of training rows that changed owner."""
        happens, new_owners = event(shift, data, key, prob)

        def relayout(_):
            train_owner, test_owner = new_owners()
            moved = jnp.sum(train_owner != shift.layout.train_owner).astype(jnp.float32)
            return layout_of(data, train_owner, test_owner), moved

        layout, moved = occasional_cond(happens, relayout,
                                        lambda _: (shift.layout, jnp.float32(0.0)), None)
        return shift.replace(layout=layout, changed=happens), moved

    def init(data, key, hp):
        shift = initial(data)
        return algorithm.init(view(data, shift), key, hp), shift

    def participants(state, data, key, round_):
        # (the inner round's key is the round key's second half; the clients are drawn before
        # this round's shift, which changes owners, never the clients)
        return algorithm.participants(state[0], view(data, state[1]),
                                      training_key(key), round_)

    def round_(state, data, key, hp, exchange):
        inner, shift = state
        shift_key, inner_key = jax.random.split(key)
        shift, moved = advance(shift, data, shift_key, hp.shift_prob)
        inner, metrics, exchange = algorithm.round(inner, view(data, shift), inner_key, hp,
                                                   exchange)
        metrics["shifted_rows"] = moved
        return (inner, shift.replace(round=shift.round + 1)), metrics, exchange

    def client_models(state, data):
        viewed = view(data, state[1])
        described = algorithm.client_models(state[0], viewed)
        return described if described.data is not None else described.replace(data=viewed)

    start = None
    inner_start = algorithm.client_state and algorithm.client_state.start
    if inner_start:  # the population start trains on the data as the clients first hold it
        start = PopulationStart(
            lambda data, key, hp, clients: inner_start.points(view(data, initial(data)), key,
                                                              hp, clients),
            lambda data, key, hp, source: (
                inner_start.finish(view(data, initial(data)), key, hp, source),
                jax.jit(initial)(data)))
    return wrapping(algorithm, init, round_, participants, client_models, start)
