"""Calibration: what `podrun calibrate` measures on a cluster's hosts, kept in a file that `podrun plan` reads."""
