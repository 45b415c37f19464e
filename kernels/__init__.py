"""Pure-torch kernels for the paged KV cache.

kernels.cache_ops.reshape_and_cache writes new K/V into blocks; kernels.paged_attention holds
paged_attention, make_plan and the dense reference. Nothing is re-exported here on purpose: a
function named paged_attention on the package would shadow the submodule of the same name.
"""
