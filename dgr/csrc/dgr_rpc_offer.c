#include "dgr_rpc_offer.h"

#include "ggml-backend-impl.h"  /* the device struct (the pinned tree's) */

static size_t offered = 0;
static ggml_backend_dev_t cpu = NULL;
static struct ggml_backend_device offered_dev;

static void offered_memory(ggml_backend_dev_t dev, size_t *free, size_t *total) {
    (void)dev;
    cpu->iface.get_memory(cpu, free, total);
    if (*total > offered) *total = offered;
    if (*free > offered) *free = offered;
}

static void offered_props(ggml_backend_dev_t dev, struct ggml_backend_dev_props *props) {
    cpu->iface.get_props(cpu, props);
    offered_memory(dev, &props->memory_free, &props->memory_total);
}

static ggml_backend_t offered_init(ggml_backend_dev_t dev, const char *params) {
    (void)dev;
    ggml_backend_t backend = cpu->iface.init_backend(cpu, params);
    if (backend != NULL) backend->device = &offered_dev;
    return backend;
}

ggml_backend_dev_t dgr_cpu_offering(size_t bytes) {
    cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
    if (bytes == 0 || cpu == NULL) return cpu;
    offered = bytes;
    offered_dev = *cpu;
    offered_dev.iface.get_memory = offered_memory;
    offered_dev.iface.get_props = offered_props;
    offered_dev.iface.init_backend = offered_init;
    return &offered_dev;
}
