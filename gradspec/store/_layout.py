"""Compatibility: the parameter layout moved to `gradspec._layout` (zarr-free)."""

from gradspec._layout import ParamLayout, ParamSpec, match_names

__all__ = ["ParamLayout", "ParamSpec", "match_names"]
