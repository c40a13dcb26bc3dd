"""gradcomp: gradient compression for data-parallel training.

The PyTorch integration is :mod:`gradcomp.torch` (DDP's communication hook,
FSDP2's reduce-scatter); ``python -m gradcomp`` says what this installation
holds. The C++ library itself is header-only (``find_package(gradcomp)``).
"""
