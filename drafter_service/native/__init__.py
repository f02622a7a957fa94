"""The compiled drafting core (C++ in csrc/, bound with nanobind as ``_core``): suffix
arrays, sub-indices, input tries and batched tree drafting. Typed in ``_core.pyi``."""
