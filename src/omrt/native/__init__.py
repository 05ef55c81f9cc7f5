"""Native code: omrt's C kernels, their build into one library per model, and loading it.

`build` compiles the C units a model uses into a shared library record (compile time, needs a C
compiler); `loader` checks a packed record against the host and loads it from memory (run time).
"""
