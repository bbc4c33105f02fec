"""Shim for tools that still call setup.py; all metadata is in pyproject.toml."""
from setuptools import setup

setup()
