// Native tests of patches 0005 and 0006: a client of ggml's RPC backend whose server
// dies (killed: the connection closes) or hangs (stopped: the connection stays open)
// gets failed commands, not an aborted process or a wait without end.
//
//   test-rpc-faults killed   # 0005: the server process is killed between two computes
//   test-rpc-faults stopped  # 0006: the server process is stopped, GGML_RPC_TIMEOUT=1
//
// Each case forks a server process (ggml_backend_rpc_start_server over the CPU backend)
// on a free loopback port, computes y = 2x through it once (must be right), then kills
// or stops the server and computes again. Passing means: the second compute returns
// (within the timeout for a stopped server), ggml_backend_rpc_connected says false,
// and the next graph compute reports GGML_STATUS_FAILED. On the unpatched tree the
// killed case aborts the process and the stopped case never returns (CTest's timeout).

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml-rpc.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

typedef bool (*rpc_connected_fn)(const char * endpoint);

static int free_port() {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, (sockaddr *) &addr, sizeof(addr));
    socklen_t len = sizeof(addr);
    getsockname(fd, (sockaddr *) &addr, &len);
    close(fd);
    return ntohs(addr.sin_port);
}

static bool listening(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(port);
    bool ok = connect(fd, (sockaddr *) &addr, sizeof(addr)) == 0;
    close(fd);
    return ok;
}

static pid_t start_server(const std::string & endpoint, int port) {
    pid_t pid = fork();
    if (pid == 0) {
        ggml_backend_dev_t cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        ggml_backend_rpc_start_server(endpoint.c_str(), nullptr, 1, 1, &cpu);
        _exit(0);
    }
    for (int i = 0; i < 500 && !listening(port); i++) {
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pid;
}

struct doubling {
    ggml_context * ctx;
    ggml_cgraph * graph;
    ggml_tensor * x;
    ggml_tensor * y;
    ggml_backend_buffer_t buffer;
};

static doubling make_doubling(ggml_backend_t backend, int n) {
    ggml_init_params params = { ggml_tensor_overhead() * 4 + ggml_graph_overhead(), nullptr, true };
    doubling d;
    d.ctx = ggml_init(params);
    d.x = ggml_new_tensor_1d(d.ctx, GGML_TYPE_F32, n);
    d.y = ggml_scale(d.ctx, d.x, 2.0f);
    d.graph = ggml_new_graph(d.ctx);
    ggml_build_forward_expand(d.graph, d.y);
    d.buffer = ggml_backend_alloc_ctx_tensors(d.ctx, backend);
    return d;
}

// x = start, start+1, ...; returns the compute status, y in out
static ggml_status compute(ggml_backend_t backend, doubling & d, float start, std::vector<float> & out) {
    std::vector<float> x(out.size());
    for (size_t i = 0; i < x.size(); i++) {
        x[i] = start + (float) i;
    }
    ggml_backend_tensor_set(d.x, x.data(), 0, x.size() * sizeof(float));
    ggml_status status = ggml_backend_graph_compute(backend, d.graph);
    ggml_backend_tensor_get(d.y, out.data(), 0, out.size() * sizeof(float));
    return status;
}

static int run(bool kill_server) {
    const int port = free_port();
    const std::string endpoint = "127.0.0.1:" + std::to_string(port);
    if (!kill_server) {
        setenv("GGML_RPC_TIMEOUT", "1", 1);
    }
    pid_t server = start_server(endpoint, port);

    ggml_backend_reg_t reg = ggml_backend_rpc_add_server(endpoint.c_str());
    auto connected = (rpc_connected_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_connected");
    ggml_backend_t backend = ggml_backend_dev_init(ggml_backend_reg_dev_get(reg, 0), nullptr);
    const int n = 64;
    doubling d = make_doubling(backend, n);
    std::vector<float> y(n);
    int failures = 0;

    if (compute(backend, d, 1.0f, y) != GGML_STATUS_SUCCESS || y[0] != 2.0f || y[n - 1] != 2.0f * n) {
        printf("FAIL: the first compute through the server is wrong (y[0] = %g)\n", y[0]);
        failures++;
    }

    kill(server, kill_server ? SIGKILL : SIGSTOP);
    if (kill_server) {
        waitpid(server, nullptr, 0);
    }
    auto t0 = std::chrono::steady_clock::now();
    compute(backend, d, 10.0f, y);  // aborts (killed) or never returns (stopped) without the patches
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    printf("%s server: the compute after it returned in %.2f s\n", kill_server ? "killed" : "stopped", waited);

    if (connected == nullptr) {
        printf("FAIL: ggml_backend_rpc_connected is not exported\n");
        failures++;
    } else if (connected(endpoint.c_str())) {
        printf("FAIL: ggml_backend_rpc_connected still says true\n");
        failures++;
    }
    if (ggml_backend_graph_compute(backend, d.graph) != GGML_STATUS_FAILED) {
        printf("FAIL: a graph compute on the lost server did not report GGML_STATUS_FAILED\n");
        failures++;
    }

    ggml_backend_buffer_free(d.buffer);  // commands to a lost server: no abort on the way out
    ggml_free(d.ctx);
    ggml_backend_free(backend);
    if (!kill_server) {
        kill(server, SIGKILL);
        waitpid(server, nullptr, 0);
    }
    return failures;
}

int main(int argc, char ** argv) {
    if (argc < 2 || (std::string(argv[1]) != "killed" && std::string(argv[1]) != "stopped")) {
        fprintf(stderr, "usage: %s killed|stopped\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);  // a send to a closed connection must fail, not kill us
    int failures = run(std::string(argv[1]) == "killed");
    printf("rpc %s: %d failure(s)\n", argv[1], failures);
    return failures ? 1 : 0;
}
