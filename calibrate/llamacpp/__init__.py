"""The llama.cpp harness: build llama-bench from source, write synthetic GGUFs, run a measured grid."""
