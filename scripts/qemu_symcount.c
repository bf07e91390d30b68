/* A QEMU TCG plugin (plugin API version 1, as in Debian 12's QEMU 7.2) that counts the instructions
 * executed per function symbol, written at exit to $SYMCOUNT_OUT (else stderr) as "COUNT\tSYMBOL"
 * lines. QEMU ships no plugin header in Debian, so the few entry points it uses are declared
 * here. Used by scripts/arm_kernel_counts.py. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
extern void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, void (*)(qemu_plugin_id_t, struct qemu_plugin_tb *));
extern size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *);
extern struct qemu_plugin_insn *qemu_plugin_tb_get_insn(const struct qemu_plugin_tb *, size_t);
extern const char *qemu_plugin_insn_symbol(const struct qemu_plugin_insn *);
extern void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *, enum qemu_plugin_op, void *, uint64_t);
extern void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, void (*)(qemu_plugin_id_t, void *), void *);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;

#define MAX_SYMS 65536
static struct { char *name; uint64_t count; } syms[MAX_SYMS];
static int n_syms;

/* the counter of a translated block's function (found by name; the last slot takes the
 * functions past MAX_SYMS - 1, and "?" those without a symbol) */
static uint64_t *counter_for(const char *name) {
    if (!name) name = "?";
    for (int i = 0; i < n_syms; i++)
        if (strcmp(syms[i].name, name) == 0) return &syms[i].count;
    if (n_syms == MAX_SYMS) return &syms[MAX_SYMS - 1].count;
    if (n_syms == MAX_SYMS - 1) name = "(others)";
    syms[n_syms].name = strdup(name);
    return &syms[n_syms++].count;
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    size_t n = qemu_plugin_tb_n_insns(tb);
    const char *name = qemu_plugin_insn_symbol(qemu_plugin_tb_get_insn(tb, 0));
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, counter_for(name), n);
}

static void at_end(qemu_plugin_id_t id, void *p) {
    const char *path = getenv("SYMCOUNT_OUT");
    FILE *out = path ? fopen(path, "w") : stderr;
    for (int i = 0; i < n_syms; i++)
        if (syms[i].count) fprintf(out, "%llu\t%s\n", (unsigned long long) syms[i].count, syms[i].name);
    if (path) fclose(out);
}

__attribute__((visibility("default")))
int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc, char **argv) {
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, at_end, NULL);
    return 0;
}
