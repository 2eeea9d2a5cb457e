"""Every Gram kernel against a float64 dense reference, and the symmetric block update.

Which kernel is fastest depends on the machine (``_kernel_choice``); every one of them must
give the same Gram to rounding: float64 panels to ~1e-15 relative, float32 panels to
float32 rounding of each panel product (summed in float64).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gradspec.linalg import GRAM_KERNELS, GradientOperator
from gradspec.linalg._kernels import (
    KERNEL_CHOICES,
    block_edges,
    default_kernel,
    gram_kernel,
    sym_finish,
    sym_update,
)

CPU = torch.device("cpu")


@pytest.mark.parametrize("n,block_rows", [(1, 512), (7, 3), (40, 512), (1200, 512), (1000, 333)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sym_update_equals_dense(n, block_rows, dtype):
    rng = np.random.default_rng(n)
    panels = [rng.standard_normal((n, w)) for w in (5, 64, 17)]
    edges = block_edges(n, torch.device("cpu"), block_rows)
    assert edges[0] == 0 and edges[-1] == n and sorted(set(edges)) == edges
    g = torch.zeros(n, n, dtype=torch.float64)
    for a in panels:
        sym_update(g, torch.from_numpy(a).to(dtype), edges)
    got = sym_finish(g, edges)
    h = np.concatenate(panels, axis=1)
    if dtype == torch.float32:
        h = h.astype(np.float32).astype(np.float64)
    ref = h @ h.T
    np.testing.assert_allclose(got, ref, rtol=1e-12 if dtype == torch.float64 else 1e-5, atol=1e-9 if dtype == torch.float64 else 1e-3)
    np.testing.assert_array_equal(got, got.T)


def test_block_edges_split_large_matrices_on_cpu_only():
    assert len(block_edges(2000, torch.device("cpu"))) - 1 == 10
    assert block_edges(100, torch.device("cpu")) == [0, 100]
    assert block_edges(2000, torch.device("cuda")) == [0, 2000]


def _panels(n: int, widths, dtype: torch.dtype, seed: int = 0):
    rng = np.random.default_rng(seed)
    # Row scales over 6 decades: a triangle-only kernel that mixed up rows would show.
    scale = 10.0 ** rng.uniform(-3, 3, size=(n, 1))
    return [torch.from_numpy(rng.standard_normal((n, w)) * scale).to(dtype) for w in widths]


@pytest.mark.parametrize("name", list(GRAM_KERNELS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("n", [1, 5, 203, 450])
def test_every_kernel_equals_the_float64_gram(name, dtype, n):
    panels = _panels(n, (1, 64, 300, 17), dtype, seed=n)
    kern = GRAM_KERNELS[name](n, CPU)
    for p in panels:
        kern.update(p)
    got = kern.result()
    h = np.concatenate([p.double().numpy() for p in panels], axis=1)  # exactly the panels' values
    ref = h @ h.T
    assert got.shape == (n, n) and got.dtype == np.float64 and got.flags.c_contiguous
    np.testing.assert_array_equal(got, got.T)
    np.testing.assert_array_equal(kern.diagonal(), np.diag(got))
    # Each entry is a float32 (or float64) inner product of length ≤ 300 summed in float64:
    # its error is at most ~w·u·Σ|h_i||h_j| ≤ w·u·‖h_i‖‖h_j‖.
    norms = np.linalg.norm(h, axis=1)
    u = 2.0**-24 if dtype == torch.float32 else 2.0**-53
    bound = 300 * u * np.outer(norms, norms)
    assert np.all(np.abs(got - ref) <= bound), np.max(np.abs(got - ref) / bound)


@pytest.mark.parametrize("name", list(GRAM_KERNELS))
def test_kernels_take_strided_panels(name):
    """Panels are column slices of a wider read block (not contiguous)."""
    block = torch.from_numpy(np.random.default_rng(1).standard_normal((37, 500)).astype(np.float32))
    kern = GRAM_KERNELS[name](37, CPU)
    for j in range(0, 500, 128):
        kern.update(block[:, j : j + 128])
    h = block.double().numpy()
    np.testing.assert_allclose(kern.result(), h @ h.T, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", list(GRAM_KERNELS))
def test_the_operator_runs_every_kernel(name):
    h = np.random.default_rng(2).standard_normal((33, 900))
    op = GradientOperator(h, kernel=name, block_cols=250)
    np.testing.assert_allclose(op.gram(), h @ h.T, rtol=1e-13, atol=1e-11)
    assert op.kernel_choice == (name, "as requested")
    np.testing.assert_allclose(op.row_sq_norms, (h**2).sum(1), rtol=1e-13)


def test_registry_names_the_valid_choices():
    assert ("auto", *GRAM_KERNELS) == KERNEL_CHOICES
    with pytest.raises(ValueError, match="unknown Gram kernel 'blas'; choose one of: auto, numpy-syrk"):
        gram_kernel("blas", CPU)
    with pytest.raises(ValueError, match="unknown Gram kernel 'blas'"):
        GradientOperator(np.ones((3, 4)), kernel="blas")
    cuda = torch.device("cuda")
    for name, cls in GRAM_KERNELS.items():
        if cls.cpu_only:
            with pytest.raises(ValueError, match=f"'{name}' runs on the CPU; on cuda choose one of: torch"):
                gram_kernel(name, cuda)
        else:
            assert gram_kernel(name, cuda) is cls


def test_default_kernels_are_the_measurement_free_ones():
    assert default_kernel(torch.float32, CPU) == "numpy-syrk"
    assert default_kernel(torch.float64, CPU) == "torch-blocked"
    assert default_kernel(torch.float64, torch.device("cuda")) == "torch-gemm"
