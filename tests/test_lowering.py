"""`mcfl.planning.lowering`: a program lowers for TPU and CUDA here (no accelerator needed), and one
that cannot run there is refused with the operation named. Every registered algorithm's
programs are lowered in tests/test_devices.py (one device and four)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mcfl.planning.lowering import LoweringError, lower_for


def test_a_linear_algebra_program_lowers_for_tpu_and_cuda():
    exported = lower_for(lambda a: jnp.linalg.eigh(a @ a.T)[0].sum(), jnp.ones((4, 3)))
    assert exported.platforms == ("tpu", "cuda")


@pytest.mark.parametrize("program, reason", [
    (lambda a: jax.lax.linalg.schur(a)[0].sum(), "'schur' not found"),  # LAPACK only
    (lambda a: jax.pure_callback(lambda v: np.asarray(v) * 2,  # a host callback
                                 jax.ShapeDtypeStruct(a.shape, a.dtype), a).sum(),
     "python_callback"),
])
def test_a_cpu_only_program_is_refused_with_the_operation_named(program, reason):
    with pytest.raises(LoweringError, match=f"my program does not lower for tpu, cuda: .*{reason}"):
        lower_for(program, jnp.ones((4, 4)), name="my program")
    jax.jit(program)(jnp.ones((4, 4))).block_until_ready()  # it runs here
