"""`python -m podrun` runs the CLI."""
from podrun.cli.main import entry

entry()
