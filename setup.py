"""Packaging beyond pyproject.toml: the top-level configs/ ship inside the package as fedur.configs, so that
fedur-tables finds a grid's configs in an installed fedur as in a checkout."""

from setuptools import find_namespace_packages, setup

CONFIGS = ["fedur.configs", *(f"fedur.configs.{p}" for p in find_namespace_packages(where="configs", exclude=["*__pycache__*"]))]

setup(
    packages=[*find_namespace_packages(include=["fedur", "fedur.*"], exclude=["*__pycache__*"]), *CONFIGS],
    package_dir={"fedur.configs": "configs"},
    package_data={name: ["*.yaml"] for name in CONFIGS},
)
