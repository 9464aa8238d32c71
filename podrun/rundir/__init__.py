"""The run directory, runs/<id>/: its layout and records, its locks, the readers of what runs wrote there."""
