/* Products with one side of at most 16 as kernels of their own (kernels/skinny_matmul.cuh)
 * instead of cuBLASLt, whose tiles leave most of the card idle there: an MLP classifier's
 * [128, 512] x [512, 10] took 9 us on 4 blocks (H200, TF32). Shared by the plain products
 * (lower_math.c) and the bias epilogues (lower_epilogue.c). */
#ifndef MN_CUDA_LOWER_SKINNY_H
#define MN_CUDA_LOWER_SKINNY_H

#include <stdbool.h>

#include "cuda/emit.h"

/* The widest n (with A not transposed) or k the skinny kernels take; a product with both
 * that small takes the thread-per-element kernel, whose threads each walk a short k. */
#define MN_CU_SKINNY_MAX 16
/* The longest k of the warp-per-row kernel (256 steps a lane). */
#define MN_CU_SKINNY_NARROW_MAX_K 8192
/* Above this many FLOPs a product stays with cuBLASLt, whose tensor cores then pay: a LoRA
 * adapter's [8192, 576] x [576, 16] (151 MFLOP) is left alone. */
#define MN_CU_SKINNY_MAX_FLOPS 16e6

/* Whether product d (epilogue none, bias, bias_relu or bias_gelu; unbatched; beta 0) runs as a
 * skinny kernel: fp32 sessions only (a low-precision one rounds its bias and operands by the
 * storage table, which these kernels do not follow), and not with MN_CUDA_SKINNY=0 (A/B runs). */
bool mn_cu_skinny_applies(const mn_cu_op_ctx *c, const mn_cu_matmul_desc *d);

/* Appends the launch of d as a skinny kernel, its epilogue included (mn_cu_skinny_applies
 * must hold). */
mn_status mn_cu_skinny_matmul(const mn_cu_op_ctx *c, const mn_cu_matmul_desc *d);

/* The same, each element of the product then passed through the binary pointwise op `gate`
 * (a gradient: gate(g, value), g at the same place as the value, row pitch d->ldc), as
 * matmul_drelu's relu_grad(x, a op(b)). d has no epilogue of its own. */
mn_status mn_cu_skinny_matmul_gated(const mn_cu_op_ctx *c, const mn_cu_matmul_desc *d, mn_op gate,
                                    mn_cu_arg g);

#endif
