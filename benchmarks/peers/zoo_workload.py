"""The zoo workloads of the peer benchmarks: one FedAvg round of ``cnn-cifar``,
``resnet18-gn`` or ``char-lstm`` (mcfl.models.zoo, mcfl.models.zoo_text), and the command line
both sides share.

NumPy only (plus ``harness.py``), so that any virtual environment can import it by path.

Workload
    C clients (default 20, all of them train every round), each with ``ROWS_PER_CLIENT`` = 50
    rows; each starts from the global model and takes ``LOCAL_STEPS`` = 5 SGD steps (lr 0.01)
    on batches of ``BATCH_SIZE`` = 10; the server's new model is the plain mean of the client
    models. Data: random (timing does not depend on the values): standard-normal 32 x 32 x 3
    images with labels in [0, 10) for the CNNs, LEAF Shakespeare-shaped rows of 80 character
    indices in [0, 80) (float32, as mcfl stores them) with labels in [0, 80) for the LSTM.

Models: the same architecture and number of trainable parameters on both sides (the
initial weights differ: each side draws its own). ``param_count`` gives the count from the
sizes in closed form, and ``--check`` compares each side's with it. ``--quick`` shrinks the
run for a smoke test: 2 clients, 2 rounds, ResNet width 8, LSTM width 32.

A side is a script with a *runner factory* ``make_runner(work, args) -> runner``; the runner
has ``run_round()`` (one full round, finished on return), ``global_params()`` (NumPy arrays,
any names), ``param_count`` (its trainable parameters) and optionally ``notes`` (a dict added
to the result).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field

import harness
import numpy as np

ROWS_PER_CLIENT = 50
BATCH_SIZE = 10
LOCAL_STEPS = ROWS_PER_CLIENT // BATCH_SIZE
LEARNING_RATE = 0.01
DEFAULT_CLIENTS = 20
IMAGE_SHAPE = (32, 32, 3)
SEQUENCE = VOCABULARY = 80  # LEAF Shakespeare: 80 characters in, one of 80 out
MODELS = ("cnn-cifar", "resnet18-gn", "char-lstm")
QUICK_ARGS = {"cnn-cifar": {}, "resnet18-gn": {"width": 8}, "char-lstm": {"units": 32}}


@dataclass
class ZooWorkload:
    """One round's inputs: x [C, 50, *feature_shape] f32, y [C, 50] i32, the model and the
    model arguments both sides build it with (mcfl's factory arguments)."""

    model: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int
    model_args: dict = field(default_factory=dict)
    source: str = "random"

    @property
    def num_clients(self) -> int:
        return int(self.x.shape[0])

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[2:])


def make_workload(model: str, clients: int, seed: int = 0, quick: bool = False) -> ZooWorkload:
    rng = np.random.default_rng(seed)
    if model == "char-lstm":
        x = rng.integers(0, VOCABULARY, (clients, ROWS_PER_CLIENT, SEQUENCE)).astype(np.float32)
        classes = VOCABULARY
    else:
        x = rng.standard_normal((clients, ROWS_PER_CLIENT) + IMAGE_SHAPE, dtype=np.float32)
        classes = 10
    y = rng.integers(0, classes, (clients, ROWS_PER_CLIENT)).astype(np.int32)
    return ZooWorkload(model, x, y, classes, dict(QUICK_ARGS[model]) if quick else {})


def param_count(work: ZooWorkload) -> int:
    """Trainable parameters of the workload's model, from its sizes (see tests/test_zoo.py)."""
    k = work.num_classes
    if work.model == "cnn-cifar":
        side = IMAGE_SHAPE[0] // 4  # two stride-2 pools
        return (5 * 5 * 3 * 64 + 64) + (5 * 5 * 64 * 64 + 64) + (side * side * 64 * 384 + 384) \
            + (384 * 192 + 192) + (192 * k + k)
    if work.model == "resnet18-gn":
        w = work.model_args.get("width", 64)
        total = 3 * 3 * 3 * w + 2 * w  # stem conv (no bias) and its GroupNorm
        c_in = w
        for stage in range(4):
            c = w * 2 ** stage
            for _ in range(2):
                total += 9 * c_in * c + 9 * c * c + 4 * c  # two convs, two GroupNorms
                if c_in != c:
                    total += c_in * c + 2 * c  # the 1x1 projection and its GroupNorm
                c_in = c
        return total + c_in * k + k
    h, e = work.model_args.get("units", 256), 8
    lstm = sum((n_in + h) * 4 * h + 4 * h for n_in in (e, h))  # one bias per gate and layer
    return VOCABULARY * e + lstm + h * k + k


def add_common_arguments(parser) -> None:
    parser.add_argument("--model", choices=MODELS, default="cnn-cifar")
    parser.add_argument("--quick", action="store_true",
                        help="smoke test: 2 clients, 2 rounds, a narrow ResNet / LSTM")


def main(make_runner, describe, add_arguments=None, argv=None) -> int:
    """Run one side: ``--check`` (one round; finite parameters that moved, and the trainable
    parameter count of ``param_count``) or a timing of ``--rounds`` rounds; print JSON and
    write it to ``--json``. ``harness.py``'s command line, timing and summary."""

    def arguments(parser):
        add_common_arguments(parser)
        if add_arguments is not None:
            add_arguments(parser)

    args = harness.parse_args(arguments, argv, DEFAULT_CLIENTS)
    if args.data == "fmnist":
        print("the zoo workloads run on random data only (--data random)", file=sys.stderr)
        return 2
    if args.quick:
        args.clients, args.check_clients = min(args.clients, 2), min(args.check_clients, 2)
        args.rounds = min(args.rounds, 2)
    about = describe(args)
    clients = args.check_clients if args.check else args.clients
    work = make_workload(args.model, clients, args.seed, args.quick)
    start = time.perf_counter()
    runner = make_runner(work, args)
    setup = time.perf_counter() - start
    expected = param_count(work)
    result = {"name": about["name"], "model": args.model, "model_args": work.model_args,
              "params": runner.param_count, "expected_params": expected, "clients": clients,
              "local_steps": LOCAL_STEPS, "batch_size": BATCH_SIZE, "source": work.source}
    ok = True
    if args.check:
        before = runner.global_params()
        runner.run_round()
        after = runner.global_params()
        finite = all(bool(np.all(np.isfinite(v))) for v in after.values())
        moved = max(float(np.max(np.abs(after[k] - before[k]))) for k in after)
        ok = finite and moved > 0 and runner.param_count == expected
        result["check"] = {"finite": finite, "max_abs_update": moved, "ok": ok}
    else:
        result.update(rounds=args.rounds, setup_seconds=setup,
                      **harness.summarize(harness.time_rounds(runner, args.rounds)))
    result.update(about, **getattr(runner, "notes", {}))
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    if not ok:
        print(f"CHECK FAILED: {result['check']}, params {runner.param_count} "
              f"(expected {expected})", file=sys.stderr)
    return 0 if ok else 1
