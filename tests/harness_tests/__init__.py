"""Tests of the real-cluster test harness (tests/harness)."""
