"""Tests of podrun.models: the model zoo."""
