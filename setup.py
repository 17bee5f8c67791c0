# For tools that still call `python setup.py ...` (setuptools' documented shim);
# the metadata, dependencies and entry points live in pyproject.toml.
from setuptools import setup

setup()
