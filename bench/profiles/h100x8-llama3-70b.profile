# Eight H100 80 GB SXM (tensor parallel) serving Llama-3-70B in bf16, as one replica.
#
# KV per token: 80 layers x 8 KV heads x 128 dims x 2 (K and V) x 2 bytes = 327680 bytes (320 KiB).
# The pool is what is left of 640 GB after 141 GB of weights and ~40 GB of activations and workspace.
# Costs as in h100-llama3-8b, with 8x the FLOPs and bandwidth and a lower efficiency for the
# tensor-parallel all-reduces.
name = h100x8-llama3-70b
block_size = 16
vocab_size = 128256
params = 70.6e9
layers = 80
attention_width = 8192
weight_bytes = 141.2e9
kv_bytes_per_token = 327680
kv_pool_bytes = 459e9
peak_flops = 7912e12
compute_efficiency = 0.4
memory_bandwidth = 26.8e12
memory_efficiency = 0.6
step_overhead_seconds = 0.004
host_bytes = 1e12
host_bandwidth = 200e9
network_bytes = 8e12
network_bandwidth = 4e9
network_latency_seconds = 0.0005
max_batch_tokens = 8192
max_running = 256
max_waiting = 4096
max_context = 131072
