"""Time the server-side clustering step alone: k-means (k-means++ seeding, Lloyd, restarts in
one vmap) on n client vectors of d parameters, as FeSEM's initialisation runs it.

    python benchmarks/clustering_step.py                      # 10,000 x 100,000, K=10, 20 restarts
    python benchmarks/clustering_step.py --n 1000 --d 10000   # a quick check

The points are K well-separated Gaussian groups (client models of K true clusters) built on the
device. Prints compile time, run time (best of --repeat), Lloyd iterations and the inertia.
"""

from __future__ import annotations

import argparse
import time

import jax

from mcfl.clustering import kmeans, truncated_svd


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--d", type=int, default=100_000)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--restarts", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()

    @jax.jit
    def make_points(key):
        kc, kl, kn = jax.random.split(key, 3)
        centers = jax.random.normal(kc, (args.k, args.d))
        labels = jax.random.randint(kl, (args.n,), 0, args.k)
        return centers[labels] + 0.5 * jax.random.normal(kn, (args.n, args.d))

    x = jax.block_until_ready(make_points(jax.random.key(0)))
    print(f"{args.n:,} x {args.d:,} float32 ({x.nbytes / 2**30:.1f} GiB), K={args.k}, "
          f"{args.restarts} restarts, backend {jax.default_backend()}")
    step = jax.jit(kmeans, static_argnames=("k", "restarts"))
    start = time.perf_counter()
    compiled = step.lower(jax.random.key(1), x, k=args.k, restarts=args.restarts).compile()
    print(f"compile: {time.perf_counter() - start:.1f} s; k-means temporaries (XLA memory "
          f"analysis): {compiled.memory_analysis().temp_size_in_bytes / 2**30:.2f} GiB")
    times = []
    for r in range(args.repeat):
        start = time.perf_counter()
        result = jax.block_until_ready(compiled(jax.random.key(r + 1), x))
        times.append(time.perf_counter() - start)
    print(f"k-means: {min(times):.1f} s (best of {args.repeat}: "
          f"{', '.join(f'{t:.1f}' for t in times)}), Lloyd iterations {int(result.n_iter)}, "
          f"inertia {float(result.inertia):.4g}")
    svd = jax.jit(truncated_svd, static_argnums=1)
    jax.block_until_ready(svd(x[:200], args.k))
    start = time.perf_counter()
    jax.block_until_ready(svd(x[:200], args.k))
    print(f"truncated SVD of the first 200 rows (EDC, FlexCFL's cold start): "
          f"{time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
