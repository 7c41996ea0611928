"""The kinds of `ClientModels` (`SharedModels`, `PerClientModels`, `RowModels`): hand-built states
of each, evaluated through `mcfl.algorithms.framework.device.evaluation_counts` against a
per-client loop with the model's apply, so a consumer that dispatched on the wrong kind (model 0
for every client, the shared models in place of the rows, the base a per-client model is made from)
gives other counts; and what each kind offers a newcomer (`newcomer_models`)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mcfl.algorithms.framework.base import (
    ClientModels,
    ClientState,
    FederatedAlgorithm,
    PerClientModels,
    RowModels,
    SharedModels,
    from_rows,
    shared_models,
)
from mcfl.algorithms.framework.device import DeviceState, evaluation_counts, newcomer_models
from mcfl.data.federated import from_splits

CLIENTS, FEATURES, CLASSES = 5, 4, 3


def _apply(params, x):
    return x @ params["w"] + params["b"]


def _negated(params, x):  # an apply of the kind's own (FedEM's mixtures)
    return -_apply(params, x)


def _models(count: int, seed: int):
    k1, k2 = jax.random.split(jax.random.key(seed))
    return {"w": 3.0 * jax.random.normal(k1, (count, FEATURES, CLASSES)),
            "b": jax.random.normal(k2, (count, CLASSES))}


def _row(models, i):
    return jax.tree.map(lambda m: m[i], models)


def _data(seed: int):
    rng = np.random.default_rng(seed)
    sizes = np.array([6, 1, 9, 4, 7])

    def split():
        owner = np.repeat(np.arange(CLIENTS), sizes)
        x = rng.normal(size=(owner.size, FEATURES)).astype(np.float32)
        return x, rng.integers(0, CLASSES, owner.size).astype(np.int32), owner

    return from_splits("kinds", split(), split(), CLIENTS, CLASSES).arrays


def _reference(apply_fn, data, model_of):
    """(correct [C], loss_sum [C]): client c on its own test rows with ``model_of(c)``."""
    x, y, owner = (np.asarray(a) for a in (data.x_test, data.y_test, data.test_owner))
    correct, loss = [], []
    for c in range(CLIENTS):
        rows = owner == c
        logits = apply_fn(model_of(c), jnp.asarray(x[rows]))
        correct.append(float(np.sum(np.asarray(jnp.argmax(logits, -1)) == y[rows])))
        loss.append(float(jnp.sum(optax.softmax_cross_entropy_with_integer_labels(
            logits, jnp.asarray(y[rows])))))
    return np.asarray(correct), np.asarray(loss)


def _algorithm(client_models, client_state=None):
    return FederatedAlgorithm(None, None, None, client_models, None, client_state)


def _evaluated(algorithm, data, rows=None):
    counts, test_counts = evaluation_counts(algorithm, _apply, 2, DeviceState(None, rows, None),
                                            data)
    np.testing.assert_array_equal(test_counts, data.test_counts)
    return np.asarray(counts.correct), np.asarray(counts.loss_sum)


def _check(algorithm, data, apply_fn, model_of, rows=None):
    correct, loss = _evaluated(algorithm, data, rows)
    want_correct, want_loss = _reference(apply_fn, data, model_of)
    np.testing.assert_array_equal(correct, want_correct)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)


def _rows_state(models):
    """A ClientState whose row is the client's model."""
    return ClientState(fresh=lambda state, clients: _row(models, jnp.zeros_like(clients)),
                       models=lambda state, rows, clients: rows)


@pytest.fixture(scope="module")
def data():
    return _data(0)


def test_shared_models_with_an_index_evaluate_client_i_with_its_row_of_them(data):
    models = _models(3, 1)
    index = jnp.asarray([2, 0, 1, 2, 1], jnp.int32)
    algorithm = _algorithm(lambda state, d: shared_models(models, index))
    _check(algorithm, data, _apply, lambda c: _row(models, int(index[c])))
    # and with an apply of their own
    algorithm = _algorithm(lambda state, d: SharedModels(models, index, apply=_negated))
    _check(algorithm, data, _negated, lambda c: _row(models, int(index[c])))


def test_shared_models_without_an_index_evaluate_everyone_with_model_0(data):
    models = _models(1, 2)
    _check(_algorithm(lambda state, d: shared_models(models)), data, _apply,
           lambda c: _row(models, 0))


def test_per_client_models_are_those_made_for_each_client_not_the_base(data):
    personal, base = _models(CLIENTS, 3), _models(1, 4)
    made = PerClientModels(lambda clients: _row(personal, clients), made_from=base)
    _check(_algorithm(lambda state, d: made), data, _apply, lambda c: _row(personal, c))
    assert made.trains_from()[0] is base


def test_row_models_are_the_rows_not_any_shared_model(data):
    rows = _models(CLIENTS, 5)
    algorithm = _algorithm(from_rows(), _rows_state(rows))
    _check(algorithm, data, _apply, lambda c: _row(rows, c), rows)
    algorithm = _algorithm(from_rows(apply=_negated), _rows_state(rows))  # FedEM's kind
    _check(algorithm, data, _negated, lambda c: _row(rows, c), rows)


def test_every_kind_is_evaluated_on_the_data_it_says_the_clients_hold(data):
    moved = _data(7)  # (a shift's view)
    models, rows = _models(2, 8), _models(CLIENTS, 9)
    index = jnp.asarray([1, 0, 1, 1, 0], jnp.int32)
    shared = _algorithm(lambda state, d: SharedModels(models, index, data=moved))
    _check(shared, moved, _apply, lambda c: _row(models, int(index[c])))
    np.testing.assert_array_equal(_evaluated(shared, data)[0],
                                  _reference(_apply, moved, lambda c: _row(models,
                                                                           int(index[c])))[0])
    per_client = _algorithm(lambda state, d: PerClientModels(
        lambda clients: _row(rows, clients), made_from=_row(models, jnp.zeros(1, int)),
        data=moved))
    np.testing.assert_array_equal(_evaluated(per_client, data)[0],
                                  _reference(_apply, moved, lambda c: _row(rows, c))[0])
    in_rows = _algorithm(lambda state, d: RowModels(data=moved), _rows_state(rows))
    np.testing.assert_array_equal(_evaluated(in_rows, data, rows)[0],
                                  _reference(_apply, moved, lambda c: _row(rows, c))[0])


def test_a_kind_that_does_not_match_the_algorithms_rows_is_refused(data):
    rows = _models(CLIENTS, 10)
    with pytest.raises(TypeError, match="without per-client rows gave RowModels"):
        evaluation_counts(_algorithm(from_rows()), _apply, 2, DeviceState(None, None, None),
                          data)
    with pytest.raises(TypeError, match="with per-client rows gave SharedModels"):
        evaluation_counts(_algorithm(lambda s, d: shared_models(rows), _rows_state(rows)),
                          _apply, 2, DeviceState(None, rows, None), data)
    with pytest.raises(TypeError, match="one of SharedModels"):
        ClientModels()


def test_newcomers_are_served_the_one_global_model_or_what_the_kind_names(data):
    one, clusters = _models(1, 11), _models(3, 12)
    offered = newcomer_models(_algorithm(lambda s, d: shared_models(one)), None, data, data)
    assert offered[0] is one and offered[1] is None
    index = jnp.zeros(CLIENTS, jnp.int32)
    for described in (shared_models(clusters, index), SharedModels(one, apply=_negated),
                      PerClientModels(lambda clients: one, made_from=one), RowModels()):
        assert newcomer_models(_algorithm(lambda s, d, m=described: m), None, data, data) is None
    assign = lambda unseen: jnp.ones(unseen.num_clients, jnp.int32)  # noqa: E731
    for described in (shared_models(clusters, index, newcomers=(clusters, assign)),
                      RowModels(newcomers=(clusters, assign))):
        models, chosen = newcomer_models(_algorithm(lambda s, d, m=described: m), None, data,
                                         data)
        assert models is clusters
        np.testing.assert_array_equal(chosen, np.ones(CLIENTS))


def test_each_kind_trains_the_embedding_from_its_own_models_unless_told():
    models, base, other = _models(2, 13), _models(1, 14), _models(2, 15)
    index = jnp.asarray([1, 0, 0, 1, 1], jnp.int32)

    def same(found, want):
        assert len(found) == 2 and all(f is w for f, w in zip(found, want)), found

    same(SharedModels(models, index).trains_from(), (models, index))
    same(PerClientModels(lambda c: base, made_from=base).trains_from(), (base, None))
    assert RowModels().trains_from() is None
    same(RowModels(train_from=(other, index)).trains_from(), (other, index))
    same(SharedModels(models, train_from=(other, index)).trains_from(), (other, index))
