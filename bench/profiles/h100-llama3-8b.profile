# One H100 80 GB SXM serving Llama-3-8B in bf16 (the simulator's reference replica).
#
# KV per token: 32 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes = 131072 bytes (128 KiB).
# The pool is what is left of 80 GB after 16.1 GB of weights and ~4 GB of activations and workspace.
# Prefill cost comes from FLOPs (2 x params per token, plus attention) at the stated fraction of the
# dense bf16 peak; decode cost from the bytes a step reads (weights once, plus every running sequence's
# KV) at the stated fraction of HBM bandwidth. A step costs the larger of the two, plus a fixed overhead.
name = h100-llama3-8b
block_size = 16
vocab_size = 128256
params = 8.03e9
layers = 32
attention_width = 4096
weight_bytes = 16.06e9
kv_bytes_per_token = 131072
kv_pool_bytes = 60e9
peak_flops = 989e12
compute_efficiency = 0.5
memory_bandwidth = 3.35e12
memory_efficiency = 0.7
step_overhead_seconds = 0.002
# Host RAM tier per replica (G2) and the PCIe/host link that reloads it.
host_bytes = 256e9
host_bandwidth = 50e9
# The shared Redis tier (G3), all replicas together, and what one replica reads from it.
network_bytes = 2e12
network_bandwidth = 2e9
network_latency_seconds = 0.0005
# Scheduler (the node-agent's engine settings).
max_batch_tokens = 8192
max_running = 256
max_waiting = 4096
max_context = 131072
