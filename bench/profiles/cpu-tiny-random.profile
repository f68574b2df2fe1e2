# The node-agent's tiny-random model on this 2-core CPU, used to check the cost model against the real
# engine (docs/benchmarks.md, "Simulator against the real engine").
#
# KV per token: 4 layers x 2 KV heads x 32 dims x 2 (K and V) x 2 bytes (bf16) = 1024 bytes.
# Rates from `cargo run --release -p kvroute-node-agent --example model_limits -- tiny-random 256`
# (docs/benchmarks.md): prefill ~45 GFLOP/s against a 100 GFLOP/s sgemm, counting 6.9 MFLOP per token;
# decode reads 114 MB of f32 weights per step at ~9.5 GB/s of a measured 17.8 GB/s.
name = cpu-tiny-random
block_size = 16
vocab_size = 100277
params = 3.45e6
layers = 4
attention_width = 256
weight_bytes = 114e6
kv_bytes_per_token = 1024
# 512 blocks, as the local test agents run (--num-blocks 512).
kv_pool_bytes = 8388608
peak_flops = 100e9
compute_efficiency = 0.45
memory_bandwidth = 17.8e9
memory_efficiency = 0.53
step_overhead_seconds = 0.001
host_bytes = 0
host_bandwidth = 5e9
network_bytes = 0
network_bandwidth = 0.5e9
network_latency_seconds = 0.0005
max_batch_tokens = 512
max_running = 32
max_waiting = 256
max_context = 4096
