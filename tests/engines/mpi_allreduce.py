"""An mpi4py worker: MPI's own view of its rank and world, an allreduce over COMM_WORLD, and the contract's RANK."""
import json
import os
import socket

from mpi4py import MPI

comm = MPI.COMM_WORLD
total = comm.allreduce(comm.Get_rank() + 1)
print("RESULT " + json.dumps({"host": socket.gethostname(), "mpi_rank": comm.Get_rank(), "mpi_size": comm.Get_size(),
                              "sum": total, "rank": int(os.environ["RANK"]), "world": int(os.environ["WORLD_SIZE"]),
                              "local_rank": int(os.environ["LOCAL_RANK"]),
                              "ompi_rank": os.environ.get("OMPI_COMM_WORLD_RANK"),
                              "ompi_size": os.environ.get("OMPI_COMM_WORLD_SIZE")}), flush=True)
