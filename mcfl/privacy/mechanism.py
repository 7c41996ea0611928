"""Client-level differential privacy as a message transform: DP-FedAvg's Gaussian mechanism.

McMahan, Ramage, Talwar and Zhang, "Learning Differentially Private Recurrent Language Models"
(ICLR 2018), Algorithm 1: each client's update is clipped to L2 norm C (`ClipFn`, flat or per
layer), the server adds Gaussian noise N(0, z^2 C^2) to each aggregated sum of updates, and
divides by a fixed denominator, the expected number of reporting clients, so that how many
reported is not released. In mcfl that is the transform's two parts (`mcfl.transforms`):

* ``client``: clip the update;
* ``server``: on each segment's sum of updates [K, ...] (`MessageTransform.on_updates`: the
  engine hands it sums of updates, every reporting client weighing 1:
  `MessageTransform.uniform_weights`) add N(0, (z C)^2) to every coordinate. With one segment
  the weight becomes the fixed denominator; with K segments (a clustered algorithm's
  clusters, FedEM's components) the per-segment client counts are released too, noised with
  N(0, z^2) (sensitivity 1), and a segment whose noised count is below 1 keeps its model.

Adaptive clipping (Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning
with Adaptive Clipping", NeurIPS 2021, Algorithm 1 with the geometric update): after a round,
each reporting client's bit b_i = [||update_i|| <= C] is summed, noised with N(0, sigma_b^2),
divided by the expected count m, and ``C <- C exp(-eta (b - gamma))`` moves C towards the
gamma-quantile of the update norms; sigma_b = m / 20 and eta = 0.2 are the paper's choices
(Sec. 3, "we use sigma_b = m / 20 ... eta_C = 0.2"). The bits are a third Gaussian query
(sensitivity 1/2 after centring), accounted for (`released_noise`).

The clipping norm and the noise multiplier live in the transform's state, so a sweep varies
them as traced floats (``Hyperparams.privacy``, `DPSettings`) in one program.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

from mcfl.errors import ConfigError
from mcfl.privacy.accounting import effective_noise
from mcfl.privacy.canaries import inserted_sum
from mcfl.transforms import MessageTransform, global_norm

# Andrew et al. 2021, Sec. 3: the clipped-count noise as a share of the expected count, and
# the geometric update's learning rate.
BITS_NOISE_SHARE = 1.0 / 20.0
ADAPTIVE_LR = 0.2


class DPSettings(flax.struct.PyTreeNode):
    """The mechanism's numbers a sweep varies (traced floats): the clipping norm C a run
    starts with and the noise multiplier z of the update sums."""

    clip: jax.Array
    noise: jax.Array


class DPState(flax.struct.PyTreeNode):
    """The transform's state: the clipping norm now (moved by adaptive clipping) and the
    noise multiplier of the update sums."""

    clip: jax.Array
    noise: jax.Array


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """What the Gaussian mechanism of a run is (static: fixes the program's shape).

    `clip`, `noise`: C and z (the starting values; a sweep's traced settings replace them);
    `denominator`: the expected number of reporting clients a round (q N with Poisson
    sampling, S with a fixed sample); `sums`: how many noised sums a round releases about the
    same clients (SCAFFOLD's model and control-variate updates, FedDANE's gradients and
    models: 2); `noised_counts`: the algorithm aggregates into several segments, whose counts
    are released noised; `per_layer`: each of the L leaves clipped to
    C / sqrt(L) (their joint norm is then at most C); `adaptive_quantile`: gamma of adaptive
    clipping (None: C fixed)."""

    clip: float
    noise: float
    denominator: float
    sums: int = 1
    noised_counts: bool = False
    per_layer: bool = False
    adaptive_quantile: Optional[float] = None
    # canary clients (`mcfl.privacy.canaries`): how many, their seed, the rate they join at
    canaries: int = 0
    canary_seed: int = 0
    canary_rate: float = 0.0

    @property
    def bits_noise(self) -> float:
        """sigma_b of adaptive clipping's clipped count (0 without it)."""
        if self.adaptive_quantile is None:
            return 0.0
        return BITS_NOISE_SHARE * self.denominator

    def released_noise(self, noise: Optional[float] = None) -> float:
        """The noise multiplier of the one Gaussian mechanism a round amounts to, which the
        accountant composes: each update sum (z), the noised counts (z on sensitivity 1) and
        adaptive clipping's bits (sigma_b on sensitivity 1/2: multiplier 2 sigma_b), composed
        as Gaussian queries on the same clients (`accounting.effective_noise`)."""
        z = self.noise if noise is None else noise
        parts = [z] * self.sums + ([z] if self.noised_counts else [])
        if self.adaptive_quantile is not None:
            parts.append(2.0 * self.bits_noise)
        return effective_noise(*parts)

    def noise_for(self, released: float) -> float:
        """The update-sum multiplier z whose round releases `released` (the inverse of
        `released_noise`: what ``--dp-epsilon`` solves for becomes z); ConfigError when
        adaptive clipping's bits alone release more than that."""
        terms = self.sums + (1 if self.noised_counts else 0)
        rest = released ** -2
        if self.adaptive_quantile is not None:
            rest -= (2.0 * self.bits_noise) ** -2
        if rest <= 0:
            raise ConfigError(
                f"the epsilon target leaves nothing for the updates: a round may release a "
                f"noise multiplier of {released:.4g}, and adaptive clipping's clipped count "
                f"alone releases {2 * self.bits_noise:.4g} (2 sigma_b, no more noise than "
                f"that); raise the epsilon target or drop --dp-adaptive-quantile")
        return math.sqrt(terms / rest)


def clip_tree(tree, clip: jax.Array, per_layer: bool):
    """A client's update scaled to L2 norm at most `clip` (all leaves together), or each leaf
    to ``clip / sqrt(L)`` (`per_layer`); McMahan et al. 2018, Algorithm 1's ClipFn."""
    leaves = jax.tree.leaves(tree)
    if per_layer:
        bound = clip / math.sqrt(len(leaves))

        def one(u):
            norm = jnp.sqrt(jnp.sum(jnp.square(u.astype(jnp.float32))))
            return (u * jnp.minimum(1.0, bound / jnp.maximum(norm, 1e-30))).astype(u.dtype)

        return jax.tree.map(one, tree)
    scale = jnp.minimum(1.0, clip / jnp.maximum(global_norm(tree), 1e-30))
    return jax.tree.map(lambda u: (u * scale).astype(u.dtype), tree)


def gaussian_mechanism(mechanism: Mechanism) -> MessageTransform:
    """The DP-FedAvg transform of `mechanism` (module docstring)."""
    if not mechanism.denominator > 0:
        raise ConfigError(f"the DP denominator (expected reporting clients) must be above 0, "
                          f"got {mechanism.denominator}")

    def init(settings: Optional[DPSettings] = None) -> DPState:
        if settings is None:
            return DPState(jnp.float32(mechanism.clip), jnp.float32(mechanism.noise))
        return DPState(jnp.asarray(settings.clip, jnp.float32),
                       jnp.asarray(settings.noise, jnp.float32))

    def client(message, state: DPState):
        return clip_tree(message, state.clip, mechanism.per_layer)

    def server(sums, weight_sums, state: DPState, key):
        segments = weight_sums.shape[0]
        if segments > 1 and not mechanism.noised_counts:
            raise ConfigError("the DP mechanism was built for one aggregated segment, and this "
                              "round sums its clients into several: the algorithm's privacy "
                              "support says otherwise (mcfl.privacy.support)")
        sum_key, count_key, canary_key = jax.random.split(key, 3)
        if mechanism.canaries:  # the canaries' updates C u_j join the sum before the noise
            like = jax.tree.map(lambda s: s[0], sums)
            inserted = inserted_sum(mechanism.canary_seed, mechanism.canaries,
                                    mechanism.canary_rate, canary_key, like)
            sums = jax.tree.map(lambda s, c: s + (state.clip * c)[None].astype(s.dtype), sums,
                                inserted)
        leaves, treedef = jax.tree.flatten(sums)
        keys = jax.random.split(sum_key, len(leaves))
        std = state.noise * state.clip
        noised = [s + (std * jax.random.normal(k, s.shape, jnp.float32)).astype(s.dtype)
                  for s, k in zip(leaves, keys)]
        if mechanism.noised_counts:
            counts = weight_sums + state.noise * jax.random.normal(count_key, weight_sums.shape)
            # A segment heard from (by its noised count) fewer than once keeps its model
            # (post-processing of a released value).
            counts = jnp.where(counts < 1.0, 0.0, counts)
        else:
            counts = jnp.full(weight_sums.shape, mechanism.denominator, jnp.float32)
        return jax.tree.unflatten(treedef, noised), counts.astype(weight_sums.dtype), state

    def observe(state: DPState, norms, present, key):
        """Adaptive clipping's geometric step from the round's unclipped update norms [S]."""
        bits = jnp.sum(present * (norms <= state.clip).astype(jnp.float32))
        noisy = bits + mechanism.bits_noise * jax.random.normal(key, ())
        below = noisy / mechanism.denominator
        clip = state.clip * jnp.exp(-ADAPTIVE_LR * (below - mechanism.adaptive_quantile))
        return state.replace(clip=clip)

    extras = (", per_layer" if mechanism.per_layer else "") + (
        f", adaptive={mechanism.adaptive_quantile:g}" if mechanism.adaptive_quantile else "")
    name = f"dp_gaussian(clip={mechanism.clip:g}, noise={mechanism.noise:g}{extras})"
    return MessageTransform(init, client, server, name, on_updates=True, uniform_weights=True,
                            observe=observe if mechanism.adaptive_quantile is not None else None)
