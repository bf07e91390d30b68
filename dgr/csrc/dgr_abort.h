/* llama.cpp's abort callback over a flag that another thread sets: a running
   llama_decode returns 2 at its next graph node once the flag is set. */
#ifndef DGR_ABORT_H
#define DGR_ABORT_H

#include <stdbool.h>

static inline bool dgr_abort_callback(void *data) {
    return __atomic_load_n((int *)data, __ATOMIC_RELAXED) != 0;
}

static inline void dgr_set_flag(int *flag, int value) {
    __atomic_store_n(flag, value, __ATOMIC_RELAXED);
}

#endif
