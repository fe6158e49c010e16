"""The C extensions: ``hicache.radix.cpack`` (token ids from lists, ``hicache/radix/tokens.py``;
the tree walk's compares, ``hicache/radix/key.py``) and ``hicache.backends.cfile`` (the file
store's reads with the GIL released, ``hicache/backends/file_read.py``).

Everything else is in pyproject.toml. ``optional=True``: without a C compiler the install still
succeeds and each user takes its pure-Python path (same results, slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "hicache.radix.cpack",
            ["hicache/radix/cpack.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
        Extension(
            "hicache.backends.cfile",
            ["hicache/backends/cfile.c"],
            optional=True,
            extra_compile_args=["-O2"],
        ),
    ]
)
