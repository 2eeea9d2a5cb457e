"""The spectral engine: a streamed gradient operator and top-k SVD methods.

``pca`` is the entry point; the methods also run on a ``GradientOperator`` directly.
"""

from gradspec.linalg._auto import choose_method, parse_memory
from gradspec.linalg._kernel_choice import machine_kernels
from gradspec.linalg._kernels import GRAM_KERNELS
from gradspec.linalg._operator import GradientOperator
from gradspec.linalg._operator_base import ArraySink
from gradspec.linalg._result import PcaResult, sign_fix
from gradspec.linalg._sources import ArraySource, DaskSource, StoreSource, make_source, parse_rows
from gradspec.linalg.api import pca
from gradspec.linalg.gram import gram_pca
from gradspec.linalg.krylov import krylov_pca
from gradspec.linalg.lanczos import lanczos_pca
from gradspec.linalg.orthogonal import OrthogonalState, orthogonal_iteration, orthogonal_pca
from gradspec.sketch import compare_to_exact, format_table, sketch_error

__all__ = [
    # entry point and result
    "pca",
    "PcaResult",
    # the operator and its sources
    "GradientOperator",
    "ArraySink",
    "ArraySource",
    "DaskSource",
    "StoreSource",
    "make_source",
    "parse_rows",
    # methods
    "gram_pca",
    "orthogonal_pca",
    "orthogonal_iteration",
    "OrthogonalState",
    "krylov_pca",
    "lanczos_pca",
    "choose_method",
    "parse_memory",
    "sign_fix",
    # the stated error of a sketched store's spectrum (issue 22; gradspec.sketch's, re-exported)
    "sketch_error",
    "compare_to_exact",
    "format_table",
    # the Gram kernels and this machine's choice among them
    "GRAM_KERNELS",
    "machine_kernels",
]
