"""gradspec: spectral analysis of gradient subspaces in (differentially private) training."""

__version__ = "0.1.0"
