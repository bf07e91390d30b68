/* llama.cpp's log, kept in a buffer: dgr reads model loading errors and buffer
   sizes from it. llama.cpp logs through one process-wide callback, so this file
   is compiled into one extension only (dgr._engine). */
#ifndef DGR_LOG_H
#define DGR_LOG_H

#include <stddef.h>
#include "ggml.h"

extern int dgr_log_echo;  /* also write every line to stderr (DGR_LLAMA_LOG) */

void dgr_log_sink(enum ggml_log_level level, const char *text, void *user_data);
void dgr_log_clear(void);
size_t dgr_log_copy(char *out, size_t cap);

#endif
