"""Kernels: the paged KV cache's, in torch and Triton, and fused Triton kernels for decoder layers.

kernels.cache_ops.reshape_and_cache writes new K/V into blocks; kernels.paged_attention holds the
torch paged_attention (the CPU path), make_plan and the dense reference;
kernels.triton_paged_attention the same attention as one Triton kernel (the CUDA path);
kernels.fused_norm, fused_rotary and fused_activation the fused kernels of
omni/runtime/fused_layers.py; kernels.triton_launch compiles them on CUDA and interprets them on
the CPU (tests). Nothing is re-exported here on purpose: a function named paged_attention on the
package would shadow the submodule of the same name.
"""
