"""The CUDA-path tests: run on a CUDA device by bench/gpu_check.py (`python -m bench.gpu_check OUT`), never by the
default test command (pyproject.toml's norecursedirs); without a device each test fails, saying so."""
