# The node-agent's tiny-random model on this 2-core CPU, used to check the cost model against the real
# engine (docs/benchmarks.md, "The cost model against the real engine"; bench/sim-check.sh also fits a
# profile of this shape to the agent's own step log and checks both).
#
# KV per token: 4 layers x 2 KV heads x 32 dims x 2 (K and V) x 2 bytes (bf16) = 1024 bytes.
# Fitted to `cargo run --release -p kvroute-node-agent --example step_costs -- tiny-random 400`, which times
# the model's forward pass by shape after a 400-token context, alone on the machine (docs/benchmarks.md):
# - decode batches of 1 to 4 sequences took about 6.8 ms + 2.45 ms per sequence, and sampling a token at
#   temperature 1 over the 100,277-entry vocabulary 1.3 ms more per sequence: sample_seconds = 3.7 ms, and
#   the rest of the constant (less the body's 1.3 ms memory time) is the step overhead, 5.5 ms. Most of it is
#   the LM head (the embedding transposed, 102.7 MB of f32), read once per step;
# - the body (4 layers, 3.45M parameters, 13.8 MB of f32) computes at about 45 GFLOP/s (45% of the 100
#   GFLOP/s sgemm measured by the model_limits example), counting 6.9 MFLOP per token plus attention:
#   chunks of 32, 128 and 512 new tokens took 15.3, 31.4 and 103 ms with the head.
name = cpu-tiny-random
block_size = 16
vocab_size = 100277
params = 3.45e6
layers = 4
attention_width = 256
weight_bytes = 13.8e6
sample_seconds = 0.0037
kv_bytes_per_token = 1024
# 512 blocks, as the local test agents run (--num-blocks 512).
kv_pool_bytes = 8388608
peak_flops = 100e9
compute_efficiency = 0.45
memory_bandwidth = 17.8e9
memory_efficiency = 0.6
step_overhead_seconds = 0.0055
host_bytes = 0
host_bandwidth = 5e9
network_bytes = 0
network_bandwidth = 0.5e9
network_latency_seconds = 0.0005
max_batch_tokens = 512
max_running = 32
max_waiting = 256
max_context = 4096
