"""napkin: neural circuit diagrams to IO-aware GPU algorithms and kernels."""

__version__ = "0.1.0"
