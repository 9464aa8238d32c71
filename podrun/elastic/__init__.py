"""Elastic runs, the controller's side: the table of decompositions at one global batch, the re-plan after a loss."""
