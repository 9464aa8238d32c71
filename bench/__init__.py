"""podrun's benchmarks: each compares podrun with a peer side by side in one run (see RESULTS.md)."""
