"""The fused Triton kernels (RMSNorm, add + RMSNorm, SiLU*mul, rotary) against transformers'
torch formulas.

Without a GPU every case runs under Triton's interpreter on CPU tensors; there the additions and
products round exactly like torch (bit-equal), and the transcendental parts (sqrt, exp) may
differ in float32's last place, so those results are held to one unit in the last place of their
dtype. A compile-only test builds each kernel for sm_90. With a GPU the same cases run compiled.
"""

import inspect

import pytest
import torch

triton = pytest.importorskip("triton")

from kernels import fused_activation, fused_norm, fused_rotary  # noqa: E402
from kernels.fused_activation import silu_and_mul, silu_mul, silu_mul_reference  # noqa: E402
from kernels.fused_norm import add_rms_norm, rms_norm, rms_norm_reference  # noqa: E402
from kernels.fused_rotary import rotary_, rotary_and_cache_, rotary_reference  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
cpu_only = pytest.mark.skipif(DEVICE == "cuda", reason="interpreter test; the GPU runs compiled")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
ULP = {torch.float32: 2.0**-20, torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10}


def randn(*shape, dtype=torch.float32, scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(DEVICE)


def assert_ulp_close(got, want):
    """Within one unit in the last place of the dtype (plus float32 noise near zero), and the
    same dtype and shape; two on a GPU, whose exp2 and rsqrt are hardware approximations
    (measured on an H200: fp16 SiLU 1.3 ulp)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = ULP[want.dtype] * (2 if DEVICE == "cuda" else 1)
    torch.testing.assert_close(got.float().cpu(), want.float().cpu(), rtol=tol, atol=tol * 1e-2)


def assert_bit_equal(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu(), want.cpu()), (got.float() - want.float()).abs().max()


def assert_products_equal(got, want, magnitude):
    """Sums of products: bit-equal under the interpreter. On a GPU the compiler contracts a
    multiply and an add into one FMA (one rounding instead of two), so each element is within
    two ulps of `magnitude` (the sum of its terms' absolute values), not of the result: where
    the terms cancel (x*cos - y*sin near zero) the result's own ulp is far smaller than the
    rounding of either term (measured on an H200: 0.014 relative in bf16)."""
    if DEVICE != "cuda":
        assert_bit_equal(got, want)
        return
    assert got.dtype == want.dtype and got.shape == want.shape
    error = (got.float() - want.float()).abs()
    bound = 2 * ULP[want.dtype] * magnitude.float()
    assert bool((error <= bound).all()), f"worst excess {(error - bound).max().item():.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 96), (2, 3, 896), (1, 1, 64), (4, 100)])
def test_rms_norm(dtype, shape):
    x = randn(*shape, dtype=dtype, scale=3.0)
    weight = randn(shape[-1], dtype=dtype, seed=1) + 1.0
    assert_ulp_close(rms_norm(x, weight, 1e-6), rms_norm_reference(x, weight, 1e-6))


def test_rms_norm_float32_weight_promotes_like_torch():
    """bf16 input with a float32 weight: transformers' `weight * x.to(bf16)` is float32."""
    x = randn(3, 64, dtype=torch.bfloat16, scale=2.0)
    weight = randn(64, seed=1)
    got = rms_norm(x, weight, 1e-5)
    assert got.dtype == torch.float32
    assert_ulp_close(got, rms_norm_reference(x, weight, 1e-5))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm(dtype):
    """The new residual is the sum rounded to the dtype, bit for bit (no transcendental part):
    a float32 -> bf16 cast that truncates (Triton's interpreter's own) fails this."""
    x = randn(6, 2, 160, dtype=dtype, scale=2.0)
    residual = randn(6, 2, 160, dtype=dtype, seed=2, scale=5.0)
    weight = randn(160, dtype=dtype, seed=1) + 1.0
    out, new_residual = add_rms_norm(x, residual, weight, 1e-6)
    assert_bit_equal(new_residual, residual + x)
    assert_ulp_close(out, rms_norm_reference(residual + x, weight, 1e-6))


def test_norm_strided_rows():
    """Rows of a wider buffer (a non-contiguous slice) are read in place."""
    wide = randn(7, 200, dtype=torch.bfloat16)
    x, residual = wide[:, :96], wide[:, 100:196]
    assert not x.is_contiguous()
    weight = randn(96, dtype=torch.bfloat16, seed=1)
    assert_ulp_close(rms_norm(x, weight, 1e-6), rms_norm_reference(x, weight, 1e-6))
    out, new_residual = add_rms_norm(x, residual, weight, 1e-6)
    assert_bit_equal(new_residual, residual + x)
    assert_ulp_close(out, rms_norm_reference(residual + x, weight, 1e-6))


def test_norm_bad_inputs():
    x = randn(2, 64)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, randn(32), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        add_rms_norm(x, randn(2, 64, dtype=torch.bfloat16), randn(64), 1e-6)
    with pytest.raises(ValueError, match="hidden size"):
        rms_norm(randn(1, 20000), randn(20000), 1e-6)
    assert rms_norm(randn(0, 64), randn(64), 1e-6).shape == (0, 64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_silu_mul(dtype):
    """Separate gate/up and one concatenated gate_up (the fused GEMM's output), several column
    blocks with a ragged last one."""
    gate = randn(3, 2, 2500, dtype=dtype, scale=4.0)
    up = randn(3, 2, 2500, dtype=dtype, seed=1)
    want = silu_mul_reference(gate, up)
    assert_ulp_close(silu_mul(gate, up), want)
    assert_ulp_close(silu_and_mul(torch.cat([gate, up], dim=-1)), want)


@pytest.mark.filterwarnings("ignore:overflow encountered in exp")  # the interpreter's numpy
def test_silu_mul_extremes():
    """Large |gate|: exp overflows to inf for very negative gates, silu -> -0."""
    gate = torch.tensor([[-1000.0, -90.0, -20.0, 0.0, 20.0, 90.0, 1000.0]], device=DEVICE)
    up = torch.ones_like(gate)
    torch.testing.assert_close(silu_mul(gate, up), silu_mul_reference(gate, up))


def test_silu_mul_bad_inputs():
    with pytest.raises(ValueError, match="must match"):
        silu_mul(randn(2, 8), randn(2, 9))
    with pytest.raises(ValueError, match="not even"):
        silu_and_mul(randn(2, 9))


def rope(num_tokens: int, head_dim: int, dtype: torch.dtype, sections: bool = False):
    """cos/sin as a model's rotary embedding returns them; `sections` makes the two halves
    differ (Qwen2.5-Omni's multimodal rope recomposes them per section)."""
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    pos = torch.arange(num_tokens, dtype=torch.float32)[:, None] * 3.0 + 1.0
    first = pos * inv
    emb = torch.cat((first, pos * 0.5 * inv if sections else first), dim=-1)
    return emb.cos().to(dtype).to(DEVICE), emb.sin().to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("heads", "head_dim"), [((4, 2), 64), ((7, 1), 80), ((2, 2), 16)])
def test_rotary_on_a_fused_qkv_buffer(dtype, heads, head_dim):
    """q and k heads of one q/k/v projection output rotated in place, bit-equal to transformers'
    formula (products and sums only); the v heads are not touched."""
    num_heads, num_kv_heads = heads
    total = num_heads + 2 * num_kv_heads
    qkv = randn(9, total * head_dim, dtype=dtype, scale=2.0)
    before = qkv.clone()
    view = qkv.view(9, total, head_dim)
    cos, sin = rope(9, head_dim, dtype, sections=True)
    rotary_(view[:, : num_heads + num_kv_heads], cos, sin)
    want = rotary_reference(
        before.view(9, total, head_dim)[:, : num_heads + num_kv_heads], cos, sin
    )
    x = before.view(9, total, head_dim)[:, : num_heads + num_kv_heads].float().abs()
    swapped = torch.cat((x[..., head_dim // 2 :], x[..., : head_dim // 2]), dim=-1)
    magnitude = x * cos.float().abs()[:, None] + swapped * sin.float().abs()[:, None]
    assert_products_equal(view[:, : num_heads + num_kv_heads], want, magnitude)
    assert_bit_equal(
        view[:, num_heads + num_kv_heads :], before.view(9, total, head_dim)[:, -num_kv_heads:]
    )


def test_rotary_bad_inputs():
    x = randn(3, 2, 8)
    cos, sin = rope(3, 8, torch.float32)
    with pytest.raises(ValueError, match="cos"):
        rotary_(x, cos[:2], sin)
    with pytest.raises(ValueError, match="sin"):
        rotary_(x, cos, sin.to(torch.bfloat16))
    with pytest.raises(ValueError, match="odd"):
        rotary_(randn(3, 2, 7), randn(3, 7), randn(3, 7))
    with pytest.raises(ValueError, match="unit last stride"):
        rotary_(x.transpose(1, 2), cos, sin)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "head_dim"), [((4, 2), 16), ((28, 4), 128), ((14, 2), 80)])
def test_rotary_and_cache_writes_what_reshape_and_cache_would(dtype, heads, head_dim):
    """The fused q/k/v buffer rotated in place, and the rotated keys and the values in their
    slots (shuffled, not block-ordered) of caches that held other values: equal to rotary_
    followed by kernels/cache_ops.py's two indexed copies, bit for bit; other slots untouched."""
    from kernels.cache_ops import reshape_and_cache

    num_heads, num_kv_heads = heads
    num_tokens, num_blocks, block_size = 6, 5, 4
    qkv = randn(num_tokens, num_heads + 2 * num_kv_heads, head_dim, dtype=dtype, scale=2.0)
    cos, sin = (randn(num_tokens, head_dim, dtype=dtype, seed=s) for s in (1, 2))
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [randn(*shape, dtype=dtype, seed=s) for s in (3, 4)]
    slots = torch.randperm(num_blocks * block_size, generator=torch.Generator().manual_seed(5))
    slots = slots[:num_tokens].to(DEVICE)
    want_qkv, want_caches = qkv.clone(), [c.clone() for c in caches]
    rotated = want_qkv[:, : num_heads + num_kv_heads]
    rotary_(rotated, cos, sin)
    keys = want_qkv[:, num_heads : num_heads + num_kv_heads]
    reshape_and_cache(keys, want_qkv[:, num_heads + num_kv_heads :], *want_caches, slots)
    values = qkv[:, num_heads + num_kv_heads :]
    rotary_and_cache_(qkv[:, : num_heads + num_kv_heads], cos, sin, values, *caches, slots)
    assert_bit_equal(qkv, want_qkv)
    for got, want in zip(caches, want_caches, strict=True):
        assert_bit_equal(got, want)


def test_rotary_and_cache_bad_inputs():
    qkv = randn(3, 8, 16)
    cos, sin, slots = randn(3, 16), randn(3, 16), torch.arange(3, device=DEVICE)
    caches = [randn(2, 4, 2, 16) for _ in range(2)]
    with pytest.raises(ValueError, match="value"):
        rotary_and_cache_(qkv[:, :6], cos, sin, qkv[:2, 6:], *caches, slots)
    with pytest.raises(ValueError, match="key_cache"):
        rotary_and_cache_(qkv[:, :6], cos, sin, qkv[:, 6:], caches[0][:, :, :1], caches[1], slots)
    with pytest.raises(ValueError, match="value_cache"):
        bf16 = caches[1].to(torch.bfloat16)
        rotary_and_cache_(qkv[:, :6], cos, sin, qkv[:, 6:], caches[0], bf16, slots)
    with pytest.raises(ValueError, match="slot_mapping"):
        rotary_and_cache_(qkv[:, :6], cos, sin, qkv[:, 6:], *caches, slots[:2])


@cpu_only
def test_kernels_compile_for_sm90_without_a_gpu():
    """The real compiler (Triton IR -> PTX -> cubin) for an H100 in bf16: the interpreter checks
    neither types nor shapes. An interpreted launch first: it must leave triton.language as it
    found it."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    test_add_rms_norm(torch.bfloat16)

    def compile_sm90(kernel, constexprs):
        names = list(inspect.signature(kernel.fn).parameters)
        signature = {}
        for name in names:
            if name in constexprs:
                signature[name] = "constexpr"
            elif name == "slot_ptr":
                signature[name] = "*i64"
            elif name.endswith("_ptr"):
                signature[name] = "*bf16"
            else:
                signature[name] = "fp32" if name == "eps" else "i32"
        constants = {(names.index(k),): v for k, v in constexprs.items()}
        source = ASTSource(kernel, signature, constexprs=constants)
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"]

    compile_sm90(fused_norm._kernel, {"ADD": True, "BLOCK": 1024})
    compile_sm90(fused_norm._kernel, {"ADD": False, "BLOCK": 4096})
    compile_sm90(fused_activation._kernel, {"BLOCK": fused_activation.BLOCK})
    rotary = {"HALF": 40, "HALF_PAD": 64, "HEADS_PAD": 32, "KV_PAD": 4}
    compile_sm90(fused_rotary._kernel, {**rotary, "CACHE": False})
    compile_sm90(fused_rotary._kernel, {**rotary, "CACHE": True})


@pytest.mark.cuda
def test_cuda_model_sized_rows():
    """Qwen2.5-7B's widths on the GPU, bf16: 512 rows of hidden 3584, intermediate 18944."""
    x = randn(512, 3584, dtype=torch.bfloat16, scale=3.0)
    residual = randn(512, 3584, dtype=torch.bfloat16, seed=2)
    weight = randn(3584, dtype=torch.bfloat16, seed=1)
    out, new_residual = add_rms_norm(x, residual, weight, 1e-6)
    assert_bit_equal(new_residual, residual + x)
    assert_ulp_close(out, rms_norm_reference(residual + x, weight, 1e-6))
    gate_up = randn(512, 2 * 18944, dtype=torch.bfloat16, scale=3.0)
    want = silu_mul_reference(gate_up[:, :18944], gate_up[:, 18944:])
    assert_ulp_close(silu_and_mul(gate_up), want)
