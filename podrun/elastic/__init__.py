"""Elastic runs, the controller's side: the table of decompositions at one global batch, and the re-plan after a failure."""
