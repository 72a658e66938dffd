"""Tests sharing one deployment (conftest.py); a package so that the deployment ends with its last test."""
