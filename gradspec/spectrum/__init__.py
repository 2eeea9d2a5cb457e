"""Spectrum analysis: decay fits, restricted-Lipschitz coefficients, bounds, density, variance,
principal angles and eigengaps.

Pure numerics: functions take arrays, or iterables of ``(col_offset, block)``
column blocks of the gradient matrix; nothing here opens a file.
"""

from gradspec.spectrum._angles import (
    SubspaceComparison,
    compare_subspaces,
    eigengap,
    principal_angles,
    second_moment_distance,
)
from gradspec.spectrum._bounds import (
    BoundReport,
    TailRule,
    dimension_dependent_bound,
    dimension_free_rate,
    lipschitz_lookup,
    privacy_term,
    restricted_lipschitz_bound,
    subspace_term,
)
from gradspec.spectrum._density import DensitySpace, SpectralDensity, spectral_density
from gradspec.spectrum._driver import (
    decay_analysis,
    parse_row_range,
    read_report,
    sigma_analysis,
    write_report,
)
from gradspec.spectrum._fit import (
    CIMethod,
    PowerLawFit,
    SpectrumScale,
    compare_fits,
    fit_power_law,
    fit_spectrum,
)
from gradspec.spectrum._inputs import store_relation
from gradspec.spectrum._lipschitz import (
    LipschitzDecay,
    RestrictedLipschitz,
    envelope_exponent,
    lipschitz_decay,
    restricted_lipschitz,
)
from gradspec.spectrum._projection import RowProjections, project_rows, rank_grid
from gradspec.spectrum._report import (
    REPORT_FORMAT,
    DecayAnalysis,
    DecayConfig,
    RowAnalysis,
    analyze_spectrum,
)
from gradspec.spectrum._settings import decay_config, parse_bandwidth, parse_rank_range
from gradspec.spectrum._subspace import (
    gram_eigh,
    gram_subspace_cosines,
    heldout_projections_from_gram,
    row_projections_from_gram,
    row_projections_from_svd,
)
from gradspec.spectrum._variance import (
    ExplainedVariance,
    StepError,
    explained_variance,
    explained_variance_rows,
    reconstruction_error_by_step,
)

__all__ = [
    # decay fits
    "CIMethod",
    "PowerLawFit",
    "SpectrumScale",
    "compare_fits",
    "fit_power_law",
    "fit_spectrum",
    # restricted-Lipschitz coefficients
    "LipschitzDecay",
    "RestrictedLipschitz",
    "RowProjections",
    "envelope_exponent",
    "lipschitz_decay",
    "project_rows",
    "rank_grid",
    "restricted_lipschitz",
    # bounds (Li et al. 2022, Theorems 3.3 and 3.5)
    "BoundReport",
    "TailRule",
    "dimension_dependent_bound",
    "dimension_free_rate",
    "lipschitz_lookup",
    "privacy_term",
    "restricted_lipschitz_bound",
    "subspace_term",
    # subspace diagnostics (Zhou et al. 2021, Theorem 2)
    "SubspaceComparison",
    "compare_subspaces",
    "eigengap",
    "principal_angles",
    "second_moment_distance",
    # subspace diagnostics from the Gram matrix (Li et al. 2022, App. B)
    "gram_eigh",
    "gram_subspace_cosines",
    "heldout_projections_from_gram",
    "row_projections_from_gram",
    "row_projections_from_svd",
    # density and explained variance
    "DensitySpace",
    "ExplainedVariance",
    "SpectralDensity",
    "StepError",
    "explained_variance",
    "explained_variance_rows",
    "reconstruction_error_by_step",
    "spectral_density",
    # the report
    "REPORT_FORMAT",
    "DecayAnalysis",
    "DecayConfig",
    "RowAnalysis",
    "analyze_spectrum",
    # from stores (the one entry point that reads gradspec stores)
    "decay_analysis",
    "parse_row_range",
    "decay_config",
    "parse_rank_range",
    "parse_bandwidth",
    "read_report",
    "write_report",
    "store_relation",
    "sigma_analysis",
]
