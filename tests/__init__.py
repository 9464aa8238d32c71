"""podrun's test suite (a package so that bench/ can import tests.harness)."""
