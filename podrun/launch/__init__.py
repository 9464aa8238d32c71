"""The controller's side of a launch: requests, preflight, transports (local, ssh, mpirun, srun), engines, the supervisor, the run directory."""
