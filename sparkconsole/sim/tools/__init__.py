"""The simulated node's tools, one module per family, as mixins of ``c_NAME`` methods."""
