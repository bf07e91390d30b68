# cython: language_level=3
"""The codes and limits of dgr/_codes.pxd, for Python: finish codes, event kinds,
failure codes, step flags and limits. The .pxd is their one definition."""
