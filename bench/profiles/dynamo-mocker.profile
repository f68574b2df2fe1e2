# Dynamo's mocker engine as its offline replay runs it (ai-dynamo 1.6.1, AIsimulate 0.13.0, vLLM backend),
# so that kvroute-sim and Dynamo's own replay time the same work alike: 28,610 blocks of 16 tokens, 8,192
# batched tokens and 256 sequences a step, no host or network tier, and the mocker's fitted step times
# (its perf_model.rs): a step with N new prompt tokens costs 4.209989e-7 N^2 + 1.518344e-2 N + 16.50142 ms,
# plus, when sequences decode, max(1, -25.74 p^2 + 54.01 p + 5.74) ms with p their context over the pool.
# The roofline keys below are h100-llama3-8b's; with the polynomial given they price only tier reloads,
# which this profile has none of.
name = dynamo-mocker
block_size = 16
vocab_size = 128256
params = 8.03e9
layers = 32
attention_width = 4096
weight_bytes = 16.06e9
kv_bytes_per_token = 131072
# 28,610 blocks x 16 tokens x 128 KiB.
kv_pool_bytes = 59999518720
peak_flops = 989e12
compute_efficiency = 0.5
memory_bandwidth = 3.35e12
memory_efficiency = 0.7
step_overhead_seconds = 0
host_bytes = 0
host_bandwidth = 50e9
network_bytes = 0
network_bandwidth = 2e9
network_latency_seconds = 0.0005
max_batch_tokens = 8192
max_running = 256
max_waiting = 4096
max_context = 131072
prefill_ms_n2 = 4.209989e-7
prefill_ms_n1 = 1.518344e-2
prefill_ms_n0 = 16.50142
decode_ms_p2 = -25.74
decode_ms_p1 = 54.01
decode_ms_p0 = 5.74
decode_ms_min = 1
