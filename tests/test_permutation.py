"""Keyed permutations (`mcfl.engine.permutation`) and the epoch shuffles derived from them
(`mcfl.engine.batch_rule`): bijections for any key, and positions uniform over keys and over
epochs by chi-square tests (scipy as the oracle, fixed seeds)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from mcfl.engine.batch_rule import client_shuffle_keys, epoch_positions
from mcfl.engine.permutation import (
    derived_round_keys,
    first_of_permutation,
    permute,
    permute_keyed,
    round_keys,
)

SAMPLES = 20_000


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 17, 50, 300])
def test_permute_is_a_bijection_of_0_to_n_for_any_key(n):
    for seed in range(3):
        image = np.asarray(permute(jax.random.key(seed), n, jnp.arange(n)))
        assert sorted(image.tolist()) == list(range(n))


def _uniform_p(values: np.ndarray, n: int) -> float:
    counts = np.bincount(values, minlength=n)
    return stats.chisquare(counts).pvalue


@pytest.mark.parametrize("n", [3, 10, 50])
def test_positions_are_uniform_over_threefry_keys(n):
    keys = jax.random.split(jax.random.key(0), SAMPLES)
    first = jax.jit(jax.vmap(lambda k: permute(k, n, jnp.arange(2))))(keys)
    first = np.asarray(first)
    assert _uniform_p(first[:, 0], n) > 0.001
    # second order: the pair (perm(0), perm(1)) uniform over the n (n - 1) ordered pairs
    pairs = first[:, 0] * n + first[:, 1]
    counts = np.bincount(pairs, minlength=n * n)
    off_diagonal = counts[[a * n + b for a in range(n) for b in range(n) if a != b]]
    assert counts.sum() == off_diagonal.sum()
    if n <= 10:
        assert stats.chisquare(off_diagonal).pvalue > 0.001


@pytest.mark.parametrize("n", [3, 10, 50])
def test_derived_keys_shuffle_uniformly_over_epochs(n):
    """One client's epochs (derived keys, salts 0..SAMPLES-1 from one threefry draw): where
    position 0 lands is uniform over the epochs, and over clients for a fixed epoch."""
    base = round_keys(jax.random.key(3))
    by_epoch = jax.jit(jax.vmap(
        lambda e: permute_keyed(derived_round_keys(base, e), n, jnp.zeros((), jnp.int32))))
    assert _uniform_p(np.asarray(by_epoch(jnp.arange(SAMPLES))), n) > 0.001
    by_client = jax.jit(jax.vmap(lambda c: permute_keyed(
        derived_round_keys(client_shuffle_keys(jax.random.key(4), c), 1), n,
        jnp.zeros((), jnp.int32))))
    assert _uniform_p(np.asarray(by_client(jnp.arange(SAMPLES))), n) > 0.001


def test_epochs_and_clients_get_different_orders():
    key = jax.random.key(1)
    orders = {tuple(np.asarray(epoch_positions(key, client, epoch, 40)).tolist())
              for client in range(5) for epoch in range(5)}
    assert len(orders) == 25


def test_first_of_permutation_is_a_subset_without_repeats():
    chosen = np.asarray(first_of_permutation(jax.random.key(2), 1000, 100))
    assert len(set(chosen.tolist())) == 100 and chosen.min() >= 0 and chosen.max() < 1000
