"""A plain script whose exit takes long after its program has returned: it prints its line, then a C function
registered with libc's __cxa_atexit (run by exit(), after Python's finalization) sleeps --seconds, as a library's
C++ destructors or gloo's teardown on a loaded host can. Nothing is printed in the meantime."""
import argparse
import ctypes

ap = argparse.ArgumentParser()
ap.add_argument("--seconds", type=int, required=True)
args = ap.parse_args()
libc = ctypes.CDLL(None)
libc.__cxa_atexit(libc.sleep, ctypes.c_void_p(args.seconds), None)     # exit() calls sleep(seconds)
print("program done", flush=True)
