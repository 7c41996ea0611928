"""The four distribution-shift recipes (`mcfl.data.shifts`): each changes what its definition says
and keeps the rest, on scikit-learn's digits (1,797 8x8 images, 10 classes), with fixed seeds;
scipy's chi-square tests decide "kept" and "changed" for distributions."""

import numpy as np
import pytest
from scipy.stats import chi2_contingency

from mcfl.config import RunConfig
from mcfl.data import parse_partition, partition_arrays, shifts
from mcfl.data.loaders import load_digits
from mcfl.errors import ConfigError, DataError

K = 10


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def _balanced(rows_per_class=200, groups=4, seed=0):
    """Images whose pixels encode their row id, K balanced classes, rows dealt to groups."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(K), rows_per_class)
    x = rng.normal(size=(y.size, 6, 6)).astype(np.float32)
    return x, y, rng.integers(0, groups, y.size)


def test_shift_y_given_x_keeps_features_and_label_marginals_and_changes_labels():
    x, y, group = _balanced()
    x2, y2 = shifts.shift_rows((("shift_y_given_x", 0.5),), x, y, group, 4, K,
                               np.random.default_rng(1))
    assert np.array_equal(x2, x)  # P(X) kept: not a pixel moves
    assert np.array_equal(y2[group == 0], y[group == 0])  # the reference group
    pool = shifts.label_pool_size(0.5, K)
    assert pool == 5
    for g in range(1, 4):
        rows = group == g
        moved = y2[rows] != y[rows]
        # only the pool's labels move, and at least one does in every shifted group
        assert 0 < np.unique(y[rows][moved]).size <= pool
        # P(Y) kept: a permutation of balanced classes leaves the label counts alike
        table = np.stack([np.bincount(y2[rows], minlength=K), np.bincount(y[rows], minlength=K)])
        assert chi2_contingency(table).pvalue > 0.01
    # the concept changed: the same x has different labels in different groups
    maps = shifts.label_pool_maps(4, K, 0.5, np.random.default_rng(1))
    assert len({m.tobytes() for m in maps}) == 4 and np.array_equal(maps[0], np.arange(K))


def test_shift_x_given_y_turns_only_the_pool_classes_and_keeps_labels():
    x, y, group = _balanced()
    angles = shifts.class_angles(4, K, 0.3, np.random.default_rng(2))
    x2, y2 = shifts.shift_rows((("shift_x_given_y", 0.3),), x, y, group, 4, K,
                               np.random.default_rng(2))
    assert np.array_equal(y2, y)  # P(Y) and every label kept
    assert (angles[0] == 0).all() and (angles != 0).any(axis=1)[1:].all()
    assert ((angles != 0).any(axis=0)).sum() <= shifts.rotated_pool_size(0.3, K) == 3
    for row in range(0, y.size, 37):
        turned = np.rot90(x[row], k=int(angles[group[row], y[row]] // 90))
        assert np.array_equal(x2[row], turned)


def test_shift_x_turns_every_class_of_a_group_by_its_angle(digits):
    x, y, group = _balanced()
    x2, y2 = shifts.shift_rows((("shift_x", 1.0),), x, y, group, 4, K, np.random.default_rng(0))
    assert np.array_equal(y2, y)
    for g in range(4):  # at strength 1, group g turns by g * 90 degrees: exactly rotated:4
        assert np.array_equal(x2[group == g], np.rot90(x[group == g], k=g, axes=(1, 2)))
    # a strength scales the angle: group 2 of 4 at 0.5 turns by 90 degrees
    x3, _ = shifts.shift_rows((("shift_x", 0.5),), x, y, group, 4, K, np.random.default_rng(0))
    assert np.array_equal(x3[group == 2], np.rot90(x[group == 2], k=1, axes=(1, 2)))
    assert not np.allclose(x3[group == 1], x[group == 1])  # 45 degrees: interpolated


def test_shift_y_gives_groups_their_own_classes_and_keeps_rows(digits):
    data = partition_arrays(digits, parse_partition("shift_y:4@1"), 40, 0.2, "none", 0)
    m = shifts.classes_per_group(1.0, K)
    assert m == 2
    owner = np.asarray(data.arrays.train_owner)
    labels = np.asarray(data.arrays.y_train)
    group = data.true_cluster[owner]
    held = [set(np.unique(labels[group == g])) for g in range(4)]
    assert all(len(h) == m for h in held) and len({frozenset(h) for h in held}) == 4
    # P(Y) differs between groups (chi-square test of independence of group and label)
    table = np.stack([np.bincount(labels[group == g], minlength=K) for g in range(4)])
    assert chi2_contingency(table[:, table.sum(0) > 0]).pvalue < 1e-6
    # P(X|Y) kept: every (image, label) row is one of the original dataset's rows
    originals = {(row.tobytes(), int(label)) for row, label in
                 zip(np.asarray(digits.x, np.float32), digits.y)}
    x = np.asarray(data.arrays.x_train)
    assert all((x[i].tobytes(), int(labels[i])) in originals for i in range(0, len(x), 13))
    # a weaker shift: more classes a group
    assert shifts.classes_per_group(0.25, K) == 8


def test_shift_y_composes_with_dirichlet_skew_within_groups(digits):
    def label_entropy(spec):
        data = partition_arrays(digits, parse_partition(spec), 40, 0.2, "none", 0)
        counts = np.asarray(data.arrays.train_label_counts, np.float64)
        p = counts / counts.sum(1, keepdims=True)
        return float(np.mean(-np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), 1)))

    # within each group's 6 classes, Dirichlet(0.1) concentrates every client on fewer of them
    assert label_entropy("shift_y:4@0.5+dirichlet:0.1") < 0.6 * label_entropy("shift_y:4@0.5")


def test_shifts_join_on_the_same_groups(digits):
    part = parse_partition("shift_x:4@1+shift_y_given_x:4@1+dirichlet:0.5")
    assert part.shifts == (("shift_x", 1.0), ("shift_y_given_x", 1.0))
    assert str(part) == "shift_x:4@1+shift_y_given_x:4@1+dirichlet:0.5"
    assert parse_partition(str(part)) == part
    x, y, group = _balanced()
    x2, y2 = shifts.shift_rows(part.shifts, x, y, group, 4, K, np.random.default_rng(3))
    assert np.array_equal(x2[group == 1], np.rot90(x[group == 1], k=1, axes=(1, 2)))
    assert (y2[group == 1] != y[group == 1]).any() and np.array_equal(y2[group == 0],
                                                                        y[group == 0])
    # the same recipe and seed give the same data; the ground truth is recorded
    a = partition_arrays(digits, part, 40, 0.2, "scale", 5)
    b = partition_arrays(digits, part, 40, 0.2, "scale", 5)
    assert np.array_equal(np.asarray(a.arrays.y_train), np.asarray(b.arrays.y_train))
    assert np.array_equal(a.true_cluster, b.true_cluster)
    assert np.bincount(a.true_cluster).tolist() == [10, 10, 10, 10]


@pytest.mark.parametrize("spec, message", [
    ("shift_x:4@0", r"strength of shift_x must be a number in \(0, 1\]"),
    ("shift_y:4@1.5", r"strength of shift_y must be a number in \(0, 1\]"),
    ("shift_y_given_x:4@nan", "strength of shift_y_given_x must be"),
    ("shift_x_given_y:4@strong", "got 'strong'"),
    ("rotated:4@0.5", r"only the shift_\* recipes take a strength"),
    ("dirichlet:0.5@0.5", r"only the shift_\* recipes take a strength"),
    ("shift_x:4@0.5+shift_x:4@1", "names a shift twice"),
    ("shift_x:4+shift_y:3", "same number of groups R, got shift_x:4, shift_y:3"),
    ("shift_x:4+rotated:4", "at most one planted recipe"),
    ("shift_x:0", "needs a count from 1 to 1,000,000, got .0."),
])
def test_bad_shift_specs_say_what_is_allowed(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_partition(spec)


def test_shift_limits_are_refused_with_the_numbers(digits):
    # a pool of 2 labels has one permutation besides the identity: two shifted groups need two
    with pytest.raises(DataError, match="pool of 2 of 10 labels, which has 1 permutations"):
        partition_arrays(digits, parse_partition("shift_y_given_x:3@0.1"), 30, 0.2, "scale", 0)
    with pytest.raises(DataError, match="10 classes, which make only 1 distinct subsets"):
        shifts.group_class_subsets(2, K, 1e-9, np.random.default_rng(0))
    with pytest.raises(DataError, match="a rotation needs square images"):
        shifts.rotate_rows(np.zeros((4, 64), np.float32), np.full(4, 90.0))
    with pytest.raises(DataError, match="shift_y deals each group's rows .* not fedprox-mnist"):
        partition_arrays(digits, parse_partition("shift_y:2+fedprox-mnist"), 10, 0.2, "scale", 0)


def test_a_bad_shift_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    from mcfl.apps.cli import main

    code = main(["run", "--dataset", "digits", "--partition", "shift_y:4@2", "--clients", "8",
                 "--rounds", "1", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "strength of shift_y" in err[0]
    with pytest.raises(ConfigError, match="strength"):
        RunConfig(dataset="digits", partition="shift_x:2@-1")


def test_plant_shifts_on_a_users_clients():
    from mcfl.data import from_clients, plant

    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(12, 4, 4)), np.arange(12) % 3) for _ in range(6)]
    split = from_clients(clients, seed=0)
    planted = plant(split, "shift_x_given_y:2@1+shift_y_given_x:2@1", seed=3)
    assert np.bincount(planted.true_cluster).tolist() == [3, 3]
    owner = np.asarray(split.arrays.train_owner)
    reference = planted.true_cluster[owner] == 0
    y_before, y_after = np.asarray(split.arrays.y_train), np.asarray(planted.arrays.y_train)
    assert np.array_equal(y_after[reference], y_before[reference])
    assert (y_after[~reference] != y_before[~reference]).any()  # the second group's labels
    with pytest.raises(DataError, match="shift_y decides which rows each client holds"):
        plant(split, "shift_y:2@0.5")
