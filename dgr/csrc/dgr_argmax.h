/* Greedy sampling: the index of the first largest value of a logits row (-1 when
   none exceeds -inf), the same token llama.cpp's greedy sampler picks. */
#ifndef DGR_ARGMAX_H
#define DGR_ARGMAX_H

int dgr_argmax(const float *x, int n);

#endif
