/*
 * gpt_device.h: the CUDA path of train_gpt (gpt_device.c), built where
 * configure found nvcc ("kernels: yes"); GPT_WITH_CUDA is then 1.
 */
#ifndef GPT_DEVICE_H
#define GPT_DEVICE_H

#include "dsm.h"
#include "gpt.h"
#include "gpt_walk.h"

typedef struct gpt_device_s *gpt_device_t;

/* DSM_SUCCESS when this process sees a CUDA device, else
 * DSM_ERR_NOT_SUPPORTED with the reason in msg. */
dsm_status_t gpt_device_available(char *msg, size_t msg_len);

/* The device state of the walk's engine (bf16, device-resident:
 * DSM_DEVICE_CUDA) for micro-batches of B sequences of T tokens: a stream the
 * engine orders its work on (dsm_engine_set_stream), the kernels' context,
 * the activations; the walk takes the device's operations. Errors: a message
 * in msg. Free with gpt_device_free() (also after a failed create), before
 * the walk. */
dsm_status_t gpt_device_create(gpt_walk *walk, int B, int T, char *msg, size_t msg_len, gpt_device_t *d);
void gpt_device_free(gpt_device_t *d);

/* The forward pass of tokens tok at positions pos with labels lab (N = B T
 * each, host memory, unchanged until gpt_device_backward() returns): the sum
 * of the token losses and their number; the logits' gradient times dloss is
 * kept for gpt_device_backward(). */
dsm_status_t gpt_device_forward(gpt_device_t d, const int64_t *tok, const int64_t *pos, const int64_t *lab,
                                float dloss, double *loss_sum, int64_t *count);
/* The backward pass: every gradient added into the engine's buffers. */
dsm_status_t gpt_device_backward(gpt_device_t d);

#endif /* GPT_DEVICE_H */
