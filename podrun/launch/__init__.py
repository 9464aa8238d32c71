"""Launch and supervision: requests, transports (local, ssh, mpirun, srun), the instance agent, the supervisor."""
