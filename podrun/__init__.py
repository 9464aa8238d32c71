"""podrun: plans and launches data- and pipeline-parallel training across hosts."""
__version__ = "0.1.0"
