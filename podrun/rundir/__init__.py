"""The run directory, runs/<id>/: its layout and records, the locks in it, and the readers of what runs wrote there."""
