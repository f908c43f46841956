// psim-membw: the host's DRAM read rate right now, with llama-bench's thread count.
//
// The CPU side of a llama.cpp decode with host-resident experts or layers streams weights from
// DRAM with all threads (ggml-cpu), so its t/s follows the read rate the host gives at that
// moment; on a shared (virtualised) host that rate moves between model loads while steal time
// stays at zero. The lease runs this before each llama-bench invocation of a grid with
// `canary = true` (calibrate/llamacpp/grid.py) and records its line in run/canary.jsonl.
//
//   psim-membw [--threads N] [--mib M] [--seconds S]
//
// Each thread first-touches and then repeatedly sums its own slice of one M MiB buffer (default
// 1024 MiB: above any L3); passes run until S seconds (default 0.3) have passed. Prints one JSON
// line: threads, bytes, passes, seconds, gb_per_s (all passes), best_gb_per_s (fastest pass),
// checksum (keeps the sums alive). Exit status 2 with one line on stderr for a bad argument or a
// failed allocation.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

static uint64_t sum_slice(const uint64_t *p, size_t n) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
    }
    for (; i < n; ++i) a += p[i];
    return a + b + c + d;
}

static bool parse(const char *s, double lo, double hi, double *out) {
    char *end = nullptr;
    double v = std::strtod(s, &end);
    if (end == s || *end != '\0' || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

int main(int argc, char **argv) {
    double threads = std::max(1u, std::thread::hardware_concurrency()), mib = 1024, seconds = 0.3;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        double *dst = a == "--threads" ? &threads : a == "--mib" ? &mib : a == "--seconds" ? &seconds : nullptr;
        double hi = a == "--threads" ? 4096 : a == "--mib" ? 1 << 20 : 60;
        if (!dst || i + 1 >= argc || !parse(argv[i + 1], a == "--seconds" ? 0.001 : 1, hi, dst)) {
            std::fprintf(stderr, "psim-membw: bad argument %s (usage: psim-membw [--threads N] [--mib M] [--seconds S])\n",
                         argv[i]);
            return 2;
        }
        ++i;
    }
    const int nt = (int) threads;
    const size_t words = (size_t) mib * (1u << 20) / sizeof(uint64_t);
    const size_t per = words / nt;
    if (per == 0) {
        std::fprintf(stderr, "psim-membw: --mib %g is too small for %d threads\n", mib, nt);
        return 2;
    }
    uint64_t *buf = static_cast<uint64_t *>(std::aligned_alloc(64, ((words * sizeof(uint64_t)) + 63) / 64 * 64));
    if (!buf) {
        std::fprintf(stderr, "psim-membw: cannot allocate %g MiB\n", mib);
        return 2;
    }
    std::vector<uint64_t> sums(nt, 0);
    std::atomic<int> ready{0};
    std::atomic<int> pass{-1};
    std::atomic<int> done{0};
    auto worker = [&](int t) {
        uint64_t *p = buf + per * t;
        for (size_t i = 0; i < per; ++i) p[i] = i * 2654435761u + t;  // first touch: this thread's pages
        ready.fetch_add(1);
        int seen = -1;
        for (;;) {
            int want;
            while ((want = pass.load(std::memory_order_acquire)) == seen) std::this_thread::yield();
            if (want < 0) break;
            seen = want;
            sums[t] += sum_slice(p, per);
            done.fetch_add(1, std::memory_order_acq_rel);
        }
    };
    std::vector<std::thread> pool;
    for (int t = 0; t < nt; ++t) pool.emplace_back(worker, t);
    while (ready.load() < nt) std::this_thread::yield();
    using clk = std::chrono::steady_clock;
    const auto t0 = clk::now();
    double best = 0, total = 0;
    int passes = 0;
    while (passes == 0 || std::chrono::duration<double>(clk::now() - t0).count() < seconds) {
        done.store(0);
        const auto p0 = clk::now();
        pass.store(passes, std::memory_order_release);
        while (done.load(std::memory_order_acquire) < nt) std::this_thread::yield();
        const double dt = std::chrono::duration<double>(clk::now() - p0).count();
        best = std::max(best, per * nt * sizeof(uint64_t) / dt);
        ++passes;
    }
    total = std::chrono::duration<double>(clk::now() - t0).count();
    pass.store(-2, std::memory_order_release);
    // -2 differs from every pass number: each worker wakes, reads it as negative and ends
    for (auto &th : pool) th.join();
    uint64_t check = 0;
    for (uint64_t s : sums) check ^= s;
    const double bytes = (double) per * nt * sizeof(uint64_t);
    std::printf("{\"threads\": %d, \"bytes\": %.0f, \"passes\": %d, \"seconds\": %.6f, \"gb_per_s\": %.3f, "
                "\"best_gb_per_s\": %.3f, \"checksum\": %llu}\n",
                nt, bytes, passes, total, bytes * passes / total / 1e9, best / 1e9, (unsigned long long) check);
    std::free(buf);
    return 0;
}
