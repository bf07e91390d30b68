#include "dgr_log.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

/* The most recent DGR_LOG_CAP / 2 bytes at least, debug lines left out. */
#define DGR_LOG_CAP (1 << 18)

int dgr_log_echo = 0;
static char log_buf[DGR_LOG_CAP];
static size_t log_len = 0;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

void dgr_log_sink(enum ggml_log_level level, const char *text, void *user_data) {
    (void)user_data;
    size_t n = strlen(text);
    if (dgr_log_echo) fputs(text, stderr);
    /* Debug chatter would push out the lines dgr reads (buffer sizes, errors). */
    if (level == GGML_LOG_LEVEL_DEBUG) return;
    pthread_mutex_lock(&log_lock);
    if (n >= DGR_LOG_CAP / 2) { text += n - DGR_LOG_CAP / 2 + 1; n = DGR_LOG_CAP / 2 - 1; }
    if (log_len + n >= DGR_LOG_CAP) {
        size_t keep = DGR_LOG_CAP / 2 - 1;
        if (keep > log_len) keep = log_len;
        memmove(log_buf, log_buf + log_len - keep, keep);
        log_len = keep;
    }
    memcpy(log_buf + log_len, text, n);
    log_len += n;
    log_buf[log_len] = 0;
    pthread_mutex_unlock(&log_lock);
}

void dgr_log_clear(void) {
    pthread_mutex_lock(&log_lock);
    log_len = 0;
    log_buf[0] = 0;
    pthread_mutex_unlock(&log_lock);
}

size_t dgr_log_copy(char *out, size_t cap) {
    pthread_mutex_lock(&log_lock);
    size_t n = log_len < cap - 1 ? log_len : cap - 1;
    memcpy(out, log_buf + log_len - n, n);
    out[n] = 0;
    pthread_mutex_unlock(&log_lock);
    return n;
}
