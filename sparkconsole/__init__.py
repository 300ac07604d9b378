"""sparkconsole: watch, control and deploy onto a cluster of NVIDIA DGX Spark machines."""

__version__ = "0.1.0"
