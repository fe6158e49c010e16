"""The one C extension, ``hicache.radix.cpack`` (token ids from lists, ``hicache/radix/tokens.py``;
the tree walk's compares, ``hicache/radix/key.py``).

Everything else is in pyproject.toml. ``optional=True``: without a C compiler the install still
succeeds and ``tokens.py`` uses its pure-Python path (same results, slower on long lists).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "hicache.radix.cpack",
            ["hicache/radix/cpack.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
