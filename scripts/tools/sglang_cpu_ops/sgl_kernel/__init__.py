"""A pure-PyTorch stand-in for the CPU kernels that SGLang's CPU engine imports from sgl-kernel.

PyPI's sglang-kernel is a CUDA build. With SGLANG_USE_CPU_ENGINE=1, SGLang 0.5.23 calls two of its CPU
kernels to serve a plain model:

- sglang/srt/mem_cache/allocation.py: ``from sgl_kernel import assign_req_to_token_pool_cpu``
- sglang/kernels/ops/kvcache/cache_move.py: ``from sgl_kernel import copy_all_layer_kv_cache_cpu``

Both are plain index copies; this module does them with PyTorch indexing, with the semantics of the Triton
kernels that the GPU path uses in the same files (``assign_req_to_token_pool`` and
``copy_all_layer_kv_cache_tiled``). It also defines the speculative-decoding kernels that modules under
sglang/kernels/ops/speculative import at load time, as functions that raise NotImplementedError (see the
end of this file). Nothing else is provided: the scheduler, the radix cache, the attention backend and the
KV event publisher stay SGLang's own. ``torch.ops.sgl_kernel`` registers no ops, so SGLang's
Intel AMX paths, which test for ``torch.ops.sgl_kernel.convert_weight_packed``, stay off, and any other
``from sgl_kernel import ...`` still raises ImportError, as it does without the package.

scripts/tools/sglang-serve.sh puts the directory holding this package on PYTHONPATH.
"""

import ctypes

import torch

__all__ = ["assign_req_to_token_pool_cpu", "copy_all_layer_kv_cache_cpu"]


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """Writes the KV slots of each request into its row of the request-to-token table.

    For request i of the batch, ``req_to_token[req_pool_indices[i], start_offset[i]:end_offset[i]]``
    gets the next ``end_offset[i] - start_offset[i]`` entries of ``out_cache_loc``, which holds the
    slots of all the requests one after another in batch order. ``pool_len`` is the row length of
    ``req_to_token`` (its second dimension), as the kernel takes it.
    """
    assert req_to_token.shape[1] == pool_len
    starts = start_offset.tolist()
    ends = end_offset.tolist()
    rows = req_pool_indices.tolist()
    offset = 0
    for row, start, end in zip(rows, starts, ends):
        n = end - start
        if n > 0:
            req_to_token[row, start:end] = out_cache_loc[offset : offset + n].to(req_to_token.dtype)
        offset += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor,
    strides: torch.Tensor,
    tgt_loc: torch.Tensor,
    src_loc: torch.Tensor,
) -> None:
    """Copies KV slots ``src_loc[j]`` to ``tgt_loc[j]`` in every buffer of a KV pool.

    ``data_ptrs`` holds the address of each contiguous per-layer buffer (K, V and any scale buffers) and
    ``strides`` the bytes of one slot in it, which is also the number of bytes copied per slot. All sources
    are read before any target is written, so overlapping moves are safe, as in the Triton kernel.
    """
    if tgt_loc.numel() == 0:
        return
    assert tgt_loc.numel() == src_loc.numel()
    src = src_loc.to(torch.int64)
    tgt = tgt_loc.to(torch.int64)
    slots = int(max(src.max().item(), tgt.max().item())) + 1
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        ptr, stride = int(ptr), int(stride)
        memory = (ctypes.c_uint8 * (slots * stride)).from_address(ptr)
        buffer = torch.frombuffer(memory, dtype=torch.uint8).view(slots, stride)
        buffer[tgt] = buffer[src]


# Kernels of speculative decoding (EAGLE and its tree verification), which modules that every server loads
# import under SGLANG_USE_CPU_ENGINE=1. A server started without --speculative-algorithm never calls them;
# they are here so that the imports succeed, and raise if called.
def _not_provided(name):
    def kernel(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} is not provided by the pure-PyTorch stand-in "
            "(scripts/tools/sglang_cpu_ops): speculative decoding is not supported"
        )

    kernel.__name__ = kernel.__qualname__ = name
    return kernel


_SPECULATIVE = (
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "build_tree_kernel_efficient_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "rotate_input_ids_cpu",
    "verify_tree_greedy_cpu",
)
for _name in _SPECULATIVE:
    globals()[_name] = _not_provided(_name)
    __all__.append(_name)
del _name
