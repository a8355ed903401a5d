"""Tests of the examples shipped with the package."""
