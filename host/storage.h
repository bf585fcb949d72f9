/* The storage table of mixed precision: which plan buffers hold low-precision values, and
 * the rounding that puts a float there. One table for every backend: the CUDA backend stores
 * those buffers as bf16 / fp16, and the CPU reference backend rounds each such value to the
 * float it would read back, so a low-precision session is tested without a GPU.
 *
 * In a BF16 or F16 session:
 *   - low precision: the value of every op the step computes (activations, activation
 *     gradients, attention, norm and softmax outputs, logits), in the session's type;
 *   - fp32: inputs, parameters (the master weights), constants, losses, single-element values
 *     (loss seeds, scalars), parameter gradients and the partial weight gradients that only
 *     sum into them (accumulated in fp32), and integer values;
 *   - matrix products read their operands in low precision: a parameter through its rounded
 *     copy (the weights' low-precision copy the optimizer writes), any other fp32 operand
 *     rounded as it is read; they accumulate in fp32 and round the result once. */
#ifndef MN_HOST_STORAGE_H
#define MN_HOST_STORAGE_H

#include <stdbool.h>

#include "host/plan.h"

/* The storage type of a precision's low-precision values: MN_BF16, MN_F16, or MN_F32. */
mn_dtype mn_precision_storage(mn_precision prec);

/* x rounded to the nearest value of dt (ties to even), as a float: BF16 and F16 round (F16
 * overflows to infinity, NaN stays NaN), any other type returns x. */
float mn_storage_round(mn_dtype dt, float x);
void mn_storage_round_n(mn_dtype dt, float *x, size_t n);

/* The 16 bits of bf16 / fp16 that x rounds to, and the value of such bits. */
uint16_t mn_storage_bits(mn_dtype dt, float x);
float mn_storage_value(mn_dtype dt, uint16_t bits);

/* Chooses the storage of every buffer of p for prec (p->buffers[i].storage) and records prec
 * in p->precision; F32 stores every value as its node's dtype. MN_ERR_OUT_OF_MEMORY is the
 * only failure. */
mn_status mn_plan_set_precision(mn_plan *p, mn_precision prec);

/* For a backend that stores low-precision values in 2 bytes (CUDA): sizes every such buffer
 * by its storage, and every buffer by its row pitch when set, and plans the arena again. */
mn_status mn_plan_store_narrow(mn_plan *p);

/* Whether input k of an op is a matrix-product operand, which a low-precision session reads in
 * low precision (matmul_bias_act's bias included, as PyTorch autocast's linear reads it). */
bool mn_storage_reads_low(mn_op op, int k);

/* F16's dynamic loss scaling, as PyTorch's GradScaler: the loss gradient is seeded with
 * `scale` (plan->loss_scale), so the fp16 activation gradients keep their small values; the
 * backend then divides the parameter gradients by it. A step whose gradients are all finite
 * updates the parameters, and after MN_LOSS_SCALE_INTERVAL such steps in a row the scale
 * doubles; a step with an infinite or NaN gradient leaves the parameters and the optimizer
 * state alone (`skipped` counts it) and halves the scale. */
#define MN_LOSS_SCALE_INIT     65536.0f
#define MN_LOSS_SCALE_INTERVAL 2000u
typedef struct mn_loss_scaler {
  float scale;
  unsigned good_steps; /* finite steps since the scale last changed */
  uint64_t skipped;
} mn_loss_scaler;

static inline mn_loss_scaler mn_loss_scaler_new(void) {
  return (mn_loss_scaler){.scale = MN_LOSS_SCALE_INIT};
}
/* Records a step whose gradients were finite or not and moves the scale; returns finite. */
bool mn_loss_scaler_record(mn_loss_scaler *l, bool finite);

#endif
