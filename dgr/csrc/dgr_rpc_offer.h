/* A worker's CPU device that reports at most `bytes` of memory to ggml RPC
   clients (`dgr worker --mem`, as llama.cpp's rpc-server -m did). */
#ifndef DGR_RPC_OFFER_H
#define DGR_RPC_OFFER_H

#include <stddef.h>
#include "ggml-backend.h"

/* The CPU device itself when bytes == 0, else a copy of it with get_memory and
   get_props clamped to bytes, whose backends name it as their device (the RPC
   server asks a backend's device for its memory). */
ggml_backend_dev_t dgr_cpu_offering(size_t bytes);

#endif
